"""Bounds composed through a network, set against the measured error.

The model is traced with ``torch.fx`` and walked node by node. Every tensor value
carries, side by side:

- ``fp``: the value computed at the analysed precision (fp32; bf16-mixed emulated by
  rounding conv/dense operands and the stored conv/dense result to bf16, bias added in
  fp32; every other op in fp32);
- ``ref``: the same value computed in float64 from the same (fp32) parameters;
- ``A``, ``E``: the a-priori magnitude bound of the exact value and error bound
  (scalars, :mod:`numvar.bounds.budgets`), ``G``: dE/dE0, the network's gain so far;
- ``dd``: the data-dependent error bound, per element: the same formulas with the actual
  ``Σ|w|·|x̂|`` of the computed input ``x̂`` at every output element in place of
  ``n·w·(A+E)`` (``|x̂| <= |x| + E``) and the per-element inherited bound in place of E.
  It is never looser than the a-priori bound and is usually orders of magnitude tighter.

The measured error of a layer is ``max |fp - ref|`` over its output elements. Op
handlers are registered in tables, one small function per op family; anything else is
refused with a :class:`~numvar.errors.BoundsError` that names it.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import BoundsError
from .budgets import (
    BATCHNORM_ROUNDINGS,
    Precision,
    affine_layer_gain,
    affine_layer_offset,
    avgpool_budget,
    batchnorm_budget,
    br,
    gamma,
    get_precision,
    growth,
    residual_add_budget,
)

log = logging.getLogger(__name__)


@dataclass
class Tracked:
    """A tensor value flowing through the analysed graph (see the module docstring)."""

    fp: torch.Tensor
    ref: torch.Tensor
    dd: torch.Tensor
    A: float
    E: float
    G: float


@dataclass
class LayerBound:
    """One row of the per-layer table. Bounds are maxima over the output elements."""

    index: int
    name: str
    kind: str
    fan_in: int | None
    w: float | None
    A: float                   # a-priori magnitude bound of the layer's input
    apriori: float             # a-priori error bound of the layer's output
    data_dependent: float      # max over elements of the data-dependent bound
    measured: float            # max |fp - float64|
    gain: float | None = None  # coefficient of the inherited error E
    sr_std: float | None = None
    shape: tuple[int, ...] | None = None   # shape of the layer's output
    module: bool = False       # a submodule call (name = its named_modules() path)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in (
            "index", "name", "kind", "fan_in", "w", "A", "gain", "apriori",
            "data_dependent", "measured", "sr_std")}
        d = {k: _json_num(v) for k, v in d.items()}
        d["shape"] = list(self.shape) if self.shape is not None else None
        return d


def _json_num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return math.inf if a > 0 else math.nan


@dataclass
class NetworkBounds:
    """Result of :func:`network_bounds`."""

    precision: str
    input_shape: tuple[int, ...]
    input_bound: float
    input_error: float
    layers: list[LayerBound]
    output_apriori: float
    output_data_dependent: float
    output_measured: float
    network_gain: float
    output_sr_std: float | None = None
    output_shape: tuple[int, ...] | None = None   # when the model returns one tensor
    tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def ratio_apriori(self) -> float:
        """Final a-priori bound / measured error."""
        return _ratio(self.output_apriori, self.output_measured)

    @property
    def ratio_data_dependent(self) -> float:
        """Final data-dependent bound / measured error."""
        return _ratio(self.output_data_dependent, self.output_measured)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``precision``, ``input_shape``, ``input_bound``, ``input_error``,
        ``network_gain``, ``layers`` (rows of :meth:`LayerBound.to_dict`), ``final``."""
        return {
            "precision": self.precision,
            "input_shape": list(self.input_shape),
            "input_bound": self.input_bound,
            "input_error": self.input_error,
            "network_gain": _json_num(self.network_gain),
            "layers": [r.to_dict() for r in self.layers],
            "final": {k: _json_num(v) for k, v in {
                "apriori": self.output_apriori,
                "data_dependent": self.output_data_dependent,
                "measured": self.output_measured,
                "sr_std": self.output_sr_std,
                "ratio_apriori": self.ratio_apriori,
                "ratio_data_dependent": self.ratio_data_dependent,
            }.items()},
        }

    def plot(self, path) -> None:
        """Write the log10 curves against depth to a PNG (see :mod:`.plot`)."""
        from .plot import plot_bounds

        plot_bounds(self, path)


# ---------------------------------------------------------------------- helpers
def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16 (round to nearest even) and back to float32 (exact)."""
    return t.to(torch.bfloat16).to(torch.float32)


def _maxf(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


class _Ctx:
    def __init__(self, precision: Precision, keep: bool) -> None:
        self.p = precision
        self.keep = keep
        self.dtype = torch.float64 if precision.name == "fp64" else torch.float32
        self.rows: list[LayerBound] = []

    def row(self, name: str, kind: str, x: Tracked, out: Tracked, *, fan_in=None, w=None,
            gain=None) -> None:
        measured = _maxf((out.fp.double() - out.ref).abs())
        r = LayerBound(index=len(self.rows) + 1, name=name, kind=kind, fan_in=fan_in, w=w,
                       A=x.A, apriori=out.E, data_dependent=_maxf(out.dd), measured=measured,
                       gain=gain, shape=tuple(out.fp.shape))
        if self.keep:
            r.tensors = {"fp": out.fp, "ref": out.ref, "dd": out.dd}
        self.rows.append(r)


# ---------------------------------------------------------------------- conv / dense
def _affine(ctx: _Ctx, name: str, kind: str, x: Tracked,
            lin: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
            weight: torch.Tensor, bias: torch.Tensor | None, bias_shape: Callable) -> Tracked:
    """A conv or dense layer; ``lin(input, weight, bias)`` is the layer's linear map."""
    p = ctx.p
    W = weight.detach()
    b = bias.detach() if bias is not None else None
    n = W[0].numel()
    w = float(W.abs().max()) if W.numel() else 0.0
    beta = float(b.abs().max()) if b is not None and b.numel() else 0.0
    # computed value
    if p.mixed:
        s = lin(_bf16(x.fp), _bf16(W.float()), None)
        s = _bf16(s)
        fp = s + b.float().view(bias_shape(s)) if b is not None else s
    else:
        fp = lin(x.fp, W.to(ctx.dtype), b.to(ctx.dtype) if b is not None else None)
    ref = lin(x.ref, W.double(), b.double() if b is not None else None)
    # data-dependent bound
    Wabs = W.double().abs()
    S = lin(x.fp.double().abs(), Wabs, None)         # Σ|w|·|x̂| per output element
    prop = lin(x.dd, Wabs, None)                     # Σ|w|·E_i
    babs = b.double().abs().view(bias_shape(S)) if b is not None else 0.0
    if p.mixed:
        r = br(p.uacc, p.uleaf, n)
        dd = (p.uacc * ((1 + p.uleaf) * (1 + r) * S + babs) + p.uleaf * (1 + r) * S + r * S
              + prop)
    else:
        dd = growth(p.uacc, n + 2) * (S + babs) + prop
    # a-priori
    gain = affine_layer_gain(n, w, p)
    offset = affine_layer_offset(n, w, x.A, beta, p)
    out = Tracked(fp=fp, ref=ref, dd=dd, A=n * w * x.A + beta + offset,
                  E=gain * x.E + offset, G=gain * x.G)
    ctx.row(name, kind, x, out, fan_in=n, w=w, gain=gain)
    return out


def _conv(ctx: _Ctx, name: str, mod: nn.Module, x: Tracked) -> Tracked:
    def lin(t, W, b):
        return mod._conv_forward(t, W, b)

    nd = mod.weight.dim() - 2

    def bias_shape(t):  # (N, C, *spatial) or unbatched (C, *spatial)
        if t.dim() == nd + 2:
            return (1, -1) + (1,) * nd
        return (-1,) + (1,) * nd

    kind = type(mod).__name__.lower()
    return _affine(ctx, name, kind, x, lin, mod.weight, mod.bias, bias_shape)


def _linear(ctx: _Ctx, name: str, mod: nn.Module, x: Tracked) -> Tracked:
    return _affine(ctx, name, "linear", x, F.linear, mod.weight, mod.bias, lambda t: (-1,))


# ---------------------------------------------------------------------- exact, 1-Lipschitz
def _relu_like(ctx: _Ctx, name: str, fn: Callable, x: Tracked, kind: str = "relu") -> Tracked:
    """ReLU, ReLU6, Hardtanh (clamp): exact and 1-Lipschitz, error and magnitude pass."""
    out = Tracked(fp=fn(x.fp), ref=fn(x.ref), dd=x.dd, A=x.A, E=x.E, G=x.G)
    ctx.row(name, kind, x, out, gain=1.0)
    return out


def _maxpool(ctx: _Ctx, name: str, mod: nn.Module, x: Tracked) -> Tracked:
    """Max pool: exact; the error of a max is at most the largest error in its window."""
    if getattr(mod, "return_indices", False):
        raise BoundsError(f"layer {name!r} ({type(mod).__name__}): return_indices=True is "
                          "not supported")
    out = Tracked(fp=mod(x.fp), ref=mod(x.ref), dd=mod(x.dd), A=x.A, E=x.E, G=x.G)
    ctx.row(name, "maxpool", x, out, gain=1.0)
    return out


# ---------------------------------------------------------------------- average pool
def _adaptive_window(size_in: int, size_out: int) -> int:
    return max(math.ceil((i + 1) * size_in / size_out) - (i * size_in) // size_out
               for i in range(size_out))


def _avgpool(ctx: _Ctx, name: str, mod: nn.Module, x: Tracked) -> Tracked:
    """Average pool (fixed or adaptive): budget ``((1+u)^(k+2)-1)·s·(A+E) + s·E``."""
    u = ctx.p.uacc
    nd = {nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3, nn.AdaptiveAvgPool1d: 1,
          nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3}[type(mod)]
    spatial = x.fp.shape[-nd:]
    if isinstance(mod, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
        osz = mod.output_size
        osz = (osz,) * nd if isinstance(osz, int) or osz is None else tuple(osz)
        k = 1
        for L, O in zip(spatial, osz):
            k *= _adaptive_window(L, O if O is not None else L)
    else:
        ks = mod.kernel_size
        ks = (ks,) * nd if isinstance(ks, int) else tuple(ks)
        k = math.prod(ks)
    ones = torch.ones((1, 1) + tuple(spatial), dtype=torch.float64)
    s = _maxf(mod(ones))                     # max (elements in window)/divisor
    # per element: the budget at the computed input's window mean of |x̂| (s folded in)
    dd = avgpool_budget(k, mod(x.fp.double().abs()), 0.0, 1.0, u) + mod(x.dd)
    gain = s * (1 + growth(u, k + 2))
    out = Tracked(fp=mod(x.fp), ref=mod(x.ref), dd=dd, A=s * x.A,
                  E=avgpool_budget(k, x.A, x.E, s, u), G=gain * x.G)
    ctx.row(name, "avgpool", x, out, fan_in=k, w=s / k, gain=gain)
    return out


# ---------------------------------------------------------------------- batch norm (eval)
def _batchnorm(ctx: _Ctx, name: str, mod: nn.Module, x: Tracked) -> Tracked:
    """Inference-mode batch norm, folded to ``a·x + c`` per channel (budgets.batchnorm_budget)."""
    if mod.running_mean is None or mod.running_var is None:
        raise BoundsError(f"layer {name!r} ({type(mod).__name__}): no running statistics "
                          "(track_running_stats=False uses batch statistics); not supported")
    u = ctx.p.uacc
    C = mod.running_mean.numel()
    mean = mod.running_mean.detach().double()
    var = mod.running_var.detach().double()
    weight = mod.weight.detach().double() if mod.weight is not None else torch.ones(C, dtype=torch.float64)
    bias = mod.bias.detach().double() if mod.bias is not None else torch.zeros(C, dtype=torch.float64)
    a = weight / torch.sqrt(var + mod.eps)
    c = bias - mean * a
    shape = (1, C) + (1,) * (x.fp.dim() - 2) if x.fp.dim() >= 2 else (C,)
    av, muav, bv = a.view(shape), (mean * a).view(shape), bias.view(shape)
    # per element: the budget at the computed input |x̂| (E = 0), plus |a|·(inherited bound)
    dd = batchnorm_budget(av, muav, bv, x.fp.double().abs(), 0.0, u) + av.abs() * x.dd
    amax = float(a.abs().max())
    gain = amax * (1 + gamma(u, BATCHNORM_ROUNDINGS))   # >= every channel's coefficient of E
    offset = float(batchnorm_budget(a, mean * a, bias, x.A, 0.0, u).max())
    fp = F.batch_norm(x.fp, mod.running_mean.to(ctx.dtype), mod.running_var.to(ctx.dtype),
                      mod.weight.to(ctx.dtype) if mod.weight is not None else None,
                      mod.bias.to(ctx.dtype) if mod.bias is not None else None,
                      False, 0.0, mod.eps)
    ref = F.batch_norm(x.ref, mean, var, weight, bias, False, 0.0, mod.eps)
    out = Tracked(fp=fp, ref=ref, dd=dd, A=float((a.abs() * x.A + c.abs()).max()),
                  E=gain * x.E + offset, G=gain * x.G)
    ctx.row(name, "batchnorm", x, out, fan_in=1, w=amax, gain=gain)
    return out


# ---------------------------------------------------------------------- add, cat, data movement
def _add(ctx: _Ctx, name: str, x: Any, y: Any) -> Tracked:
    """``x + y``: ``u(|x|+e_x+|y|+e_y) + e_x + e_y``; per element ``u|x̂+ŷ| + e_x + e_y``."""
    u = ctx.p.uacc
    if not isinstance(x, Tracked):
        x, y = y, x
    if isinstance(y, Tracked):
        fp = x.fp + y.fp
        ref = x.ref + y.ref
        exact_sum = x.fp.double() + y.fp.double()
        dd = u * exact_sum.abs() + x.dd + y.dd
        A = x.A + y.A
        E = residual_add_budget(x.A, x.E, y.A, y.E, u)
        G = (1 + u) * (x.G + y.G)
    elif isinstance(y, (int, float)):
        fp = x.fp + y
        ref = x.ref + y
        dd = u * (x.fp.double() + y).abs() + x.dd
        A = x.A + abs(y)
        E = residual_add_budget(x.A, x.E, abs(y), 0.0, u)
        G = (1 + u) * x.G
    else:
        raise BoundsError(f"node {name!r}: add of a tensor and {type(y).__name__} is not "
                          "supported")
    out = Tracked(fp=fp, ref=ref, dd=dd, A=A, E=E, G=G)
    ctx.row(name, "add", x, out, gain=1 + u)
    return out


def _cat(ctx: _Ctx, name: str, tensors, dim: int = 0) -> Tracked:
    ts = list(tensors)
    if not all(isinstance(t, Tracked) for t in ts):
        raise BoundsError(f"node {name!r}: cat of constants is not supported")
    return Tracked(fp=torch.cat([t.fp for t in ts], dim), ref=torch.cat([t.ref for t in ts], dim),
                   dd=torch.cat([t.dd for t in ts], dim), A=max(t.A for t in ts),
                   E=max(t.E for t in ts), G=max(t.G for t in ts))


def _move(fn: Callable, x: Tracked, *args, **kwargs) -> Tracked:
    """Pure data movement (view, flatten, permute, ...): applied to every component."""
    return Tracked(fp=fn(x.fp, *args, **kwargs), ref=fn(x.ref, *args, **kwargs),
                   dd=fn(x.dd, *args, **kwargs), A=x.A, E=x.E, G=x.G)


# ---------------------------------------------------------------------- registries
# Module types → handler(ctx, name, module, x). Add a layer by adding one entry.
MODULE_HANDLERS: dict[type, Callable] = {
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.Conv3d: _conv,
    nn.Linear: _linear,
    # never in place (inplace=True would overwrite values other branches still use)
    nn.ReLU: lambda ctx, name, mod, x: _relu_like(ctx, name, torch.relu, x),
    nn.ReLU6: lambda ctx, name, mod, x: _relu_like(
        ctx, name, lambda v: F.hardtanh(v, 0.0, 6.0), x, "relu6"),
    nn.Hardtanh: lambda ctx, name, mod, x: _relu_like(
        ctx, name, lambda v: F.hardtanh(v, mod.min_val, mod.max_val), x, "hardtanh"),
    nn.MaxPool1d: _maxpool,
    nn.MaxPool2d: _maxpool,
    nn.MaxPool3d: _maxpool,
    nn.AdaptiveMaxPool1d: _maxpool,
    nn.AdaptiveMaxPool2d: _maxpool,
    nn.AvgPool1d: _avgpool,
    nn.AvgPool2d: _avgpool,
    nn.AvgPool3d: _avgpool,
    nn.AdaptiveAvgPool1d: _avgpool,
    nn.AdaptiveAvgPool2d: _avgpool,
    nn.AdaptiveAvgPool3d: _avgpool,
    nn.BatchNorm1d: _batchnorm,
    nn.BatchNorm2d: _batchnorm,
    nn.BatchNorm3d: _batchnorm,
}
# Identity-like modules (in eval mode): pure data movement.
MOVE_MODULES: tuple[type, ...] = (nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout,
                                  nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)

# Functions (call_function targets) → kind.
RELU_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", F.relu6: "relu6"}
ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
MOVE_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.permute,
                  torch.transpose, torch.t, operator.getitem, F.dropout}
# Methods (call_method names).
MOVE_METHODS = {"view", "reshape", "flatten", "contiguous", "squeeze", "unsqueeze", "permute",
                "transpose", "t", "clone", "detach", "view_as", "reshape_as", "expand",
                "expand_as"}
PLAIN_METHODS = {"size", "dim", "numel"}
RELU_METHODS = {"relu": "relu"}
ADD_METHODS = {"add", "add_", "__add__", "__iadd__"}


def _supported_modules() -> str:
    names = sorted({t.__name__ for t in MODULE_HANDLERS} | {t.__name__ for t in MOVE_MODULES})
    return ", ".join(names)


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))


def _check_graph(gm: torch.fx.GraphModule) -> None:
    """Refuse unsupported nodes, naming every one of them."""
    bad: list[str] = []
    modules = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            mod = modules[node.target]
            if type(mod) not in MODULE_HANDLERS and not isinstance(mod, MOVE_MODULES):
                bad.append(f"{node.target} ({type(mod).__name__})")
        elif node.op == "call_function":
            t = node.target
            if (t not in RELU_FUNCTIONS and t not in ADD_FUNCTIONS and t not in MOVE_FUNCTIONS
                    and t is not torch.cat and t is not getattr):
                bad.append(f"function {_fn_name(t)} (node {node.name})")
        elif node.op == "call_method":
            if node.target not in (MOVE_METHODS | PLAIN_METHODS | set(RELU_METHODS)
                                   | ADD_METHODS):
                bad.append(f"method .{node.target}() (node {node.name})")
    if bad:
        raise BoundsError("cannot bound these layers: " + "; ".join(bad)
                          + f". Supported layers: {_supported_modules()}, relu, add, cat, "
                          "flatten/view/reshape")


class _Root(nn.Module):
    """Wraps a model that is itself a single layer, so that fx sees it as a call."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.root = layer

    def forward(self, x):
        return self.root(x)


def trace(model: nn.Module) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` with a BoundsError (naming the cause) on failure.
    A model that is itself one supported layer is traced as a call named ``root``."""
    if type(model) in MODULE_HANDLERS or isinstance(model, MOVE_MODULES):
        model = _Root(model)
    try:
        return torch.fx.symbolic_trace(model)
    except Exception as exc:  # fx raises many kinds (TraceError, TypeError, ...)
        raise BoundsError(f"cannot trace {type(model).__name__} with torch.fx: "
                          f"{type(exc).__name__}: {exc}") from exc


def _count_placeholders(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "placeholder")


def network_bounds(model: nn.Module, x: torch.Tensor, *, precision: str | Precision = "fp32",
                   input_bound: float | None = None, input_error: float = 0.0,
                   run: Any = None, keep_tensors: bool = False) -> NetworkBounds:
    """A-priori and data-dependent error bounds of ``model`` on input ``x``, layer by
    layer, with the measured error ``|computed - float64|`` and, given a run directory
    (or :class:`~numvar.runner.store.Samples`), the SR standard deviation per layer.

    ``input_bound``: A >= |exact input| (default ``max|x|``); ``input_error``: E, the
    input's own error bound (default 0: ``x`` is the exact input). The model is analysed
    in eval mode with float32 parameters, on the CPU (a model elsewhere is copied there). ``keep_tensors``: keep each layer's per-element ``fp``, ``ref``
    and ``dd`` tensors in ``LayerBound.tensors`` (and the output's in ``.tensors``).
    """
    p = get_precision(precision)
    if not isinstance(model, nn.Module):
        raise BoundsError(f"expected a torch.nn.Module, got {type(model).__name__}")
    for pname, prm in list(model.named_parameters()) + list(model.named_buffers()):
        if prm.is_floating_point() and prm.dtype != torch.float32:
            raise BoundsError(f"parameter {pname!r} is {prm.dtype}; bounds analyse float32 "
                              "models (bf16-mixed is emulated from float32 parameters)")
    tensors = list(model.parameters()) + list(model.buffers())
    if any(t.device.type != "cpu" for t in tensors):
        import copy

        log.info("bounds: analysing a CPU copy of the model")
        model = copy.deepcopy(model).cpu()
    was_training = model.training
    model.eval()
    try:
        gm = trace(model)
        _check_graph(gm)
        if _count_placeholders(gm) != 1:
            raise BoundsError("bounds analyse models with exactly one tensor input")
        ctx = _Ctx(p, keep_tensors)
        xin = x.detach().cpu().to(torch.float32)
        amax = _maxf(xin.double().abs())
        A0 = amax if input_bound is None else float(input_bound)
        if not (math.isfinite(A0) and A0 >= 0):
            raise BoundsError(f"input bound A = {A0:g}: expected a finite number >= 0")
        if not (math.isfinite(input_error) and input_error >= 0):
            raise BoundsError(f"input error E = {input_error:g}: expected a finite number >= 0")
        if not math.isfinite(amax):
            raise BoundsError("the input holds NaN or infinite values")
        if A0 + input_error < amax:
            raise BoundsError(f"input bound A = {A0:g} (+ input error {input_error:g}) is "
                              f"below max|input| = {amax:g}")
        fp_in = xin.to(ctx.dtype)
        x0 = Tracked(fp=fp_in, ref=xin.double(),
                     dd=torch.full(xin.shape, float(input_error), dtype=torch.float64),
                     A=A0, E=float(input_error), G=1.0)
        with torch.no_grad():
            out = _interpret(ctx, gm, x0)
    finally:
        model.train(was_training)
    outs = _flatten_out(out)
    if not outs:
        raise BoundsError("the model returns no tensor")
    result = NetworkBounds(
        precision=p.name, input_shape=tuple(x.shape), input_bound=A0,
        input_error=float(input_error), layers=ctx.rows,
        output_apriori=max(t.E for t in outs),
        output_data_dependent=max(_maxf(t.dd) for t in outs),
        output_measured=max(_maxf((t.fp.double() - t.ref).abs()) for t in outs),
        network_gain=max(t.G for t in outs),
        output_shape=tuple(outs[0].fp.shape) if len(outs) == 1 else None,
    )
    if keep_tensors and len(outs) == 1:
        result.tensors = {"fp": outs[0].fp, "ref": outs[0].ref, "dd": outs[0].dd}
    if run is not None:
        from .runs import attach_sr_std

        attach_sr_std(result, run)
    return result


def _flatten_out(out: Any) -> list[Tracked]:
    if isinstance(out, Tracked):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten_out(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten_out(o)]
    return []


def _interpret(ctx: _Ctx, gm: torch.fx.GraphModule, x0: Tracked) -> Any:
    modules = dict(gm.named_modules())
    env: dict[str, Any] = {}

    def load(a):
        return torch.fx.node.map_arg(a, lambda n: env[n.name])

    for node in gm.graph.nodes:
        args, kwargs = load(node.args), load(node.kwargs)
        if node.op == "output":
            return args[0]
        try:
            env[node.name] = _node_value(ctx, modules, node, args, kwargs, x0)
        except BoundsError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            # the model itself fails (e.g. an input of the wrong shape): name the node
            shapes = [tuple(a.fp.shape) for a in args if isinstance(a, Tracked)]
            what = (f"layer {node.target!r} ({type(modules[node.target]).__name__})"
                    if node.op == "call_module" else f"node {node.name}")
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BoundsError(f"{what} fails on an input of shape "
                              f"{shapes[0] if shapes else '?'}: {msg}") from exc
    return None


def _node_value(ctx: _Ctx, modules: dict[str, nn.Module], node, args, kwargs,
                x0: Tracked) -> Any:
    """The value of one fx node (placeholder, module call, function or method)."""
    if node.op == "placeholder":
        return x0
    if node.op == "get_attr":
        raise BoundsError(f"node {node.name}: tensor attribute {node.target!r} used "
                          "directly in forward is not supported")
    if node.op == "call_module":
        mod = modules[node.target]
        x = args[0] if args else None
        if not isinstance(x, Tracked) or len(args) != 1 or kwargs:
            raise BoundsError(f"layer {node.target!r} ({type(mod).__name__}): expected "
                              "one tensor argument")
        if isinstance(mod, MOVE_MODULES):
            return _move(lambda t: mod(t), x)
        nrows = len(ctx.rows)
        val = MODULE_HANDLERS[type(mod)](ctx, node.target, mod, x)
        for r in ctx.rows[nrows:]:
            r.module = True
        return val
    if node.op == "call_function":
        return _call_function(ctx, node, args, kwargs)
    if node.op == "call_method":
        return _call_method(ctx, node, args, kwargs)
    raise BoundsError(f"unknown fx node op {node.op}")  # pragma: no cover - fx has no other


def _any_tracked(args, kwargs) -> bool:
    found = []
    torch.fx.node.map_aggregate((args, kwargs), lambda a: found.append(a)
                                if isinstance(a, Tracked) else a)
    return bool(found)


def _call_function(ctx: _Ctx, node, args, kwargs) -> Any:
    t = node.target
    if not _any_tracked(args, kwargs):
        return t(*args, **kwargs)     # plain values (sizes, shapes)
    if t is getattr:
        return getattr(args[0].fp, args[1])
    if t in RELU_FUNCTIONS:
        # the only other argument is ``inplace``: never applied in place here
        return _relu_like(ctx, node.name, lambda v: t(v), args[0], RELU_FUNCTIONS[t])
    if t in ADD_FUNCTIONS:
        if kwargs.get("alpha", 1) != 1 or len(args) != 2:
            raise BoundsError(f"node {node.name}: add with alpha is not supported")
        return _add(ctx, node.name, args[0], args[1])
    if t is torch.cat:
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        return _cat(ctx, node.name, args[0], dim)
    if t in MOVE_FUNCTIONS:
        if not isinstance(args[0], Tracked):
            raise BoundsError(f"node {node.name}: {_fn_name(t)} of a non-tensor")
        if t is F.dropout:
            return args[0]
        return _move(t, args[0], *args[1:], **kwargs)
    raise BoundsError(f"cannot bound function {_fn_name(t)} (node {node.name})")


def _call_method(ctx: _Ctx, node, args, kwargs) -> Any:
    name = node.target
    self_ = args[0]
    if not isinstance(self_, Tracked):
        return getattr(self_, name)(*args[1:], **kwargs)
    if name in PLAIN_METHODS:
        return getattr(self_.fp, name)(*args[1:], **kwargs)
    if name in MOVE_METHODS:
        rest = [a.fp if isinstance(a, Tracked) else a for a in args[1:]]
        return _move(lambda v, *a, **k: getattr(v, name)(*a, **k), self_, *rest, **kwargs)
    if name in RELU_METHODS:
        return _relu_like(ctx, node.name, torch.relu, self_)
    if name in ADD_METHODS:
        if kwargs.get("alpha", 1) != 1 or len(args) != 2:
            raise BoundsError(f"node {node.name}: add with alpha is not supported")
        return _add(ctx, node.name, self_, args[1])
    raise BoundsError(f"cannot bound method .{name}() (node {node.name})")
