"""Linear algebra at flop granularity (numvar.instrument.linalg): slow references bit
for bit, backward-error bounds in ieee mode, perturbation under SR, report, gradients."""

import numpy as np
import pytest
import torch

import numvar.rounding as R
from numvar.instrument import fuzzy
from numvar.instrument import linalg as LA
from numvar.instrument._core import Ctx
from numvar.instrument.kernels import contract_reference

from _bitwise import same
from _scalar_round import ScalarRounding

F32 = torch.float32
U32 = 2.0 ** -24  # unit roundoff of binary32


def _gamma(k: int, u: float = U32) -> float:
    """Higham's γ_k = k·u / (1 − k·u)."""
    return k * u / (1 - k * u)


def _spd(B, n, seed=0, dtype=F32):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(B, n, n, generator=g, dtype=torch.float64)
    return (A @ A.mT + n * torch.eye(n, dtype=torch.float64)).to(dtype)


def _rand(*shape, seed=0, dtype=F32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# ----------------------------------------------------------------- slow references
def lu_reference(A: np.ndarray, sr: ScalarRounding):
    """Right-looking LU with partial pivoting, element by element (module order)."""
    A = A.copy()
    B, m, n = A.shape
    k = min(m, n)
    piv = np.zeros((B, k), np.int32)
    info = np.zeros(B, np.int32)
    for j in range(k):
        for b in range(B):
            col = [abs(A[b, i, j]) for i in range(j, m)]
            p = j + col.index(max(col))
            piv[b, j] = p + 1
            A[b, [j, p]] = A[b, [p, j]]
            if A[b, j, j] == 0 and info[b] == 0:
                info[b] = j + 1
        if j + 1 < m:
            kd = sr.key()
            L = m - j - 1
            for b in range(B):
                for i in range(j + 1, m):
                    q = sr.div(A[b, i, j], A[b, j, j], kd, b * L + i - j - 1)
                    if A[b, j, j] != 0:
                        A[b, i, j] = q
            if j + 1 < n:
                km, ks = sr.key(), sr.key()
                N = n - j - 1
                for b in range(B):
                    for i in range(j + 1, m):
                        for c in range(j + 1, n):
                            e = (b * L + i - j - 1) * N + c - j - 1
                            p_ = sr.mul(A[b, i, j], A[b, j, c], km, e)
                            A[b, i, c] = sr.sub(A[b, i, c], p_, ks, e)
    return A, piv, info


def trsm_reference(T: np.ndarray, X: np.ndarray, sr: ScalarRounding, upper: bool, unit: bool):
    """Column-oriented substitution, element by element."""
    Y = X.copy()
    B, n, r = Y.shape
    for j in (range(n - 1, -1, -1) if upper else range(n)):
        if not unit:
            kd = sr.key()
            for b in range(B):
                for c in range(r):
                    Y[b, j, c] = sr.div(Y[b, j, c], T[b, j, j], kd, b * r + c)
        rest = list(range(0, j)) if upper else list(range(j + 1, n))
        if rest:
            km, ks = sr.key(), sr.key()
            for b in range(B):
                for ii, i in enumerate(rest):
                    for c in range(r):
                        e = (b * len(rest) + ii) * r + c
                        p = sr.mul(T[b, i, j], Y[b, j, c], km, e)
                        Y[b, i, c] = sr.sub(Y[b, i, c], p, ks, e)
    return Y


def cholesky_reference(A: np.ndarray, sr: ScalarRounding):
    W = A.copy()
    B, n, _ = W.shape
    L = np.zeros_like(W)
    for j in range(n):
        ksq = sr.key()
        for b in range(B):
            L[b, j, j] = sr.sqrt(W[b, j, j], ksq, b)
        if j + 1 < n:
            kd = sr.key()
            m = n - j - 1
            for b in range(B):
                for i in range(j + 1, n):
                    L[b, i, j] = sr.div(W[b, i, j], L[b, j, j], kd, b * m + i - j - 1)
            km, ks = sr.key(), sr.key()
            for b in range(B):
                for i in range(j + 1, n):
                    for c in range(j + 1, n):
                        e = (b * m + i - j - 1) * m + c - j - 1
                        p = sr.mul(L[b, i, j], L[b, c, j], km, e)
                        W[b, i, c] = sr.sub(W[b, i, c], p, ks, e)
    return L


def _reflector_reference(x: np.ndarray, sr: ScalarRounding):
    B, L = x.shape
    k1 = sr.key()
    sq = np.array([[sr.mul(x[b, i], x[b, i], k1, b * L + i) for i in range(L)] for b in range(B)],
                  dtype=x.dtype)
    tail = sr.row_sums(sq[:, 1:].T.copy())
    k3 = sr.key()
    s = [sr.add(sq[b, 0], tail[b], k3, b) for b in range(B)]
    k4 = sr.key()
    norm = [sr.sqrt(s[b], k4, b) for b in range(B)]
    alpha = x[:, 0]
    beta = [-norm[b] if alpha[b] >= 0 else norm[b] for b in range(B)]
    k5, k6 = sr.key(), sr.key()
    d1 = [sr.sub(beta[b], alpha[b], k5, b) for b in range(B)]
    tau = [sr.div(d1[b], beta[b], k6, b) for b in range(B)]
    k7 = sr.key()
    scal = [sr.sub(alpha[b], beta[b], k7, b) for b in range(B)]
    k8 = sr.key()
    v = np.ones((B, L), dtype=x.dtype)
    for b in range(B):
        for i in range(1, L):
            v[b, i] = sr.div(x[b, i], scal[b], k8, b * (L - 1) + i - 1)
        if tail[b] == 0:
            tau[b], beta[b] = 0.0, alpha[b]
            v[b, 1:] = 0
    return np.array(beta, x.dtype), np.array(tau, x.dtype), v


def _apply_reference(v, tau, C, sr: ScalarRounding):
    B, L, c = C.shape
    w = contract_reference(v[:, None, :].copy(), C.copy(), sr.key(), sr.code, sr.t)
    k2 = sr.key()
    tw = [[sr.mul(tau[b], w[b, 0, cc], k2, b * c + cc) for cc in range(c)] for b in range(B)]
    k3, k4 = sr.key(), sr.key()
    out = C.copy()
    for b in range(B):
        for i in range(L):
            for cc in range(c):
                e = (b * L + i) * c + cc
                p = sr.mul(v[b, i], tw[b][cc], k3, e)
                r = sr.sub(C[b, i, cc], p, k4, e)
                if tau[b] != 0:
                    out[b, i, cc] = r
    return out


def qr_reference(A: np.ndarray, sr: ScalarRounding):
    """Householder QR (reduced), element by element."""
    R_ = A.copy()
    B, m, n = R_.shape
    k = min(m, n)
    refl = []
    for j in range(k):
        if m - j < 2:
            refl.append(None)
            continue
        beta, tau, v = _reflector_reference(R_[:, j:, j].copy(), sr)
        R_[:, j, j] = beta
        R_[:, j + 1:, j] = 0
        if j + 1 < n:
            R_[:, j:, j + 1:] = _apply_reference(v, tau, R_[:, j:, j + 1:], sr)
        refl.append((tau, v))
    Q = np.tile(np.eye(m, k, dtype=A.dtype), (B, 1, 1))
    for j in range(k - 1, -1, -1):
        if refl[j] is None:
            continue
        tau, v = refl[j]
        Q[:, j:, j:] = _apply_reference(v, tau, Q[:, j:, j:], sr)
    return Q, R_[:, :k]


def _rotation_reference(app, aqq, apq, sr: ScalarRounding):
    B = len(app)
    k = sr.key()
    d = [sr.sub(aqq[b], app[b], k, b) for b in range(B)]
    k = sr.key()
    two = [sr.mul(apq[b], 2.0, k, b) for b in range(B)]
    k = sr.key()
    th = [sr.div(d[b], two[b], k, b) for b in range(B)]
    k = sr.key()
    th2 = [sr.mul(th[b], th[b], k, b) for b in range(B)]
    k = sr.key()
    s1 = [sr.add(1.0, th2[b], k, b) for b in range(B)]
    k = sr.key()
    r = [sr.sqrt(s1[b], k, b) for b in range(B)]
    k = sr.key()
    den = [sr.add(abs(th[b]), r[b], k, b) for b in range(B)]
    k = sr.key()
    t = [sr.div(1.0 if th[b] >= 0 else -1.0, den[b], k, b) for b in range(B)]
    k = sr.key()
    t2 = [sr.mul(t[b], t[b], k, b) for b in range(B)]
    k = sr.key()
    s2 = [sr.add(1.0, t2[b], k, b) for b in range(B)]
    k = sr.key()
    sq = [sr.sqrt(s2[b], k, b) for b in range(B)]
    k = sr.key()
    c = [sr.div(1.0, sq[b], k, b) for b in range(B)]
    k = sr.key()
    s = [sr.mul(t[b], c[b], k, b) for b in range(B)]
    return c, s


def _rotate_reference(x, y, c, s, act, sr: ScalarRounding):
    """(c·x − s·y, s·x + c·y) on (B, L) arrays, rows of inactive batch elements kept."""
    B, L = x.shape
    k1, k2 = sr.key(), sr.key()
    nx, ny = x.copy(), y.copy()
    for b in range(B):
        for i in range(L):
            p0 = sr.mul(c[b], x[b, i], k1, (0 * B + b) * L + i)
            p1 = sr.mul(s[b], y[b, i], k1, (1 * B + b) * L + i)
            p2 = sr.mul(s[b], x[b, i], k1, (2 * B + b) * L + i)
            p3 = sr.mul(c[b], y[b, i], k1, (3 * B + b) * L + i)
            if act[b]:
                nx[b, i] = sr.add(p0, -p1, k2, b * L + i)
                ny[b, i] = sr.add(p2, p3, k2, (B + b) * L + i)
    return nx, ny


def eigh_reference(A: np.ndarray, sr: ScalarRounding):
    """Cyclic Jacobi, element by element."""
    W = np.tril(A) + np.swapaxes(np.tril(A, -1), 1, 2)
    B, n, _ = W.shape
    V = np.tile(np.eye(n, dtype=A.dtype), (B, 1, 1))
    eps = 2.0 ** (1 - sr.t)
    floor = eps * eps * np.abs(W).reshape(B, -1).max(1).astype(np.float64)
    for _ in range(LA.MAX_SWEEPS):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                thr = eps * np.sqrt(np.abs(W[:, p, p].astype(np.float64) * W[:, q, q])) + floor
                act = np.abs(W[:, p, q].astype(np.float64)) > thr
                if not act.any():
                    W[:, p, q] = W[:, q, p] = 0
                    continue
                rotated = True
                c, s = _rotation_reference(W[:, p, p], W[:, q, q], W[:, p, q], sr)
                W[:, :, p], W[:, :, q] = _rotate_reference(W[:, :, p], W[:, :, q], c, s, act, sr)
                W[:, p, :], W[:, q, :] = _rotate_reference(W[:, p, :], W[:, q, :], c, s, act, sr)
                W[:, p, q] = W[:, q, p] = 0
                V[:, :, p], V[:, :, q] = _rotate_reference(V[:, :, p], V[:, :, q], c, s, act, sr)
        if not rotated:
            break
    w = np.diagonal(W, axis1=1, axis2=2)
    order = np.argsort(w, axis=1, kind="stable")
    return np.take_along_axis(w, order, 1), np.take_along_axis(V, order[:, None, :], 2)


def svd_reference(A: np.ndarray, sr: ScalarRounding):
    """One-sided Jacobi (m ≥ n, reduced), element by element."""
    G = A.copy()
    B, m, n = G.shape
    V = np.tile(np.eye(n, dtype=A.dtype), (B, 1, 1))
    eps = 2.0 ** (1 - sr.t)
    for _ in range(LA.MAX_SWEEPS):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                k = sr.key()
                prods = np.empty((3, B, m), dtype=A.dtype)
                for z, (x, y) in enumerate(((p, p), (q, q), (p, q))):
                    for b in range(B):
                        for i in range(m):
                            prods[z, b, i] = sr.mul(G[b, i, x], G[b, i, y], k, (z * B + b) * m + i)
                sums = sr.row_sums(prods.reshape(3 * B, m).T.copy()).reshape(3, B)
                a, b_, g = sums
                act = np.abs(g.astype(np.float64)) > eps * np.sqrt(a.astype(np.float64) * b_)
                if not act.any():
                    continue
                rotated = True
                c, s = _rotation_reference(a, b_, g, sr)
                G[:, :, p], G[:, :, q] = _rotate_reference(G[:, :, p], G[:, :, q], c, s, act, sr)
                V[:, :, p], V[:, :, q] = _rotate_reference(V[:, :, p], V[:, :, q], c, s, act, sr)
        if not rotated:
            break
    k = sr.key()
    sq = np.array([[[sr.mul(G[b, i, j], G[b, i, j], k, (b * m + i) * n + j) for j in range(n)]
                    for i in range(m)] for b in range(B)], dtype=A.dtype)
    ss = sr.row_sums(sq.transpose(1, 0, 2).reshape(m, B * n).copy()).reshape(B, n)
    k = sr.key()
    sig = np.array([[sr.sqrt(ss[b, j], k, b * n + j) for j in range(n)] for b in range(B)], A.dtype)
    k = sr.key()
    U = np.array([[[sr.div(G[b, i, j], sig[b, j], k, (b * m + i) * n + j) for j in range(n)]
                   for i in range(m)] for b in range(B)], dtype=A.dtype)
    order = np.argsort(-sig, axis=1, kind="stable")
    return (np.take_along_axis(U, order[:, None, :], 2), np.take_along_axis(sig, order, 1),
            np.swapaxes(np.take_along_axis(V, order[:, None, :], 2), 1, 2))


# ------------------------------------------------------------------- bit for bit
def _ctx(seed, mode="sr", precision=None):
    return Ctx(mode, "flop", precision, R.Stream(seed))


CASES = [("sr", None, torch.float32), ("sr", 12, torch.float32), ("ud", None, torch.float64)]


@pytest.mark.parametrize("mode,prec,dt", CASES)
def test_lu_and_solve_match_reference(mode, prec, dt):
    A = _rand(2, 4, 4, seed=1, dtype=dt)
    A[1, 0, 0] = 0.0  # a zero in the pivot column: the pivot search must move
    Bm = _rand(2, 4, 2, seed=2, dtype=dt)
    for seed in (0, 7):
        LU, piv, info = LA.lu_factor(_ctx(seed, mode, prec), A)
        sr = ScalarRounding(seed, mode, dt, prec)
        rLU, rpiv, rinfo = lu_reference(A.numpy(), sr)
        assert same(LU, torch.from_numpy(rLU)) and torch.equal(piv, torch.from_numpy(rpiv))
        assert torch.equal(info, torch.from_numpy(rinfo))
        # solve = LU, row swaps, unit lower, upper
        X, *_ = LA.solve(_ctx(seed, mode, prec), A, Bm)
        sr = ScalarRounding(seed, mode, dt, prec)
        rLU, rpiv, _ = lu_reference(A.numpy(), sr)
        Y = Bm.numpy().copy()
        for b in range(2):
            for j in range(4):
                p = rpiv[b, j] - 1
                Y[b, [j, p]] = Y[b, [p, j]]
        Y = trsm_reference(rLU, Y, sr, upper=False, unit=True)
        Y = trsm_reference(rLU, Y, sr, upper=True, unit=False)
        assert same(X, torch.from_numpy(Y))


@pytest.mark.parametrize("mode,prec,dt", CASES)
def test_cholesky_matches_reference(mode, prec, dt):
    A = _spd(2, 4, seed=3, dtype=dt)
    L, info = LA.cholesky(_ctx(5, mode, prec), A)
    ref = cholesky_reference(A.numpy(), ScalarRounding(5, mode, dt, prec))
    assert same(L, torch.from_numpy(ref)) and not info.any()


@pytest.mark.parametrize("mode,prec,dt", CASES)
@pytest.mark.parametrize("shape", [(2, 4, 3), (2, 3, 3), (1, 2, 4)])
def test_qr_matches_reference(mode, prec, dt, shape):
    A = _rand(*shape, seed=4, dtype=dt)
    Q, Rm = LA.qr(_ctx(2, mode, prec), A)
    rQ, rR = qr_reference(A.numpy(), ScalarRounding(2, mode, dt, prec))
    assert same(Q, torch.from_numpy(rQ)) and same(Rm, torch.from_numpy(np.ascontiguousarray(rR)))


@pytest.mark.parametrize("mode,prec,dt", CASES)
def test_jacobi_eigh_matches_reference(mode, prec, dt):
    A = _spd(2, 3, seed=6, dtype=dt)
    w, V = LA.eigh(_ctx(4, mode, prec), A)
    rw, rV = eigh_reference(A.numpy(), ScalarRounding(4, mode, dt, prec))
    assert same(w, torch.from_numpy(np.ascontiguousarray(rw)))
    assert torch.equal(V, torch.from_numpy(rV))


@pytest.mark.parametrize("mode,prec,dt", CASES)
def test_jacobi_svd_matches_reference(mode, prec, dt):
    A = _rand(2, 4, 3, seed=8, dtype=dt)
    U, S, Vh = LA.svd(_ctx(9, mode, prec), A, full_matrices=False)
    rU, rS, rVh = svd_reference(A.numpy(), ScalarRounding(9, mode, dt, prec))
    assert torch.equal(U, torch.from_numpy(rU)) and torch.equal(S, torch.from_numpy(rS))
    assert torch.equal(Vh, torch.from_numpy(np.ascontiguousarray(rVh)))


# ------------------------------------------------- ieee accuracy (derived bounds)
def _ieee(fn, *args):
    with fuzzy(mode="ieee", granularity="flop") as fz:
        out = fn(*args)
    return out, fz.report()


def _perm_from_pivots(piv: torch.Tensor, n: int) -> torch.Tensor:
    """P (float64) with P·A = the row-swapped A, from LAPACK pivots."""
    P = torch.eye(n, dtype=torch.float64).repeat(piv.shape[0], 1, 1)
    for b in range(piv.shape[0]):
        for j in range(piv.shape[1]):
            p = int(piv[b, j]) - 1
            P[b, [j, p]] = P[b, [p, j]]
    return P


def test_lu_solve_inv_backward_error_ieee():
    """Higham Thm 9.3: L̂Û = PA + ΔA, |ΔA| ≤ γ_n|L̂||Û|; Thm 9.4: (A + ΔA)x̂ = b with
    |ΔA| ≤ γ_3n·Pᵀ|L̂||Û| (inv: the same for each column of the identity). Checked in
    float64, where the products of binary32 numbers are exact and the sums add a
    relative 2^-50 at most (the factor 1.01 covers it)."""
    n = 6
    A = _rand(3, n, n, seed=11)
    b = _rand(3, n, 2, seed=12)
    (LU, piv), _ = _ieee(torch.linalg.lu_factor, A)
    L = torch.tril(LU.double(), -1) + torch.eye(n, dtype=torch.float64)
    U = torch.triu(LU.double())
    P = _perm_from_pivots(piv, n)
    absLU = L.abs() @ U.abs()
    assert ((L @ U - P @ A.double()).abs() <= 1.01 * _gamma(n) * absLU).all()
    x, _ = _ieee(torch.linalg.solve, A, b)
    res = (b.double() - A.double() @ x.double()).abs()
    assert (res <= 1.01 * _gamma(3 * n) * (P.mT @ absLU) @ x.double().abs()).all()
    X, _ = _ieee(torch.linalg.inv, A)
    res = (torch.eye(n, dtype=torch.float64) - A.double() @ X.double()).abs()
    assert (res <= 1.01 * _gamma(3 * n) * (P.mT @ absLU) @ X.double().abs()).all()
    # and within that bound of float64's own solution
    assert torch.allclose(x.double(), torch.linalg.solve(A.double(), b.double()), rtol=1e-4, atol=1e-5)


def test_det_ieee_within_first_order_bound():
    """det(A + ΔA) = det A·(1 + tr(A⁻¹ΔA) + O(‖ΔA‖²)); with ‖ΔA‖₂ ≤ γ_n‖|L̂||Û|‖₂ (Thm 9.3)
    and n − 1 rounded products of the diagonal (γ_{n−1}): |d̂ − d|/|d| ≤
    n·‖A⁻¹‖₂·γ_n·‖|L̂||Û|‖₂ + γ_{n−1}, doubled for the second-order terms."""
    n = 5
    A = _rand(4, n, n, seed=13) + 2 * torch.eye(n)
    d, _ = _ieee(torch.linalg.det, A)
    Ad = A.double()
    ref = torch.linalg.det(Ad)
    with fuzzy(mode="ieee"):  # the factorization det uses: of Aᵀ (A is C-contiguous)
        LUf, _ = torch.linalg.lu_factor(A.mT)
    Lf = torch.tril(LUf.double(), -1) + torch.eye(n, dtype=torch.float64)
    absLU = Lf.abs() @ torch.triu(LUf.double()).abs()
    inv_norm = torch.linalg.matrix_norm(torch.linalg.inv(Ad), 2)
    bound = n * inv_norm * _gamma(n) * torch.linalg.matrix_norm(absLU, 2) + _gamma(n - 1)
    assert ((d.double() - ref).abs() / ref.abs() <= 2 * bound).all()


def test_cholesky_and_triangular_backward_error_ieee():
    """Higham Thm 10.3: L̂L̂ᵀ = A + ΔA, |ΔA| ≤ γ_{n+1}|L̂||L̂ᵀ|; Thm 8.5: (T + ΔT)x̂ = b,
    |ΔT| ≤ γ_n|T|."""
    n = 6
    A = _spd(2, n, seed=14)
    L, _ = _ieee(torch.linalg.cholesky, A)
    Ld = L.double()
    assert ((Ld @ Ld.mT - A.double()).abs() <= 1.01 * _gamma(n + 1) * Ld.abs() @ Ld.abs().mT).all()
    U, _ = _ieee(lambda a: torch.linalg.cholesky(a, upper=True), A)
    assert torch.equal(U, L.mT)
    b = _rand(2, n, 3, seed=15)
    for upper in (False, True):
        T = L.mT.contiguous() if upper else L
        x, _ = _ieee(lambda t, bb: torch.linalg.solve_triangular(t, bb, upper=upper), T, b)
        res = (b.double() - T.double() @ x.double()).abs()
        assert (res <= 1.01 * _gamma(n) * T.double().abs() @ x.double().abs()).all()


def test_qr_backward_error_ieee():
    """Higham Thm 19.4 / 19.13: Q̂R̂ = A + ΔA with ‖Δa_j‖₂ ≤ γ̃_{mn}‖a_j‖₂ and
    ‖Q̂ᵀQ̂ − I‖_F ≤ √n·γ̃_{mn}, γ̃_k = c·k·u; per reflector our code rounds a norm (2
    ops per entry), a scaling, a dot product and an update (≤ 4 ops per entry): c = 4."""
    m, n = 7, 4
    A = _rand(3, m, n, seed=16)
    for mode in ("reduced", "complete"):
        (Q, Rm), _ = _ieee(lambda a: torch.linalg.qr(a, mode=mode), A)
        g = 4 * m * n * U32
        k = Q.shape[-1]
        Rd = Rm.double()
        res = torch.linalg.vector_norm(Q.double() @ Rd - A.double(), dim=-2)
        assert (res <= g * torch.linalg.vector_norm(A.double(), dim=-2)).all()
        orth = torch.linalg.matrix_norm(Q.double().mT @ Q.double() - torch.eye(k, dtype=torch.float64))
        assert (orth <= n ** 0.5 * g * 2).all()
        nat = torch.linalg.qr(A, mode=mode)
        assert torch.allclose(Rm, nat[1], atol=1e-5, rtol=1e-4)  # same sign convention (dlarfg)


def test_jacobi_eigh_svd_accuracy_ieee():
    """Each Jacobi rotation is applied with errors ≤ 6u·‖(x, y)‖ per entry pair (4
    products, 2 sums; rotation parameters ≤ 8u), and one sweep touches each entry
    2(n−1) times; Weyl's theorem gives |λ̂_i − λ_i| ≤ ‖ΔA‖₂ ≤ S·2(n−1)·14u·‖A‖_F for
    S sweeps (S ≤ 10 below n = 16: quadratic convergence). Singular values likewise."""
    n = 6
    A = _spd(3, n, seed=17)
    (w, V), rep = _ieee(torch.linalg.eigh, A)
    ref = torch.linalg.eigvalsh(A.double())
    bound = 10 * 2 * (n - 1) * 14 * U32 * torch.linalg.matrix_norm(A.double())
    assert ((w.double() - ref).abs() <= bound.unsqueeze(-1)).all()
    Vd = V.double()
    assert ((Vd @ torch.diag_embed(w.double()) @ Vd.mT - A.double()).abs().amax((-2, -1)) <= bound).all()
    G = _rand(3, 5, 4, seed=18)
    for full in (False, True):
        (U, S, Vh), _ = _ieee(lambda a: torch.linalg.svd(a, full_matrices=full), G)
        nat = torch.linalg.svd(G, full_matrices=full)
        assert U.shape == nat[0].shape and Vh.shape == nat[2].shape and U.dtype == F32
        refs = torch.linalg.svdvals(G.double())
        bnd = 10 * 2 * 3 * 14 * U32 * torch.linalg.matrix_norm(G.double())
        assert ((S.double() - refs).abs() <= bnd.unsqueeze(-1)).all()
        rec = (U.double()[..., :4] * S.double().unsqueeze(-2)) @ Vh.double()
        assert ((rec - G.double()).abs().amax((-2, -1)) <= bnd).all()
        eye = torch.eye(U.shape[-1], dtype=torch.float64)
        assert torch.allclose(U.double().mT @ U.double(), eye, atol=1e-5)
    (U2, S2, Vh2), _ = _ieee(lambda a: torch.linalg.svd(a, full_matrices=True), G.mT)  # wide
    assert U2.shape == (3, 4, 4) and Vh2.shape == (3, 5, 5)
    assert torch.allclose(S2, S, atol=1e-5)


# ------------------------------------------------- modes, dtypes, report, gradients
OPS = {
    "solve": lambda A, S, b: torch.linalg.solve(A, b),
    "inv": lambda A, S, b: torch.linalg.inv(A),
    "det": lambda A, S, b: torch.linalg.det(A),
    "lu_factor": lambda A, S, b: torch.linalg.lu_factor(A)[0],
    "lu_solve": lambda A, S, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(A), b, adjoint=True),
    "cholesky": lambda A, S, b: torch.linalg.cholesky(S),
    "qr": lambda A, S, b: torch.linalg.qr(A)[1],
    "eigh": lambda A, S, b: torch.linalg.eigvalsh(S),
    "svd": lambda A, S, b: torch.linalg.svdvals(A),
    "solve_triangular": lambda A, S, b: torch.linalg.solve_triangular(S.tril(), b, upper=False),
}
ATEN = {
    "solve": "aten._linalg_solve_ex.default", "inv": "aten.linalg_inv_ex.default",
    "det": "aten._linalg_det.default", "lu_factor": "aten.linalg_lu_factor_ex.default",
    "lu_solve": "aten.linalg_lu_solve.default", "cholesky": "aten.linalg_cholesky_ex.default",
    "qr": "aten.linalg_qr.default", "eigh": "aten._linalg_eigh.default",
    "svd": "aten._linalg_svd.default", "solve_triangular": "aten.linalg_solve_triangular.default",
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_flop_level_dtype_perturbation_and_report(name):
    """Native dtype and shape; SR: same seed bitwise equal, another seed differs; the
    report lists the aten op as a flop-level handler (not exact, native or rounded
    once). On main these ops are rounded once from a float64 result."""
    A = _rand(2, 4, 4, seed=20) + 3 * torch.eye(4)
    S = _spd(2, 4, seed=21)
    b = _rand(2, 4, 2, seed=22)
    f = OPS[name]
    ref = f(A, S, b)
    outs = []
    for seed in (1, 1, 2):
        with fuzzy(mode="sr", granularity="flop", seed=seed) as fz:
            outs.append(f(A, S, b))
    assert outs[0].dtype == ref.dtype and outs[0].shape == ref.shape
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    rep = fz.report()
    op = ATEN[name]
    assert op in rep.instrumented and rep.how[op].startswith("flop (")
    assert op not in rep.native and op not in rep.exact and not rep.native


def test_op_granularity_rounds_once():
    A = _rand(2, 3, 3, seed=23) + 3 * torch.eye(3)
    with fuzzy(mode="sr", granularity="op", seed=0) as fz:
        x = torch.linalg.inv(A)
    assert x.dtype == F32 and fz.report().how["aten.linalg_inv_ex.default"] == "rounded once (op)"


def test_training_backward_through_solve():
    """A parameter matrix fitted through linalg.solve with SGD: under ieee the gradients
    match native ones (relative 1e-4: the forward solves agree to γ_3n·κ ≈ 1e-5 here);
    under SR two seeds give different gradients and the loss still decreases."""
    torch.manual_seed(0)
    n = 4
    W0 = torch.randn(n, n) * 0.1
    b = torch.randn(8, n, 1)
    target = torch.randn(8, n, 1)

    def step(W):
        x = torch.linalg.solve(torch.eye(n) * 3 + W, b)
        loss = ((x - target) ** 2).mean()
        loss.backward()
        return loss.detach()

    Wn = W0.clone().requires_grad_()
    step(Wn)
    grads = {}
    for mode, seed in (("ieee", 0), ("sr", 1), ("sr", 2)):
        W = W0.clone().requires_grad_()
        opt = torch.optim.SGD([W], lr=0.5)
        with fuzzy(mode=mode, seed=seed) as fz:
            losses = []
            for _ in range(3):
                opt.zero_grad()
                losses.append(step(W))
                if (mode, seed) not in grads:
                    grads[(mode, seed)] = W.grad.clone()
                opt.step()
        assert losses[-1] < losses[0]
        rep = fz.report()
        assert "aten.linalg_lu_solve.default" in rep.instrumented and not rep.native
    assert torch.allclose(grads[("ieee", 0)], Wn.grad, rtol=1e-4, atol=1e-6)
    assert not torch.equal(grads[("sr", 1)], grads[("sr", 2)])
