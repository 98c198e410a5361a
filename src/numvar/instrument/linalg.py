"""Dense linear algebra at ``flop`` granularity: every add, sub, mul, div and sqrt rounded.

Unblocked textbook algorithms on batches of small matrices (users solve small systems;
the cost is O(n³) rounded operations in O(n) to O(n²) vectorised calls, each call one
stream key, element ``j`` of its C-order output drawing ``bits(key, j)``). Decisions
(pivots, convergence, skipped reflections) are taken on the rounded values. In the
formulas ``RND`` is one rounding of numvar's core; ``B`` is the batch.

* **LU with partial pivoting** (:func:`lu_factor`, right-looking, as LAPACK's ``dgetf2``):
  for column j: the pivot is the first row i ≥ j of largest ``|a_ij|``; rows j and i
  are swapped (whole rows, exact); ``l_i = RND(a_ij / a_jj)`` for i > j (one call);
  ``a_ik = RND(a_ik − RND(l_i·a_jk))`` for i, k > j (two calls). A zero pivot sets
  ``info`` and leaves the column unscaled (LAPACK's convention). Pivots are returned
  1-based as LAPACK's ``ipiv``.
* **Triangular solves** (:func:`trsm`, column-oriented, as the reference BLAS ``dtrsm``):
  lower: for j = 0..n−1: ``x_j = RND(b_j / t_jj)`` (skipped when unit), then
  ``b_i = RND(b_i − RND(t_ij·x_j))`` for i > j; upper: the same for j = n−1..0, i < j.
  All right-hand sides at once.
* **LU solve** (``A = P·L·U``): the row swaps applied to B in order, then L (unit lower),
  then U (upper); with ``adjoint`` (``Aᵀ X = B``): Uᵀ (lower), Lᵀ (unit upper), then the
  swaps in reverse order. ``left=False`` solves the transposed system.
* **solve** = LU + LU solve; **inv** = LU + LU solve of the identity; **det** = the
  product of U's diagonal, left to right (``RND(RND(u_00·u_11)·u_22)…``), negated (exact)
  for an odd permutation (a C-contiguous A is factored as Aᵀ, as ATen does).
* **Cholesky** (:func:`cholesky`, right-looking): ``l_jj = RND(sqrt(a_jj))``,
  ``l_ij = RND(a_ij / l_jj)`` (i > j), ``a_ik = RND(a_ik − RND(l_i·l_k))`` (i, k > j; the
  whole trailing block is updated, only its lower triangle is read). Reads the lower
  triangle (``upper=True``: the upper one; the result transposed). A non-positive pivot
  sets ``info`` (the first such column, 1-based); later entries are unspecified.
* **Householder QR** (:func:`qr`, as ``dgeqr2``/``dlarfg``/``dlarf``/``dorg2r``): for
  column j with ``x = a_{j:, j}``, ``α = x_0``: ``s = RND(RND(x_0²) + Σ_{i≥1} RND(x_i²))``
  (the tail summed left to right first), ``β = −sign(α)·RND(sqrt(s))``,
  ``τ = RND(RND(β − α)/β)``, ``v = (1, RND(x_i / RND(α − β)))``; no reflection (τ = 0)
  when the tail is zero (or for a single row). The reflection of the trailing columns:
  ``w = vᵀC`` (a flop-level product: terms in increasing row order), then
  ``C = RND(C − RND(v_i·RND(τ·w_k)))``. Q is accumulated backwards from the identity
  (``dorg2r``): ``H_j`` applied to ``Q[j:, j:]`` for j = k−1..0.
* **Symmetric eigenproblem** (:func:`eigh`): cyclic Jacobi. Sweeps over the pairs
  (p, q), p < q, in row order; a pair is skipped (its entry set to 0) when
  ``|a_pq| ≤ ε·sqrt(|a_pp·a_qq|) + ε²·‖A‖_max`` (ε = 2^(1−t), the threshold computed in
  float64: a decision, not a result). Rotation: ``θ = RND(RND(a_qq − a_pp) / RND(2a_pq))``,
  ``t = RND(sign θ / RND(|θ| + RND(sqrt(RND(1 + RND(θ·θ))))))``,
  ``c = RND(1 / RND(sqrt(RND(1 + RND(t·t)))))``, ``s = RND(t·c)`` (Rutishauser's
  formulas, Golub & Van Loan §8.5); columns p, q of A, then rows p, q of A, then columns
  p, q of V are rotated, each as ``(RND(RND(c·x) − RND(s·y)), RND(RND(s·x) + RND(c·y)))``,
  and ``a_pq = a_qp = 0``. Stops after a sweep without rotations (at most
  :data:`MAX_SWEEPS`). Eigenvalues ascending (stable sort of the diagonal).
* **SVD** (:func:`svd`): one-sided Jacobi (Hestenes) on the columns of A (of Aᵀ when
  m < n): for each pair, ``α = Σ g_p²``, ``β = Σ g_q²``, ``γ = Σ g_p·g_q`` (rounded
  products, sums left to right), skipped when ``|γ| ≤ ε·sqrt(α·β)``; the rotation of
  the 2×2 Gram matrix as for eigh (``θ`` from ``β − α`` and ``2γ``), applied to columns
  p, q of G and of V. Then ``σ_j = RND(sqrt(Σ_i RND(g_ij²)))``,
  ``u_j = RND(g_j / σ_j)``, singular values descending. ``full_matrices`` with m ≠ n
  completes U (V) by the Householder QR above of the reduced factor. A zero singular
  value leaves a zero column in U (not orthogonal: rank-deficient inputs are outside
  this implementation's scope).

Slow references (plain Python loops, same order, same random bits) are in
``tests/test_instrument_linalg.py``.

Binary32 at 24 bits on the CPU (numba backend), LU and the triangular solves run in the
compiled kernels of :mod:`numvar.instrument.linalg_kernels`: the same
calls, keys, element indices and arithmetic in one kernel call instead of O(n) tensor
ops. With :data:`USE_KERNELS` false every case takes the tensor implementation (the
kernels' reference in the tests).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from . import flop
from . import linalg_kernels as LK
from ._core import Ctx

#: binary32 LU and triangular solves in the compiled kernels (False: the tensor
#: implementation everywhere, the kernels' reference in the tests)
USE_KERNELS = True
#: with the kernels, ``linalg.solve`` of a square binary32 system whose right-hand side has
#: the matrix's batch shape in one compiled call (:func:`_solve32`; False: the LU and the
#: two triangular solves called one by one, as ``lu_factor`` and ``lu_solve`` run them;
#: same bits either way)
SOLVE_IN_ONE_CALL = True

#: sweeps after which the Jacobi methods stop even if some pair is above the threshold
MAX_SWEEPS = 40


def _batch(A: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    lead = tuple(A.shape[:-2])
    return A.reshape(-1, *A.shape[-2:]).clone(), lead


def _sel(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` where ``mask`` (one flag per batch element), else ``old``."""
    m = mask.reshape(mask.shape + (1,) * (new.dim() - 1))
    return torch.where(m, new, old)


def _in_layout(like: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` (contiguous) with the strides of ``like`` (the clone that the tensor
    implementation fills in place): ``values`` itself when the strides agree, else a
    clone of ``like`` holding them."""
    if like.stride() == values.stride():
        return values
    return like.clone().copy_(values)


# ------------------------------------------------------------------------------- LU
def lu_factor(ctx: Ctx, A: torch.Tensor):
    """(LU, pivots (int32, 1-based), info (int32)) of A (..., m, n): module docstring."""
    W, lead = _batch(A)
    B, m, n = W.shape
    k = min(m, n)
    piv = torch.zeros(B, k, dtype=torch.int32)
    info = torch.zeros(B, dtype=torch.int32)
    if k and USE_KERNELS and LK.serves(ctx, W):
        j = np.arange(k)
        update = (j + 1 < m) & (j + 1 < n)
        kd, km, ks = LK.keys(ctx, j + 1 < m, update, update)
        Wc = W.detach().contiguous()
        LK.lu32(LK.flat32(Wc), B, m, n, piv.view(-1).numpy(), info.numpy(), kd, km, ks,
                ctx.code)
        W = _in_layout(W, Wc)  # W: the clone of _batch
        return W.reshape(*lead, m, n), piv.reshape(*lead, k), info.reshape(lead)
    rows = torch.arange(B)
    for j in range(k):
        p = j + torch.argmax(W[:, j:, j].abs(), dim=1)
        piv[:, j] = (p + 1).to(torch.int32)
        rj, rp = W[rows, j].clone(), W[rows, p].clone()
        W[rows, p] = rj
        W[rows, j] = rp
        pivot = W[:, j, j]
        zero = pivot == 0
        info = torch.where(zero & (info == 0), torch.tensor(j + 1, dtype=torch.int32), info)
        if j + 1 < m:
            col = W[:, j + 1:, j]
            l = _sel(zero, col, ctx.div(col, pivot.unsqueeze(1)))
            W[:, j + 1:, j] = l
            if j + 1 < n:
                prod = ctx.mul(l.unsqueeze(2), W[:, j, j + 1:].unsqueeze(1))
                W[:, j + 1:, j + 1:] = ctx.sub(W[:, j + 1:, j + 1:], prod)
    return W.reshape(*lead, m, n), piv.reshape(*lead, k), info.reshape(lead)


def trsm(ctx: Ctx, T: torch.Tensor, X: torch.Tensor, *, upper: bool, unit: bool = False):
    """Solve ``T·Y = X`` for triangular T (B, n, n), X (B, n, r): module docstring."""
    n = T.shape[-1]
    if n and USE_KERNELS and LK.serves(ctx, T, X):
        rest = np.arange(1, n + 1) < n  # step s has rows below (above) j
        kd, km, ks = LK.keys(ctx, np.full(n, not unit), rest, rest)
        Y = X.detach().clone(memory_format=torch.contiguous_format)
        LK.trsm32(LK.flat32(T), LK.flat32(Y), Y.shape[0], n,
                  Y.shape[2], upper, unit, kd, km, ks, ctx.code)
        return _in_layout(X, Y)
    Y = X.clone()
    order = range(n - 1, -1, -1) if upper else range(n)
    for j in order:
        if not unit:
            Y[:, j] = ctx.div(Y[:, j], T[:, j, j].unsqueeze(1))
        rest = slice(0, j) if upper else slice(j + 1, n)
        if (j > 0) if upper else (j + 1 < n):
            prod = ctx.mul(T[:, rest, j].unsqueeze(2), Y[:, j].unsqueeze(1))
            Y[:, rest] = ctx.sub(Y[:, rest], prod)
    return Y


def _swap_rows(X: torch.Tensor, piv: torch.Tensor, reverse: bool) -> torch.Tensor:
    """X (B, n, r) with rows j and piv[:, j] − 1 swapped for j = 0..k−1 (k−1..0 when
    ``reverse``): exact data movement, one gather (the permutation computed by
    :func:`numvar.instrument.linalg_kernels.pivot_perm`); X's strides kept."""
    if not X.numel():
        return X.clone()
    p32 = piv.detach().to("cpu", torch.int32).contiguous().numpy()
    perm = torch.from_numpy(LK.pivot_perm(p32, X.shape[1], reverse)).to(X.device)
    out = torch.gather(X, 1, perm.unsqueeze(2).expand(X.shape))
    return _in_layout(X, out)


def _broadcast_batch(*ts: torch.Tensor):
    lead = torch.broadcast_shapes(*(t.shape[:-2] for t in ts))
    return [t.expand(*lead, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in ts], tuple(lead)


def lu_solve(ctx: Ctx, LU: torch.Tensor, piv: torch.Tensor, Bm: torch.Tensor, *,
             left: bool = True, adjoint: bool = False) -> torch.Tensor:
    """``A X = B`` (``adjoint``: ``Aᵀ X = B``; ``left=False``: ``X A = B``) from A = P·L·U."""
    if not left:
        return lu_solve(ctx, LU, piv, Bm.mT, adjoint=not adjoint).mT
    lead = torch.broadcast_shapes(LU.shape[:-2], Bm.shape[:-2])
    n, r = LU.shape[-1], Bm.shape[-1]
    LUb = LU.expand(*lead, n, n).reshape(-1, n, n)
    pb = piv.expand(*lead, piv.shape[-1]).reshape(-1, piv.shape[-1])
    X = Bm.expand(*lead, n, r).reshape(-1, n, r).clone()
    if not adjoint:
        X = _swap_rows(X, pb, False)
        X = trsm(ctx, LUb, X, upper=False, unit=True)
        X = trsm(ctx, LUb, X, upper=True)
    else:
        T = LUb.mT
        X = trsm(ctx, T, X, upper=False)
        X = trsm(ctx, T, X, upper=True, unit=True)
        X = _swap_rows(X, pb, True)
    return X.reshape(*lead, n, r)


def solve_triangular(ctx: Ctx, A: torch.Tensor, Bm: torch.Tensor, *, upper: bool,
                     left: bool = True, unitriangular: bool = False) -> torch.Tensor:
    """``linalg.solve_triangular``: ``A X = B`` (``left=False``: ``X A = B``)."""
    if not left:
        return solve_triangular(ctx, A.mT, Bm.mT, upper=not upper, unitriangular=unitriangular).mT
    (Ab, Bb), lead = _broadcast_batch(A, Bm)
    X = trsm(ctx, Ab, Bb, upper=upper, unit=unitriangular)
    return X.reshape(*lead, *X.shape[-2:])


def _is_vector_rhs(A: torch.Tensor, Bm: torch.Tensor) -> bool:
    """torch.linalg.solve's rule: B is a (batch of) vector(s)."""
    return Bm.dim() == 1 or (Bm.dim() == A.dim() - 1 and Bm.shape == A.shape[:-1])


def solve(ctx: Ctx, A: torch.Tensor, Bm: torch.Tensor, *, left: bool = True):
    """(X, LU, pivots, info) of ``_linalg_solve_ex``."""
    vec = _is_vector_rhs(A, Bm)
    B2 = Bm.unsqueeze(-1) if vec and left else (Bm.unsqueeze(-2) if vec else Bm)
    if (left and USE_KERNELS and SOLVE_IN_ONE_CALL and A.shape[-1] == A.shape[-2]
            and B2.shape[:-2] == A.shape[:-2] and LK.serves(ctx, A, B2)):
        X, LU, piv, info = _solve32(ctx, A, B2)
    else:
        LU, piv, info = lu_factor(ctx, A)
        X = lu_solve(ctx, LU, piv, B2, left=left)
    if vec:
        X = X.squeeze(-1) if left else X.squeeze(-2)
    return X, LU, piv, info


@functools.lru_cache(maxsize=64)
def _solve_flags(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_solve32`'s key flags for an n × n system (shared between calls, never
    written; not marked read-only, which would compile another ``keys`` kernel): the
    LU's n steps, then the unit lower solve's, then the upper solve's, as their own
    calls flag them. Divisions: the LU's columns with rows below, the upper solve's every step;
    products and differences: every step but the last of each (the LU's column j has a
    trailing block, a solve's step rows below or above j, while j + 1 < n)."""
    rows = np.ones(3 * n, np.bool_)
    rows[n - 1::n] = False
    div = rows.copy()
    div[n:2 * n] = False
    div[2 * n:] = True
    return div, rows, rows


def _solve32(ctx: Ctx, A: torch.Tensor, B2: torch.Tensor):
    """(X, LU, pivots, info) of :func:`solve` for square binary32 A (..., n, n) and B2
    (..., n, r) of the same batch shape, by ``linalg_kernels.solve32``: what
    :func:`lu_factor` and :func:`lu_solve` compute with the kernels (the same keys,
    drawn in one call, the same arithmetic, results in the same layouts) without the
    Python, the two key draws, the clones and the gather between their four compiled
    calls (about 0.2 ms of a 64 × 64 solve with 64 right-hand sides: docs/speed.md)."""
    W, lead = _batch(A)
    nb, n, r = W.shape[0], W.shape[-1], B2.shape[-1]
    X = B2.reshape(-1, n, r).clone()
    piv = torch.zeros(nb, n, dtype=torch.int32)
    info = torch.zeros(nb, dtype=torch.int32)
    keys = LK.keys(ctx, *_solve_flags(n))
    Wc, Y = W.detach().contiguous(), X.detach().contiguous()
    LK.solve32(LK.flat32(Wc), LK.flat32(Y), nb, n, r, piv.view(-1).numpy(), info.numpy(),
               keys, ctx.code)
    return (_in_layout(X, Y).reshape(*lead, n, r), _in_layout(W, Wc).reshape(*lead, n, n),
            piv.reshape(*lead, n), info.reshape(lead))


def inv(ctx: Ctx, A: torch.Tensor):
    """(inverse, info) of ``linalg_inv_ex``."""
    LU, piv, info = lu_factor(ctx, A)
    n = A.shape[-1]
    eye = torch.eye(n, dtype=A.dtype).expand(A.shape)
    return lu_solve(ctx, LU, piv, eye), info


def det(ctx: Ctx, A: torch.Tensor):
    """(det, LU, pivots) of ``_linalg_det``. As ATen, a C-contiguous A is factored as
    Aᵀ (LAPACK reads it column-major; det Aᵀ = det A): its backward expects that LU."""
    LU, piv, _ = lu_factor(ctx, A.mT if A.is_contiguous() else A)
    n = A.shape[-1]
    if n == 0:
        return torch.ones(A.shape[:-2], dtype=A.dtype), LU, piv
    d = flop.reduce(torch.diagonal(LU, dim1=-2, dim2=-1), [-1], ctx, mul=True)
    swaps = (piv != torch.arange(1, n + 1, dtype=torch.int32)).sum(-1)
    return torch.where(swaps % 2 == 1, -d, d), LU, piv


# ------------------------------------------------------------------------- Cholesky
def cholesky(ctx: Ctx, A: torch.Tensor, *, upper: bool = False):
    """(L, info) of ``linalg_cholesky_ex`` (module docstring)."""
    W, lead = _batch(A.mT if upper else A)
    B, n, _ = W.shape
    L = torch.zeros_like(W)
    info = torch.zeros(B, dtype=torch.int32)
    for j in range(n):
        d = W[:, j, j]
        bad = ~(d > 0)
        info = torch.where(bad & (info == 0), torch.tensor(j + 1, dtype=torch.int32), info)
        ljj = ctx.sqrt(d)
        L[:, j, j] = ljj
        if j + 1 < n:
            col = ctx.div(W[:, j + 1:, j], ljj.unsqueeze(1))
            L[:, j + 1:, j] = col
            prod = ctx.mul(col.unsqueeze(2), col.unsqueeze(1))
            W[:, j + 1:, j + 1:] = ctx.sub(W[:, j + 1:, j + 1:], prod)
    L = L.reshape(*lead, n, n)
    return (L.mT.contiguous() if upper else L), info.reshape(lead)


# ------------------------------------------------------------------------------- QR
def _reflector(ctx: Ctx, x: torch.Tensor):
    """(β, τ, v) of the Householder reflection of x (B, L), L ≥ 2 (dlarfg)."""
    alpha = x[:, 0]
    sq = ctx.mul(x, x)
    tail = flop.reduce(sq[:, 1:], [1], ctx)
    s = ctx.add(sq[:, 0], tail)
    norm = ctx.sqrt(s)
    beta = torch.where(alpha >= 0, -norm, norm)
    tau = ctx.div(ctx.sub(beta, alpha), beta)
    scal = ctx.sub(alpha, beta)
    vt = ctx.div(x[:, 1:], scal.unsqueeze(1))
    skip = tail == 0
    tau = torch.where(skip, torch.zeros_like(tau), tau)
    vt = _sel(skip, torch.zeros_like(vt), vt)
    beta = torch.where(skip, alpha, beta)
    v = torch.cat((torch.ones_like(alpha).unsqueeze(1), vt), 1)
    return beta, tau, v


def _apply_reflector(ctx: Ctx, v: torch.Tensor, tau: torch.Tensor, C: torch.Tensor):
    """``(I − τ v vᵀ) C`` for C (B, L, c): w = vᵀC (flop product), C − v·(τ·w)."""
    w = flop.bmm(v.unsqueeze(1), C, ctx)  # (B, 1, c)
    tw = ctx.mul(tau.reshape(-1, 1, 1), w)
    new = ctx.sub(C, ctx.mul(v.unsqueeze(2), tw))
    return _sel(tau != 0, new, C)


def qr(ctx: Ctx, A: torch.Tensor, mode: str = "reduced"):
    """(Q, R) of ``linalg_qr`` (module docstring); mode reduced | complete | r."""
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr: unknown mode {mode!r}")
    R, lead = _batch(A)
    B, m, n = R.shape
    k = min(m, n)
    refl = []
    for j in range(k):
        if m - j < 2:
            refl.append(None)
            continue
        beta, tau, v = _reflector(ctx, R[:, j:, j])
        R[:, j, j] = beta
        R[:, j + 1:, j] = 0
        if j + 1 < n:
            R[:, j:, j + 1:] = _apply_reflector(ctx, v, tau, R[:, j:, j + 1:])
        refl.append((tau, v))
    if mode == "r":
        return torch.empty(0, dtype=A.dtype), R[:, :k].contiguous().reshape(*lead, k, n)
    qc = m if mode == "complete" else k
    Q = torch.eye(m, qc, dtype=A.dtype).repeat(B, 1, 1)
    for j in range(k - 1, -1, -1):
        if refl[j] is None or j >= qc:
            continue
        tau, v = refl[j]
        Q[:, j:, j:] = _apply_reflector(ctx, v, tau, Q[:, j:, j:])
    Rout = R if mode == "complete" else R[:, :k].contiguous()
    return Q.reshape(*lead, m, qc), Rout.reshape(*lead, *Rout.shape[-2:])


# -------------------------------------------------------------------------- Jacobi
def _eps(ctx: Ctx, dtype: torch.dtype) -> float:
    """Unit roundoff·2 of the results' target: the block's format (fuzzy(format=...))
    when ``dtype`` results are rounded to one, else ``dtype`` at the virtual precision."""
    f = ctx.target(dtype)
    return 2.0 ** (1 - (ctx.bits(dtype) if f is None else ctx.format_bits(f)))


def rotation(ctx: Ctx, app: torch.Tensor, aqq: torch.Tensor, apq: torch.Tensor):
    """(c, s) zeroing the off-diagonal of [[app, apq], [apq, aqq]] (Rutishauser)."""
    theta = ctx.div(ctx.sub(aqq, app), ctx.mul(apq, 2.0))
    r = ctx.sqrt(ctx.add(1.0, ctx.mul(theta, theta)))
    one = torch.where(theta >= 0, 1.0, -1.0).to(theta.dtype)
    t = ctx.div(one, ctx.add(theta.abs(), r))
    c = ctx.div(1.0, ctx.sqrt(ctx.add(1.0, ctx.mul(t, t))))
    s = ctx.mul(t, c)
    return c, s


def rotate(ctx: Ctx, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, s: torch.Tensor):
    """``(c·x − s·y, s·x + c·y)`` for (B, L) x, y and (B,) c, s: the products in one call
    (stacked ``c·x, s·y, s·x, c·y``), the sums in one."""
    c, s = c.unsqueeze(1).expand_as(x), s.unsqueeze(1).expand_as(x)
    p = ctx.mul(torch.stack((c, s, s, c)), torch.stack((x, y, x, y)))
    o = ctx.add(torch.stack((p[0], p[2])), torch.stack((-p[1], p[3])))
    return o[0], o[1]


def eigh(ctx: Ctx, A: torch.Tensor, uplo: str = "L", compute_v: bool = True):
    """(eigenvalues, eigenvectors) of ``_linalg_eigh`` by cyclic Jacobi."""
    S = A if uplo.upper() == "L" else A.mT
    W, lead = _batch(torch.tril(S) + torch.tril(S, -1).mT)
    B, n, _ = W.shape
    V = torch.eye(n, dtype=A.dtype).repeat(B, 1, 1)
    eps = _eps(ctx, A.dtype)
    floor = eps * eps * W.abs().flatten(1).amax(1).to(torch.float64) if n else None
    for _ in range(MAX_SWEEPS):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = W[:, p, q]
                thr = eps * (W[:, p, p].double() * W[:, q, q].double()).abs().sqrt() + floor
                act = apq.double().abs() > thr
                if not bool(act.any()):
                    W[:, p, q] = 0
                    W[:, q, p] = 0
                    continue
                rotated = True
                c, s = rotation(ctx, W[:, p, p], W[:, q, q], apq)
                cp, cq = rotate(ctx, W[:, :, p], W[:, :, q], c, s)
                W[:, :, p], W[:, :, q] = _sel(act, cp, W[:, :, p]), _sel(act, cq, W[:, :, q])
                rp, rq = rotate(ctx, W[:, p, :], W[:, q, :], c, s)
                W[:, p, :], W[:, q, :] = _sel(act, rp, W[:, p, :]), _sel(act, rq, W[:, q, :])
                W[:, p, q] = 0
                W[:, q, p] = 0
                vp, vq = rotate(ctx, V[:, :, p], V[:, :, q], c, s)
                V[:, :, p], V[:, :, q] = _sel(act, vp, V[:, :, p]), _sel(act, vq, V[:, :, q])
        if not rotated:
            break
    w = torch.diagonal(W, dim1=-2, dim2=-1)
    w, order = torch.sort(w, dim=-1, stable=True)
    w = w.reshape(*lead, n)
    if not compute_v:
        return w, torch.empty(0, dtype=A.dtype)
    V = torch.gather(V, 2, order.unsqueeze(1).expand(B, n, n))
    return w, V.reshape(*lead, n, n)


def _jacobi_columns(ctx: Ctx, G: torch.Tensor, V: torch.Tensor):
    """One-sided Jacobi sweeps on the columns of G (B, m, n), V accumulating."""
    B, m, n = G.shape
    eps = _eps(ctx, G.dtype)
    for _ in range(MAX_SWEEPS):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                gp, gq = G[:, :, p], G[:, :, q]
                prods = ctx.mul(torch.stack((gp, gq, gp)), torch.stack((gp, gq, gq)))
                a, b, g = flop.reduce(prods, [2], ctx)
                act = g.double().abs() > eps * (a.double() * b.double()).sqrt()
                if not bool(act.any()):
                    continue
                rotated = True
                c, s = rotation(ctx, a, b, g)
                np_, nq = rotate(ctx, gp, gq, c, s)
                G[:, :, p], G[:, :, q] = _sel(act, np_, gp), _sel(act, nq, gq)
                vp, vq = rotate(ctx, V[:, :, p], V[:, :, q], c, s)
                V[:, :, p], V[:, :, q] = _sel(act, vp, V[:, :, p]), _sel(act, vq, V[:, :, q])
        if not rotated:
            break
    return G, V


def _complete(ctx: Ctx, U: torch.Tensor) -> torch.Tensor:
    """U (B, m, r), r < m orthonormal columns, completed to (B, m, m) by the complete
    Householder QR of U (its last m − r columns)."""
    Q, _ = qr(ctx, U, "complete")
    return torch.cat((U, Q[:, :, U.shape[2]:]), 2)


def svd(ctx: Ctx, A: torch.Tensor, full_matrices: bool = True, compute_uv: bool = True):
    """(U, S, Vh) of ``_linalg_svd`` by one-sided Jacobi (module docstring)."""
    m, n = A.shape[-2:]
    if m < n:
        U, S, Vh = svd(ctx, A.mT, full_matrices, compute_uv)
        if not compute_uv:
            return U, S, Vh
        return Vh.mT, S, U.mT
    G, lead = _batch(A)
    B = G.shape[0]
    V = torch.eye(n, dtype=A.dtype).repeat(B, 1, 1)
    G, V = _jacobi_columns(ctx, G, V)
    sq = ctx.mul(G, G)
    sig = ctx.sqrt(flop.reduce(sq, [1], ctx)) if m > 0 else torch.zeros(B, n, dtype=A.dtype)
    sig_sorted, order = torch.sort(sig, dim=-1, descending=True, stable=True)
    S = sig_sorted.reshape(*lead, n)
    if not compute_uv:
        return torch.empty(0, dtype=A.dtype), S, torch.empty(0, dtype=A.dtype)
    U = ctx.div(G, sig.unsqueeze(1))
    U = torch.where(sig.unsqueeze(1) == 0, torch.zeros((), dtype=U.dtype), U)
    U = torch.gather(U, 2, order.unsqueeze(1).expand(B, m, n))
    V = torch.gather(V, 2, order.unsqueeze(1).expand(B, n, n))
    if full_matrices and m > n:
        U = _complete(ctx, U)
    return U.reshape(*lead, m, U.shape[-1]), S, V.mT.reshape(*lead, n, n)
