"""fuzzy(format=..., accumulate=...) and the new rounding modes in the instrumentation.

* accumulate="native" (default): a bf16 CNN under ieee at flop granularity matches
  native bf16 within a tolerance derived below, far closer than accumulate="same";
* the slow references follow the policy bit for bit (contraction in binary32, one
  rounding to the format; or every product and add rounded to the format);
* the any-format contraction and scan kernels equal their Fraction references; the
  binary32 kernels route up/down/zero/farthest to their scalar path, equal to the
  references;
* tensors keep their dtype, values lie on the format's grid; bad options raise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numvar
import numvar.rounding as R
from numvar.errors import ConfigError, FormatError
from numvar.instrument import FuzzyConfig
from numvar.instrument import kernels as KN
from numvar.rounding.formats import NAMED, Format
from numvar.rounding.kernels import MODE_FARTHEST, MODE_SR, MODE_UD, MODE_UP, mode_code
from numvar.rounding.reference import ref_op

E4M3 = NAMED["e4m3fn"]
CUSTOM = Format.custom(7, 5)


def _eq(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.array_equal(np.nan_to_num(a, nan=7.0),
                                                      np.nan_to_num(b, nan=7.0)))


def _ulp_bf16(v: torch.Tensor) -> torch.Tensor:
    """bfloat16 spacing at |v| (float64): 2**(floor(log2|v|) - 7), at least 2**-133."""
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -126)))
    return torch.pow(2.0, e - 7)


@torch.no_grad()
def test_native_accumulation_bf16_cnn_matches_native_bf16():
    """conv (no bias) -> relu -> linear (no bias) in bfloat16. Native bf16 and numvar's
    ieee at flop granularity (accumulate="native") both form each output as a binary32
    sum of exact products rounded once to bfloat16; they differ by summation order.

    Tolerance (derived, elementwise): for the conv output h with K terms, the two binary32
    sums differ by at most d_h = 2·K·2**-24·Σ|w||x| (each within K·u32 of the exact sum),
    so the bfloat16 results differ by at most d_h + ulp(h) (adjacent values when the sums
    straddle a rounding boundary). relu is 1-Lipschitz. For the linear output y with K'
    terms: |Δy| <= |W|·(d_h + ulp(h)) (propagated) + 2·K'·2**-24·|W|·|h| + ulp(y). The
    check takes that bound with ulps measured at 2|h|, 2|y| (a factor 2 margin for the
    binade). accumulate="same" (every partial sum in bfloat16) must be at least 4x
    further from native than the default (measured ~10x on a ResNet)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, bias=False).to(torch.bfloat16)
    lin = torch.nn.Linear(16 * 6 * 6, 10, bias=False).to(torch.bfloat16)
    x = torch.randn(8, 3, 8, 8).to(torch.bfloat16)

    def net(v):
        return lin(torch.relu(conv(v)).flatten(1))

    nat = net(x).double()
    with numvar.fuzzy(mode="ieee"):
        ours = net(x).double()
    with numvar.fuzzy(mode="ieee", accumulate="same"):
        same = net(x).double()
    assert ours.dtype == torch.float64 and net(x).dtype == torch.bfloat16
    h = conv(x).double()
    k1 = 3 * 9
    absw1 = conv.weight.double().abs()
    mag_h = torch.nn.functional.conv2d(x.double().abs(), absw1)
    d_h = 2 * k1 * 2.0 ** -24 * mag_h + _ulp_bf16(2 * h)
    absw2 = lin.weight.double().abs()
    k2 = absw2.shape[1]
    rh = torch.relu(h).flatten(1)
    tol = (d_h.flatten(1) @ absw2.T + 2 * k2 * 2.0 ** -24 * (rh @ absw2.T)
           + _ulp_bf16(2 * nat))
    err = (ours - nat).abs()
    assert bool((err <= tol).all()), float((err - tol).max())
    assert float((same - nat).abs().max()) >= 4 * float(err.max())


def _ref_round(values: np.ndarray, fmt, key: int, mode: int) -> np.ndarray:
    """The Fraction reference of rounding each value once (element j: bits(key, j))."""
    t = fmt.precision
    return np.array([ref_op("round", (float(v),), fmt, t, mode, key, j, float(v))
                     for j, v in enumerate(values.reshape(-1))]).reshape(values.shape)


@pytest.mark.parametrize("mode", ["sr", "up"])
def test_policies_follow_their_slow_references_bit_for_bit(mode):
    """torch.mm under fuzzy, flop granularity, against the references:
    * float32 tensors, format=e4m3fn, native: contract_reference in binary32 at 24 bits
      (first stream key), then each output rounded once to e4m3fn by the Fraction
      reference (second key); the result stays float32;
    * the same with accumulate="same": contract_reference with every product and add
      rounded to e4m3fn (one key);
    * bfloat16 tensors, native: binary32 contraction, then one rounding to bfloat16;
      accumulate="same": today's binary32 kernel at 8 bits, cast to bfloat16."""
    rng = np.random.default_rng(0)
    a = torch.tensor(rng.standard_normal((3, 5)), dtype=torch.float32)
    b = torch.tensor(rng.standard_normal((5, 4)), dtype=torch.float32)
    m = mode_code(mode)
    seed = 7
    with numvar.fuzzy(mode=mode, format="e4m3fn", seed=seed):
        got = torch.mm(a, b)
    assert got.dtype == torch.float32
    s = R.Stream(seed)
    acc = KN.contract_reference(a.numpy()[None], b.numpy()[None], s.next_key(), m, 24)[0]
    ref = _ref_round(acc.astype(np.float64), E4M3, s.next_key(), m)
    assert _eq(got.numpy(), ref)
    assert torch.equal(got.to(torch.float8_e4m3fn).float().nan_to_num(7.0), got.nan_to_num(7.0))

    with numvar.fuzzy(mode=mode, format="e4m3fn", accumulate="same", seed=seed):
        got = torch.mm(a, b)
    s = R.Stream(seed)
    ref = KN.contract_reference(a.numpy()[None], b.numpy()[None], s.next_key(), m, 4,
                                spec=E4M3.spec())[0]
    assert _eq(got.numpy(), ref)

    ab, bb = a.bfloat16(), b.bfloat16()
    with numvar.fuzzy(mode=mode, seed=seed):
        got = torch.mm(ab, bb)
    assert got.dtype == torch.bfloat16
    s = R.Stream(seed)
    acc = KN.contract_reference(ab.float().numpy()[None], bb.float().numpy()[None],
                                s.next_key(), m, 24)[0]
    ref = _ref_round(acc.astype(np.float64), NAMED["bfloat16"], s.next_key(), m)
    assert _eq(got.double().numpy(), ref)
    with numvar.fuzzy(mode=mode, seed=seed, accumulate="same"):
        got = torch.mm(ab, bb)
    s = R.Stream(seed)
    ref = KN.contract_reference(ab.float().numpy()[None], bb.float().numpy()[None],
                                s.next_key(), m, 8)[0]
    assert _eq(got.double().numpy(), torch.from_numpy(ref).bfloat16().double().numpy())


@pytest.mark.parametrize("fmt", [E4M3, CUSTOM, Format(3, -14, 15, overflow="saturate")],
                         ids=["e4m3fn", "custom", "saturate"])
def test_any_format_kernels_equal_fraction_references(fmt):
    """contract_format and scan_format (every product/add rounded to the format) equal the
    exact references bit for bit, for sr, ud, up and farthest, with values that overflow
    the format (x 40) and underflow it (x 2**-12)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 4)) * 40
    b = rng.standard_normal((1, 4, 3)) * 2.0 ** -3
    x = rng.standard_normal((5, 4)) * 2.0 ** rng.integers(-12, 8, (5, 4))
    for m in (MODE_SR, MODE_UD, MODE_UP, MODE_FARTHEST):
        got = KN.contract_format(a, b, 99, m, fmt.precision, fmt.spec())
        ref = KN.contract_reference(a, b, 99, m, fmt.precision, spec=fmt.spec())
        assert _eq(got, ref), m
        for cum in (False, True):
            got = KN.scan_format(x, 5, m, fmt.precision, fmt.spec(), cumulative=cum)
            ref = KN.scan_reference(x, 5, m, fmt.precision, cumulative=cum, spec=fmt.spec())
            assert _eq(got, ref), (m, cum)


@pytest.mark.parametrize("mode", ["up", "down", "zero", "farthest"])
def test_binary32_kernels_take_new_modes_on_their_scalar_path(mode):
    """contract and scan on float32 with a directed mode (or farthest) equal the slow
    references at 24 and 8 bits; the pointwise short paths (add, row sums) equal
    numvar.rounding's results for the same key."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, 3, 17)).astype(np.float32)
    b = rng.standard_normal((1, 17, 5)).astype(np.float32)
    m = mode_code(mode)
    for t in (24, 8):
        assert _eq(KN.contract(a, b, 3, m, t), KN.contract_reference(a, b, 3, m, t))
        x = rng.standard_normal((9, 4)).astype(np.float32)
        assert _eq(KN.scan(x, 3, m, t), KN.scan_reference(x, 3, m, t))
    u = torch.tensor(rng.standard_normal(300), dtype=torch.float32)
    v = torch.tensor(rng.standard_normal(300), dtype=torch.float32)
    with numvar.fuzzy(mode=mode, seed=4):
        s1 = u + v
        s2 = torch.sqrt(u.abs())
        s3 = u.reshape(20, 15).sum(1)
    st = R.Stream(4)
    assert torch.equal(s1, R.add(u, v, mode=mode, stream=st))
    assert torch.equal(s2, R.sqrt(u.abs(), mode=mode, stream=st))
    x2 = u.reshape(20, 15).T.contiguous().numpy()
    assert _eq(s3.numpy(), KN.scan_reference(x2, st.next_key(), m, 24)[0])


@torch.no_grad()
def test_fuzzy_format_keeps_dtype_and_rounds_every_result_to_the_format():
    """Op and flop granularity with format=e5m2 / custom on a float32 model: outputs stay
    float32, every value lies on the format's grid (a second rounding to the format under
    ieee leaves it unchanged); with mode="ieee" at op granularity an elementwise product
    equals the exact product rounded once to nearest in the format."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    x = torch.randn(4, 6)
    for fmt in ("e5m2", CUSTOM):
        for gran in ("op", "flop"):
            with numvar.fuzzy(mode="sr", format=fmt, granularity=gran, seed=1):
                y = net(x)
            assert y.dtype == torch.float32
            again = R.round(y.double(), format=fmt, dtype=torch.float64, mode="ieee",
                            stream=R.Stream(0))
            assert torch.equal(again, y.double())
    w = torch.randn(50)
    with numvar.fuzzy(mode="ieee", format="e4m3fn", granularity="op"):
        p = x.reshape(-1)[:24] * w[:24]
    exact = x.reshape(-1)[:24].double() * w[:24].double()
    ref = [ref_op("round", (float(v),), E4M3, 4, 0, 0, 0, float(v)) for v in exact]
    assert _eq(p.numpy(), ref)
    # precision with a format: that format's range at `precision` bits (virtual precision)
    with numvar.fuzzy(mode="ieee", format=CUSTOM, precision=4, granularity="op"):
        p = x.reshape(-1)[:24] * w[:24]
    ref = [ref_op("round", (float(v),), CUSTOM, 4, 0, 0, 0, float(v)) for v in exact]
    assert _eq(p.numpy(), ref)


def test_format_options_and_bad_input():
    """FuzzyConfig/env/CLI plumbing of format and accumulate; clear errors for a format a
    tensor dtype cannot hold, an unknown format, a bad policy, a precision above the
    format's."""
    c = FuzzyConfig(mode="farthest", format="e4m3fn", accumulate="same", precision=3)
    env = c.to_env()
    assert env["NUMVAR_FORMAT"] == "e4m3fn" and env["NUMVAR_ACCUMULATE"] == "same"
    back = FuzzyConfig.from_env(env)
    assert back.format == E4M3 and back.accumulate == "same" and back.mode == "farthest"
    assert FuzzyConfig.from_env({"NUMVAR_MODE": "up", "NUMVAR_FORMAT": CUSTOM.token}).format \
        == CUSTOM
    with pytest.raises(ConfigError):
        FuzzyConfig(accumulate="fp32")
    with pytest.raises(ConfigError):
        FuzzyConfig.from_env({"NUMVAR_MODE": "sr", "NUMVAR_ACCUMULATE": "x"})
    with pytest.raises(FormatError):
        FuzzyConfig(format="fp7")
    with pytest.raises(ConfigError):
        FuzzyConfig(format="e5m2", precision=4)
    with pytest.raises(FormatError, match="does not fit"):
        with numvar.fuzzy(format="binary32"):
            torch.ones(3, dtype=torch.bfloat16) * 3
    from numvar.runner.script import _canonical_command, fuzzy_env

    cfg = {"mode": "up", "granularity": "flop", "precision": None, "format": "e5m2",
           "accumulate": "same", "exclude": [], "include": [], "modules": []}
    env = fuzzy_env(cfg, 3)
    assert env["NUMVAR_FORMAT"] == "e5m2" and env["NUMVAR_ACCUMULATE"] == "same"
    cmd = _canonical_command({**cfg, "n": 2, "seed": 0, "jobs": 1, "capture": [],
                              "capture_layers": [], "files": [], "executor": "local"},
                             "out", ["python", "x.py"])
    assert cmd[cmd.index("--format") + 1] == "e5m2" and "--accumulate" in cmd
