"""Torch-tensor path of the rounding core (any device).

A line-by-line vectorisation of :mod:`numvar.rounding.kernels` on float64 tensors with
the same branch structure, so that both paths give identical bits. Random bits are
emulated on int64 tensors (wrapping multiplication; logical right shifts by masking).
"""

from __future__ import annotations

import torch

from .kernels import FLAG_FLUSH, FLAG_UNSIGNED_ZERO, GAMMA, MIX1, MIX2, MODE_DOWN, \
    MODE_FARTHEST, MODE_IEEE, MODE_RANDOM, MODE_SR, MODE_UD, MODE_UP, MODE_ZERO, OP_ADD, \
    OP_MUL, OP_SUB, OVF_INF, OVF_NAN, OVF_SATURATE

F64 = torch.float64
I64 = torch.int64
INF = float("inf")
_M64 = (1 << 64) - 1


def _s64(x: int) -> int:
    """A uint64 as the int64 with the same bits."""
    x &= _M64
    return x - (1 << 64) if x >= 1 << 63 else x


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def bits_tensor(key: int, n: int, device) -> torch.Tensor:
    """bits64(key, j) for j = 0..n-1 as int64 bit patterns."""
    z = torch.arange(1, n + 1, dtype=I64, device=device)
    z.mul_(_s64(GAMMA)).add_(_s64(key))
    z = z ^ _lsr(z, 30)
    z.mul_(_s64(MIX1))
    z = z ^ _lsr(z, 27)
    z.mul_(_s64(MIX2))
    return z ^ _lsr(z, 31)


def _f(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(F64)


def _b(x: torch.Tensor) -> torch.Tensor:
    return x.view(I64)


def pow2(k) -> torch.Tensor:
    """2.0**k for an int64 tensor k (clamped to [-1074, 1023]); exact."""
    k = k.clamp(-1074, 1023)
    normal = _f((k + 1023).clamp(min=1) << 52)
    subn = _f(torch.ones_like(k) << (k + 1074).clamp(0, 51))
    return torch.where(k >= -1022, normal, subn)


def exponent(h: torch.Tensor) -> torch.Tensor:
    """floor(log2(h)) for finite h > 0; garbage (but no error) elsewhere."""
    be = (_b(h) >> 52) & 0x7FF
    bs = (_b(h * 18446744073709551616.0) >> 52) & 0x7FF
    return torch.where(be == 0, bs - 1023 - 64, be - 1023)


def scale2(x: torch.Tensor, n) -> torch.Tensor:
    """x * 2**n elementwise, exact whenever representable (n int64 tensor)."""
    if not isinstance(n, torch.Tensor):
        n = torch.full_like(x, 0, dtype=I64) + int(n)
    for _ in range(3):
        big = n > 1000
        small = n < -1000
        if not bool((big | small).any()):
            break
        x = torch.where(big, x * 2.0 ** 1000, torch.where(small, x * 2.0 ** -1000, x))
        n = torch.where(big, n - 1000, torch.where(small, n + 1000, n))
    return x * pow2(n)


def two_sum(a, b):
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _split(a):
    c = 134217729.0 * a
    ah = c - (c - a)
    return ah, a - ah


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _finite(x):
    return x.abs() < INF


def _sexp(e_true, t: int, sub: int, lowest: int | None = None):
    s = (e_true - t + 1).clamp(min=sub)
    if lowest is None:
        return s
    return torch.where(e_true < lowest, torch.full_like(s, lowest), s)


def max_finite(t: int, emax: int, maxv: float) -> float:
    """kernels.max_finite."""
    if maxv > 0.0:
        return float(maxv)
    return 2.0 ** emax * (2.0 - 2.0 ** (1 - t))


def _beyond(R, eR, k, emax: int, maxv: float):
    """kernels._beyond (R > 0 finite)."""
    out = eR - k > emax
    if maxv > 0.0:
        Rs = R if not isinstance(k, torch.Tensor) and k == 0 else scale2(R, -k)
        out = out | (Rs > maxv)
    return out


def round_core(hi, lo, k, mode: int, t: int, p: int, emin: int, emax: int, r, lo2=None,
               maxv: float = 0.0, flags: int = 0):
    """Vectorised kernels.round_gen (k: int or int64 tensor; r: int64 bits)."""
    ok = _finite(hi) & (hi != 0)
    neg = hi < 0
    ovf = flags & 3
    flush = bool(flags & FLAG_FLUSH)
    H = torch.where(ok, hi.abs(), 1.0)
    L = torch.where(ok, torch.where(neg, -lo, lo), 0.0)
    sub = emin - p + 1
    lowest = emin if flush else None
    top = r < 0
    e = exponent(H)
    ue_s = _sexp(e - k, t, sub, lowest) + k
    deep = ue_s > 1023
    u = pow2(torch.where(deep, e, ue_s))
    A = torch.floor(H / u) * u
    L2 = 0.0 if lo2 is None else torch.where(ok, torch.where(neg, -lo2, lo2), 0.0)
    D = H - A
    s, ee = two_sum(D, L)
    ee = ee + L2
    down = (A > 0) & ((s < 0) | ((s == 0) & (ee < 0)))
    upadj = ~down & ((s > u) | ((s == u) & (ee >= 0)))
    if bool((down | upadj).any()):
        Ap = torch.where(A > 0, A, 1.0)
        ea = exponent(Ap)
        u_dn = torch.where(Ap == pow2(ea), pow2(_sexp(ea - k - 1, t, sub, lowest) + k), u)
        A_dn = A - u_dn
        A_up = A + u
        u_up = pow2(_sexp(exponent(A_up) - k, t, sub, lowest) + k)
        A = torch.where(down, A_dn, torch.where(upadj, A_up, A))
        u = torch.where(down, u_dn, torch.where(upadj, u_up, u))
        D2 = H - A
        s2, ee2 = two_sum(D2, L)
        ee2 = ee2 + L2
        adj = down | upadj
        s = torch.where(adj, s2, s)
        ee = torch.where(adj, ee2, ee)
    exact = (s == 0) & (ee == 0)
    if mode == MODE_SR:
        rnd = _lsr(r, 11).to(F64) + 1.0
        up = ~exact & (rnd <= (s / u) * 9007199254740992.0)
    elif mode == MODE_RANDOM:
        up = ~exact & top
    elif mode in (MODE_UP, MODE_DOWN):
        up = ~exact & (neg if mode == MODE_DOWN else ~neg)
    elif mode == MODE_ZERO:
        up = torch.zeros_like(exact)
    else:
        s2 = 2.0 * s
        q = A / u
        odd = (q - 2.0 * torch.floor(0.5 * q)) == 1.0
        up = (s2 > u) | ((s2 == u) & ((ee > 0) | ((ee == 0) & odd)))
        if mode == MODE_FARTHEST:
            up = up ^ ~exact
    R = torch.where(up, A + u, A)
    if mode == MODE_UD:
        nz = R != 0
        Rp = torch.where(nz, R, 1.0)
        eR = exponent(Rp)
        move = nz & ~_beyond(Rp, eR, k, emax, maxv)
        u_here = pow2(_sexp(eR - k, t, sub, lowest) + k)
        u_below = torch.where(Rp == pow2(eR), pow2(_sexp(eR - k - 1, t, sub, lowest) + k),
                              u_here)
        Rm = torch.where(top, R + u_here, R - u_below)
        R = torch.where(move, Rm, R)
        R = torch.where(~nz & ~exact & top, u, R)  # UD at zero (kernels.round_gen)
    Rp = torch.where(R != 0, R, 1.0)
    ovfl = (R != 0) & (R < INF) & _beyond(Rp, exponent(Rp), k, emax, maxv)
    if isinstance(k, torch.Tensor) or k != 0:
        R = scale2(R, -k)
    mf = max_finite(t, emax, maxv)
    if mode == MODE_ZERO:
        toward = torch.ones_like(neg)
    elif mode == MODE_DOWN:
        toward = ~neg
    elif mode == MODE_UP:
        toward = neg
    else:
        toward = torch.zeros_like(neg)
    big = INF if ovf == OVF_INF else (mf if ovf == OVF_SATURATE else float("nan"))
    R = torch.where(ovfl, torch.where(toward, torch.full_like(R, mf), torch.full_like(R, big)), R)
    if bool(deep.any()):
        if mode in (MODE_RANDOM, MODE_UD):
            dup = top
        elif mode == MODE_FARTHEST:
            dup = torch.ones_like(neg)
        elif mode == MODE_UP:
            dup = ~neg
        elif mode == MODE_DOWN:
            dup = neg
        else:
            dup = torch.zeros_like(neg)
        v = torch.where(dup, torch.full_like(R, 2.0 ** (emin if flush else sub)), 0.0)
        R = torch.where(deep, v, R)
    R = torch.where(neg, -R, R)
    special = hi
    if ovf != OVF_INF:
        inf_in = hi.abs() == INF
        rep = float("nan") if ovf == OVF_NAN else mf
        special = torch.where(inf_in, torch.where(hi < 0, torch.full_like(hi, -rep),
                                                  torch.full_like(hi, rep)), hi)
    R = torch.where(ok, R, special)
    if flags & FLAG_UNSIGNED_ZERO:
        R = torch.where(R == 0, 0.0, R)
    return R


def round_narrow(hi, lo, mode: int, t: int, p: int, emin: int, emax: int, r):
    """kernels.round_narrow. The numba version's integer fast path gives the same bits
    as round_core; here round_core is used throughout, so the backend comparison tests
    check that fast path against the general algorithm."""
    return round_core(hi, lo, 0, mode, t, p, emin, emax, r)


def _div_parts(a, b):
    q = a / b
    good = (q != 0) & _finite(q) & _finite(a) & _finite(b)
    ph, pl = two_prod(q, b)
    return q, torch.where(good, ((a - ph) - pl) / b, 0.0)


def sqrt_rn(a: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float64 square root. torch's CPU kernel is not (SLEEF u05:
    e.g. sqrt(2.0) is one ulp low), so on CPU numpy's (hardware sqrtpd) is used."""
    if a.device.type == "cpu":
        import numpy as np

        with np.errstate(invalid="ignore"):
            return torch.from_numpy(np.sqrt(a.detach().numpy()))
    return torch.sqrt(a)


def _sqrt_parts(a):
    s = sqrt_rn(a)
    good = (a > 0) & (a < INF)
    ph, pl = two_prod(s, s)
    return s, torch.where(good, ((a - ph) - pl) / (2.0 * s), 0.0)


def narrow_binary(op: int, a, b, mode, t, p, emin, emax, r):
    if op == OP_ADD:
        s, e = two_sum(a, b)
    elif op == OP_SUB:
        s, e = two_sum(a, -b)
    elif op == OP_MUL:
        s, e = a * b, torch.zeros_like(a)
    else:
        s, e = _div_parts(a, b)
    return round_narrow(s, e, mode, t, p, emin, emax, r)


def narrow_sqrt(a, mode, t, p, emin, emax, r):
    s, e = _sqrt_parts(a)
    return round_narrow(s, e, mode, t, p, emin, emax, r)


def narrow_fma(a, b, c, mode, t, p, emin, emax, r):
    s, e = two_sum(a * b, c)
    return round_narrow(s, e, mode, t, p, emin, emax, r)


#: binary64 as a format tuple (p, emin, emax, maxv, flags) of the functions below
F64_FORMAT = (53, -1022, 1023, 0.0, 0)


def _rc(hi, lo, k, mode, t, fmt, r, lo2=None):
    p, emin, emax, maxv, flags = fmt
    return round_core(hi, lo, k, mode, t, p, emin, emax, r, lo2=lo2, maxv=maxv, flags=flags)


def _special(v, mode, t, fmt, r):
    """Special results (0, inf, nan) under the format's rules (binary64: unchanged)."""
    if fmt == F64_FORMAT:
        return v
    return _rc(v, torch.zeros_like(v), 0, mode, t, fmt, r)


def _t53_residual(e, mode, t):
    """kernels._t53_residual."""
    if t == 53:
        if mode in (MODE_IEEE, MODE_UD):
            return torch.zeros_like(e)
        if mode == MODE_FARTHEST:
            return 0.25 * e
    return e


def _in(x, lo, hi):
    ax = x.abs()
    return (ax >= lo) & (ax <= hi)


def wide_binary(op: int, a, b, mode, t, r, fmt=F64_FORMAT):
    """kernels.format_binary (binary64 by default)."""
    if op in (OP_ADD, OP_SUB):
        bb = -b if op == OP_SUB else b
        s, e = two_sum(a, bb)
        ovf = ~_finite(s) & _finite(a) & _finite(bb)
        s2, e2 = two_sum(0.5 * a, 0.5 * bb)
        hi = torch.where(ovf, s2, s)
        lo = torch.where(ovf, e2, e)
        k = torch.where(ovf, -1, 0)
        res = _rc(hi, lo, k, mode, t, fmt, r)
        if mode == MODE_IEEE and t == 53 and fmt == F64_FORMAT:
            return torch.where(ovf, res, s)
        return res
    finite = _finite(a) & _finite(b) & (a != 0) & (b != 0)
    safe = _in(a, 2.0 ** -480, 2.0 ** 480) & _in(b, 2.0 ** -480, 2.0 ** 480)
    ea = exponent(torch.where(finite, a.abs(), 1.0))
    eb = exponent(torch.where(finite, b.abs(), 1.0))
    an = scale2(a, -ea)
    bn = scale2(b, -eb)
    if op == OP_MUL:
        s1, e1 = two_prod(a, b)
        s2, e2 = two_prod(an, bn)
        k = torch.where(safe, 0, -(ea + eb))
        special = a * b
    else:
        s1, e1 = _div_parts(a, b)
        s2, e2 = _div_parts(an, bn)
        k = torch.where(safe, 0, eb - ea)
        special = a / b
        e1, e2 = _t53_residual(e1, mode, t), _t53_residual(e2, mode, t)
    hi = torch.where(safe, s1, s2)
    lo = torch.where(safe, e1, e2)
    res = _rc(torch.where(finite, hi, 1.0), torch.where(finite, lo, 0.0),
              torch.where(finite, k, 0), mode, t, fmt, r)
    return torch.where(finite, res, _special(special, mode, t, fmt, r))


def wide_sqrt(a, mode, t, r, fmt=F64_FORMAT):
    """kernels.format_sqrt (binary64 by default)."""
    good = (a > 0) & (a < INF)
    ea = exponent(torch.where(good, a, 1.0))
    h = torch.div(ea, 2, rounding_mode="floor")
    s, e = _sqrt_parts(torch.where(good, scale2(a, -2 * h), 1.0))
    e = _t53_residual(e, mode, t)
    res = _rc(s, e, -h, mode, t, fmt, r)
    return torch.where(good, res, _special(sqrt_rn(a), mode, t, fmt, r))


def _fma_parts(a, b, c):
    ph, pl = two_prod(a, b)
    s1, s2 = two_sum(ph, c)
    t1, t2 = two_sum(s2, pl)
    h, h2 = two_sum(s1, t1)
    z = h == 0
    return torch.where(z, t2, h), torch.where(z, 0.0, h2), torch.where(z, 0.0, t2)


def wide_fma(a, b, c, mode, t, r, fmt=F64_FORMAT):
    """kernels.format_fma (binary64 by default)."""
    plain = a * b + c
    fin = _finite(a) & _finite(b) & _finite(c)
    zprod = fin & ((a == 0) | (b == 0)) & (c != 0)
    special = ~fin | (a == 0) | (b == 0)
    czero = ~special & (c == 0)
    mulres = wide_binary(OP_MUL, a, b, mode, t, r, fmt)
    rest = ~special & ~czero
    lo_, hi_ = 2.0 ** -300, 2.0 ** 300
    safe = _in(a, lo_, hi_) & _in(b, lo_, hi_) & _in(c, lo_, hi_)
    one = torch.ones_like(a)
    ea = exponent(torch.where(rest, a.abs(), one))
    eb = exponent(torch.where(rest, b.abs(), one))
    ec = exponent(torch.where(rest, c.abs(), one))
    pe = ea + eb
    an, bn = scale2(a, -ea), scale2(b, -eb)
    cdom = ec > pe + 110
    pdom = pe > ec + 110
    sa = torch.full_like(a, 2.0 ** -200)
    sp = torch.where((a < 0) == (b < 0), sa, -sa)
    sc = torch.where(c > 0, sa, -sa)
    m = torch.where(cdom, ec, torch.where(pdom, pe, torch.maximum(pe, ec)))
    # c dominant: (c', stand-in); otherwise the parts of an * bn' + c'
    hc, lc = two_sum(scale2(c, -ec), sp)
    bm = torch.where(pdom, bn, scale2(bn, pe - m))
    cm = torch.where(pdom, sc, scale2(c, -m))
    hm, lm, mm = _fma_parts(an, bm, cm)
    h2 = torch.where(cdom, hc, hm)
    l2 = torch.where(cdom, lc, lm)
    m2 = torch.where(cdom, 0.0, mm)
    h1, l1, m1 = _fma_parts(a, b, c)
    h = torch.where(safe, h1, h2)
    l = torch.where(safe, l1, l2)
    ll = torch.where(safe, m1, m2)
    k = torch.where(safe, 0, -m)
    use = rest & (h != 0)
    res = _rc(torch.where(use, h, 1.0), torch.where(use, l, 0.0),
              torch.where(use, k, 0), mode, t, fmt, r, lo2=torch.where(use, ll, 0.0))
    cres = _rc(torch.where(zprod, c, 1.0), torch.zeros_like(c), 0, mode, t, fmt, r)
    return torch.where(use, res, torch.where(czero, mulres, torch.where(
        zprod, cres, _special(plain, mode, t, fmt, r))))


def round_values(hi, lo, mode, t, p, emin, emax, r, maxv: float = 0.0, flags: int = 0):
    """k_round's (and k_format's rounding kinds') elementwise body (lo may be None)."""
    if lo is None:
        lo = torch.zeros_like(hi)
    else:
        s, e = two_sum(hi, lo)
        nz = lo != 0  # lo == 0 keeps hi as is (its sign of zero)
        hi, lo = torch.where(nz, s, hi), torch.where(nz, e, lo)
    return round_core(hi, lo, 0, mode, t, p, emin, emax, r, maxv=maxv, flags=flags)
