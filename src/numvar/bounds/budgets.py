"""A-priori rounding-error budgets of single layers (scalar formulas).

The model of arithmetic (as in the Lean 4 formalisation these budgets come from, and
Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2):

- every rounded operation satisfies ``|fl(x) - x| <= u*|x|`` (no underflow, no overflow);
  fp32 ``u = 2^-24``, bf16 ``u = 2^-8``, fp64 ``u = 2^-53``;
- a dot product is a sequential fold from 0 in which every product and every addition
  is rounded (the budgets also hold for any other summation order: every term passes
  through at most as many roundings);
- symbols are entrywise (infinity-norm) bounds: ``w >= |kernel entries|``,
  ``beta >= |bias|``, ``A >= |exact input|``, ``E >= |inherited input error|``,
  ``n`` (or ``m``) = fan-in (``in_channels/groups * kH * kW`` for a convolution).

Every budget is affine in ``E``: ``budget(A, E) = gain * E + offset(A)``; that is how
errors thread through a network (:class:`AffineError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8
U_FP64 = 2.0 ** -53

# Roundings along any path of inference-mode batch norm (see batchnorm_budget).
BATCHNORM_ROUNDINGS = 7


@dataclass(frozen=True)
class Precision:
    """How a network is evaluated.

    ``uacc``: unit roundoff of accumulation and of every op other than conv/dense;
    ``uleaf``: unit roundoff of the operands and of the stored conv/dense result
    (``None``: not mixed, conv/dense run entirely at ``uacc``).
    """

    name: str
    uacc: float
    uleaf: float | None = None

    @property
    def mixed(self) -> bool:
        return self.uleaf is not None


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", U_FP32),
    "bf16-mixed": Precision("bf16-mixed", U_FP32, U_BF16),
    "fp64": Precision("fp64", U_FP64),
}


def get_precision(precision: str | Precision) -> Precision:
    """``"fp32"``, ``"bf16-mixed"`` or ``"fp64"`` (or a :class:`Precision`)."""
    from ..errors import ConfigError

    if isinstance(precision, Precision):
        return precision
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ConfigError(f"precision {precision!r}: expected one of {sorted(PRECISIONS)}") \
            from None


def growth(u: float, k: int) -> float:
    """``(1+u)^k - 1``: the relative error of a product of k factors ``(1+δ)``, |δ| <= u.

    Evaluated as ``expm1(k*log1p(u))`` (relative accuracy a few float64 ulps).
    """
    return math.expm1(k * math.log1p(u))


def gamma(u: float, k: int) -> float:
    """Higham's ``γ_k = k*u / (1 - k*u)``: bounds products of k factors ``(1+δ)^{±1}``
    (Higham, Lemma 3.1); needed where a rounded quantity divides (batch norm's 1/sqrt)."""
    if k * u >= 1:
        raise ValueError(f"gamma: k*u = {k * u} >= 1")
    return k * u / (1.0 - k * u)


def br(uacc: float, uleaf: float, n: int) -> float:
    """Relative error of a mixed-precision dot product of length n.

    Operands rounded to the leaf format (``uleaf``), products and the fold from 0 in
    the accumulation format (``uacc``)::

        br = ((1+uacc)^(n+1) - 1)·(1+uleaf)^2 + (2·uleaf + uleaf^2)

    i.e. ``(1+uleaf)^2 (1+uacc)^(n+1) - 1``: each term ``w·x`` picks up two leaf
    roundings, one product rounding and at most n fold additions.
    """
    return growth(uacc, n + 1) * (1.0 + uleaf) ** 2 + (2.0 * uleaf + uleaf * uleaf)


# ------------------------------------------------------------------ fp32 (single-format) layer
def layer_budget(m: int, w: float, A: float, E: float, beta: float = 0.0,
                 u: float = U_FP32) -> float:
    """Error of one conv or dense layer computed in one format (fan-in m)::

        layerBudget = ((1+u)^(m+2) - 1)·(m·w·(A+E) + β) + m·w·E

    m products, m fold additions from 0 and the bias addition: at most m+2 roundings
    per term (applied to the computed input, |x̂| <= A+E); plus the exact propagation
    m·w·E of the inherited error.
    """
    g = growth(u, m + 2)
    return g * (m * w * (A + E) + beta) + m * w * E


def layer_gain(m: int, w: float, u: float = U_FP32) -> float:
    """Coefficient of E in :func:`layer_budget`: ``m·w·(1+u)^(m+2)``."""
    return m * w * (1.0 + growth(u, m + 2))


def layer_offset(m: int, w: float, A: float, beta: float = 0.0, u: float = U_FP32) -> float:
    """:func:`layer_budget` at E = 0: ``((1+u)^(m+2) - 1)·(m·w·A + β)``."""
    return growth(u, m + 2) * (m * w * A + beta)


def layer_magnitude(m: int, w: float, A: float, beta: float = 0.0, u: float = U_FP32) -> float:
    """Output magnitude bound ``m·w·A + β + budget(E=0)`` (the formalisation's choice;
    it bounds both the exact output and the output computed from exact inputs)."""
    return m * w * A + beta + layer_offset(m, w, A, beta, u)


# ------------------------------------------------------------------ mixed-precision layer
def mixed_budget(n: int, w: float, A: float, E: float, beta: float = 0.0,
                 uacc: float = U_FP32, uleaf: float = U_BF16) -> float:
    """Error of a mixed-precision conv/dense layer: bf16 operands, fp32 accumulation,
    bf16 store of the fp32 accumulator, fp32 bias add. With ``P = n·w·(A+E)``::

        budget = uacc·[(1+uleaf)(1+br)·P + β] + uleaf·(1+br)·P + br·P + n·w·E

    (dot product error br·P, so |s| <= (1+br)·P; bf16 store uleaf·|s|; bias add
    uacc·|bf16(s) + b|; inherited error n·w·E.)
    """
    b = br(uacc, uleaf, n)
    P = n * w * (A + E)
    return uacc * ((1 + uleaf) * (1 + b) * P + beta) + uleaf * (1 + b) * P + b * P + n * w * E


def mixed_gain(n: int, w: float, uacc: float = U_FP32, uleaf: float = U_BF16) -> float:
    """Coefficient of E in :func:`mixed_budget`:
    ``n·w·(1 + br + uleaf(1+br) + uacc(1+uleaf)(1+br))``."""
    b = br(uacc, uleaf, n)
    return n * w * (1 + b + uleaf * (1 + b) + uacc * (1 + uleaf) * (1 + b))


def mixed_offset(n: int, w: float, A: float, beta: float = 0.0,
                 uacc: float = U_FP32, uleaf: float = U_BF16) -> float:
    """:func:`mixed_budget` at E = 0."""
    return mixed_budget(n, w, A, 0.0, beta, uacc, uleaf)


def mixed_magnitude(n: int, w: float, A: float, beta: float = 0.0,
                    uacc: float = U_FP32, uleaf: float = U_BF16) -> float:
    """Output magnitude bound ``n·w·A + β + budget(E=0)``."""
    return n * w * A + beta + mixed_offset(n, w, A, beta, uacc, uleaf)


# ------------------------------------------------------------------ dispatch on precision
def affine_layer_gain(n: int, w: float, precision: str | Precision) -> float:
    """Gain (coefficient of E) of a conv/dense layer at ``precision``."""
    p = get_precision(precision)
    if p.mixed:
        return mixed_gain(n, w, p.uacc, p.uleaf)
    return layer_gain(n, w, p.uacc)


def affine_layer_offset(n: int, w: float, A: float, beta: float,
                        precision: str | Precision) -> float:
    """Budget at E = 0 of a conv/dense layer at ``precision``."""
    p = get_precision(precision)
    if p.mixed:
        return mixed_offset(n, w, A, beta, p.uacc, p.uleaf)
    return layer_offset(n, w, A, beta, p.uacc)


def gain_epsilon(n: int, precision: str | Precision) -> float:
    """The formalisation's "gain ε": the relative excess of a layer's gain over the exact
    amplification n·w, i.e. ``gain/(n·w) - 1`` (independent of w).

    fp32: ``(1+u)^(n+2) - 1`` (n = 4608: 2.75e-4); bf16-mixed:
    ``br + uleaf(1+br) + uacc(1+uleaf)(1+br)`` (n = 4608: 1.2043e-2).
    """
    p = get_precision(precision)
    if p.mixed:
        b = br(p.uacc, p.uleaf, n)
        return b + p.uleaf * (1 + b) + p.uacc * (1 + p.uleaf) * (1 + b)
    return growth(p.uacc, n + 2)


# ------------------------------------------------------------------ other layers
def relu_budget(A: float, E: float) -> tuple[float, float]:
    """ReLU (and max-pool, clamp): 1-Lipschitz and exact, so ``(A, E)`` pass unchanged."""
    return A, E


def residual_add_budget(Ax: float, Ex: float, Ay: float, Ey: float,
                        u: float = U_FP32) -> float:
    """``x + y`` with inherited errors: ``u(|x|+e_x+|y|+e_y) + e_x + e_y``."""
    return u * (Ax + Ex + Ay + Ey) + Ex + Ey


def avgpool_budget(k: int, A: float, E: float, scale: float = 1.0,
                   u: float = U_FP32) -> float:
    """Average pool over windows of at most k elements::

        budget = ((1+u)^(k+2) - 1)·s·(A+E) + s·E

    s = max over outputs of (elements in the window)/(divisor) (1 without padding or
    divisor override). k fold additions, one reciprocal and one product (or one
    division) per term: an average pool is a depthwise conv with weights 1/divisor.
    """
    return growth(u, k + 2) * scale * (A + E) + scale * E


def batchnorm_budget(a: float, mu_a: float, beta: float, A: float, E: float,
                     u: float = U_FP32) -> float:
    """Inference-mode batch norm of one channel, the affine map ``y = a·x + c`` with
    ``a = γ/sqrt(var+eps)``, ``c = β - μ·a`` (frozen statistics folded)::

        budget = γ_7·(|a|(A+E) + |μ·a| + |β|) + |a|·E,     γ_7 = 7u/(1 - 7u)

    (Scalars, or tensors of channels/elements, evaluated elementwise.)

    Derivation (Higham, Lemma 3.1: a product of k factors ``(1+δ_i)^{±1}`` is
    ``1 + θ_k``, ``|θ_k| <= γ_k``). PyTorch's CPU kernel folds
    ``α = γ·(1/sqrt(var + fl(eps)))``, ``c' = β - μ·α``, ``y = x·α + c'``:

    - ``fl(var + fl(eps)) = (var+eps)(1+δ₀)(1+δ₁)``: the cast of eps to the format and
      the addition (var >= 0, so the cast's error is relative to var+eps); under the
      square root ``sqrt((1+δ₀)(1+δ₁)) ∈ [1-u, 1+u]`` is one factor; the sqrt, the
      reciprocal and the product with γ are three more: ``α = a(1+θ₄)``.
    - path of x: ``α``, ``x·α``, the final addition: 6 factors; path of μ: ``α``,
      ``μ·α``, ``β - μ·α``, the final addition: 7; path of β: 2.

    The unfolded order ``((x-μ)·invstd)·γ + β`` costs x and μ 1 + 3 + 1 + 1 + 1 = 7
    factors and β one. Hence γ_7 on each term's magnitude (taken at the computed input,
    ``|x̂| <= A+E``), plus the exact propagation ``|a|·E`` of the inherited error. The
    terms μ·a and β are bounded separately, not through ``|c|``: c may cancel while
    their rounding errors do not.
    """
    g = gamma(u, BATCHNORM_ROUNDINGS)
    return g * (abs(a) * (A + E) + abs(mu_a) + abs(beta)) + abs(a) * E


# ------------------------------------------------------------------ composition
@dataclass(frozen=True)
class AffineError:
    """An error map ``E -> gain·E + offset`` (all layer budgets are of this form)."""

    gain: float
    offset: float

    def __call__(self, E: float) -> float:
        return self.gain * E + self.offset

    def then(self, outer: "AffineError") -> "AffineError":
        """``outer ∘ self``: apply self first, then outer."""
        return AffineError(outer.gain * self.gain, outer.gain * self.offset + outer.offset)


def identical_layers(gain: float, offset: float, d: int, E0: float = 0.0) -> float:
    """Error after d identical layers ``E -> gain·E + offset`` from input error E0::

        gain^d·E0 + offset·(gain^d - 1)/(gain - 1)      (offset·d + E0 when gain = 1)
    """
    if d < 0:
        raise ValueError("d must be >= 0")
    if gain == 1.0:
        return E0 + offset * d
    if gain < 0.0:
        raise ValueError("gain must be >= 0")
    # gain^d - 1 as expm1(d·log1p(gain - 1)): no cancellation when gain is close to 1
    gd1 = math.expm1(d * math.log1p(gain - 1.0)) if gain > 0.0 else (-1.0 if d else 0.0)
    return (gd1 + 1.0) * E0 + offset * gd1 / (gain - 1.0)
