"""The dispatch mode that sends every aten op of a model through numvar's rounding.

``with fuzzy(mode="sr", granularity="flop", seed=0): ...`` — every aten op that runs in
the block (forward, backward, optimizer step) reaches :class:`FuzzyMode`, which

1. runs exact ops natively (views, copies, indexing, comparisons, integer tensors,
   random draws, max/min/abs/neg/relu/clamp: :data:`numvar.instrument.ops.EXACT_OPS`);
2. runs natively what the user excluded (``exclude``/``include`` globs over aten names)
   and what lies outside the selected modules (``modules`` globs);
3. turns in-place and ``out=`` ops into their functional form and copies the result into
   the destination, so aliasing semantics hold;
4. at ``flop`` granularity: calls the op's handler (elementwise arithmetic, matmul,
   convolution, reductions), or runs a curated torch decomposition with the mode
   re-entered so that each sub-op is seen (recorded once per input signature, then
   replayed: :mod:`numvar.instrument.replay`), or rounds once a float64 result
   (transcendental and other pointwise functions);
   at ``op`` granularity: rounds each float result once (computed in float64 for
   binary32/16);
5. runs anything else natively.

Ops that run natively for want of a handler, or that are rounded once although
``granularity="flop"``, *escape*: each ``with`` block ends with a warning that lists
them with their counts (also in :meth:`Fuzzy.report` and in a run's metadata), and under
``strict=True`` the first one raises :class:`numvar.errors.UninstrumentedOpError`
naming the op and the module it ran in (a module stack kept by global forward hooks).

Composite-implicit ops (``linear``, ``matmul``, ``einsum``, ``scaled_dot_product_attention``)
usually never reach a dispatch mode: their aten pieces do. Under ``torch.inference_mode``
they do reach it (autograd's dispatch key is off); numvar then runs their
CompositeImplicitAutograd kernel with the mode re-entered (``func.decompose``), so the
pieces are perturbed as under ``no_grad``. Fused optimizer steps run per tensor
(:mod:`numvar.instrument.optim`). The switches of :func:`numvar.instrument.codepath.codepath`
(SDPA math path, no MHA fast path, no mkldnn: LSTM/GRU by their cell arithmetic) hold
inside the block; while a block is open, ``torch._VF``'s recurrent layers and cells go
to :meth:`FuzzyMode._recurrent`, which runs their time steps in compiled calls
(:mod:`numvar.instrument.rnn_kernels`) with the bits and report of their ops one by
one. Code compiled with ``torch.compile`` runs eagerly while a dispatch mode is active.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _get_current_dispatch_mode_stack,
    _pop_mode_temporarily,
)

import numvar.rounding as R

from ..errors import ConfigError, UninstrumentedOpError
from . import activation_kernels as AK
from . import depthwise as _depthwise  # noqa: F401  (registers its handler)
from . import grid_kernels as GK
from . import handlers as H
from . import heap
from . import norm_kernels as NK
from . import oplevel as _oplevel  # noqa: F401  (registers its handlers)
from . import ops as O
from . import optim as _optim  # noqa: F401  (registers its handlers)
from . import prefault
from . import replay as RP
from . import rnn_kernels as RN
from ._core import FLOATS, Ctx
from .config import FuzzyConfig
from .codepath import _dynamo_callback, codepath, guards_itself

logger = logging.getLogger("numvar.instrument")

#: why an op escapes (report, summary, strict error)
ROUNDED_ONCE = "rounded once: no flop handler (op granularity although flop was asked)"

# op kinds of the dispatch decision
K_EXACT, K_HANDLER, K_DECOMP, K_F64, K_OPONCE, K_FOREACH = range(6)
_ELEMENTWISE_OP_LEVEL = frozenset(
    ["aten.add", "aten.sub", "aten.mul", "aten.div", "aten.true_divide", "aten.sqrt",
     "prims.add", "prims.sub", "prims.mul", "prims.div", "prims.sqrt", "aten.native_dropout"]
)

_DECOMPS: dict | None = None


def _decomps() -> dict:
    global _DECOMPS
    if _DECOMPS is None:
        from torch._decomp import get_decompositions

        from .decompositions import DECOMPOSITIONS

        packets = []
        for n in O.DECOMPOSED_OPS:
            ns, name = n.split(".", 1)
            p = getattr(getattr(torch.ops, ns), name, None)
            if p is not None:
                packets.append(p)
        # numvar's own decompositions first (torch's, where both exist, may scatter
        # through masked sums: see numvar.instrument.decompositions)
        own = {op: fn for op, fn in DECOMPOSITIONS.items() if op.overloadpacket in packets}
        _DECOMPS = dict(get_decompositions(packets))
        _DECOMPS.update(own)
        aten = torch.ops.aten
        _DECOMPS[aten.softmax.int] = _softmax_int
        _DECOMPS[aten.log_softmax.int] = _log_softmax_int
    return _DECOMPS


def _softmax_int(x, dim, dtype=None):
    """``softmax.int`` (reached from decompositions) as ``_softmax``, itself decomposed."""
    return torch.ops.aten._softmax.default(x if dtype is None else x.to(dtype), dim, False)


def _log_softmax_int(x, dim, dtype=None):
    return torch.ops.aten._log_softmax.default(x if dtype is None else x.to(dtype), dim, False)


@dataclass
class _OpInfo:
    name: str  # aten.mm.default
    packet: str  # aten.mm
    kind: int
    handler: Any = None
    how: str = ""
    functional: Any = None  # functional variant of an in-place / out= op
    out_args: tuple[str, ...] = ()
    inplace: bool = False
    #: the functional variant takes the op's arguments as they are (same schema but for
    #: the written ones): _mutating dispatches it without re-entering the mode
    direct: bool = False


def _arguments(fn) -> list[tuple]:
    """(name, kwarg-only, type, default) of each argument of an op's schema."""
    return [(a.name, a.kwarg_only, str(a.type),
             str(a.default_value) if a.has_default_value() else None)
            for a in fn._schema.arguments]


def _functional_variant(func):
    """(functional op, out-arg names, in-place?) for a mutating op; None when it has none.

    The functional variant of an in-place op (``pow_.Scalar``) is the overload of the
    base packet whose arguments are the same (names, types, defaults, kwarg-only):
    the same overload name (``pow.Scalar``) is not always it (``pow.Tensor_Scalar``)."""
    schema = func._schema
    if not schema.is_mutable:
        return None
    ns, base = func._schema.name.split("::")
    if base.endswith("_") and not base.startswith("_foreach"):
        packet = getattr(getattr(torch.ops, ns), base[:-1], None)
        if packet is None:
            return None
        want = _arguments(func)
        same = getattr(packet, func._overloadname, None)
        for fn in [same] + [getattr(packet, ov) for ov in packet.overloads()]:
            if fn is not None and not fn._schema.is_mutable and _arguments(fn) == want:
                return fn, (), True
        return None
    outs = [a.name for a in schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    if not outs:
        return None
    names = [a.name for a in schema.arguments if a.name not in outs]
    packet = func.overloadpacket
    for ov in packet.overloads():
        f2 = getattr(packet, ov)
        if not f2._schema.is_mutable and [a.name for a in f2._schema.arguments] == names:
            return f2, tuple(outs), False
    return None


def _returns_alias(func) -> bool:
    """A view op: some output aliases an input without writing to it."""
    if getattr(func, "is_view", False):
        return True
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


COMPOSITE = "decomposed (CompositeImplicitAutograd kernel)"


def composite_implicit(func) -> bool:
    """The op has a CompositeImplicitAutograd kernel (it reaches a dispatch mode only
    where autograd's key is off, as under ``torch.inference_mode``)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def _classify(func, granularity: str) -> _OpInfo:
    packet = O.packet_name(func)
    name = O.full_name(func)
    info = _OpInfo(name, packet, K_OPONCE, how="rounded once (op)")
    if (packet in O.EXACT_OPS and packet not in H.COMPLEX_INEXACT) or _returns_alias(func):
        info.kind = K_EXACT  # listed exact ops, and every view op (aliasing kept)
        info.handler = H.EXACT_IMPLS.get(name)
        return info
    tags = getattr(func, "tags", ())
    if (torch.Tag.nondeterministic_seeded in tags and packet not in H.FLOP_HANDLERS
            and packet not in H.OP_HANDLERS and not composite_implicit(func)):
        info.kind = K_EXACT  # random draws: torch's RNG, never perturbed
        return info
    if packet.startswith(H.FOREACH_PREFIX) or packet in H.PER_TENSOR:
        info.kind, info.how = K_FOREACH, H.HOW.get(packet, "per tensor")
        info.handler = H.PER_TENSOR.get(packet, H._foreach)
        return info
    fv = _functional_variant(func)
    if fv is not None:
        info.functional, info.out_args, info.inplace = fv
        info.direct = info.inplace or _arguments(info.functional) == [
            a for a in _arguments(func) if a[0] not in info.out_args]
        return info
    if granularity == "op":
        if packet in H.OP_HANDLERS:
            info.kind, info.handler = K_HANDLER, H.OP_HANDLERS[packet]
            info.how = H.OP_HOW.get(packet) or H.HOW.get(packet, "rounded once (op)")
        elif packet in _ELEMENTWISE_OP_LEVEL:
            info.kind, info.handler, info.how = K_HANDLER, H.FLOP_HANDLERS[packet], "elementwise"
        elif composite_implicit(func):
            info.kind, info.handler, info.how = K_DECOMP, func.decompose, COMPOSITE
        return info
    if packet in H.FLOP_HANDLERS:
        info.kind, info.handler, info.how = K_HANDLER, H.FLOP_HANDLERS[packet], H.HOW[packet]
    elif composite_implicit(func):
        info.kind, info.handler, info.how = K_DECOMP, func.decompose, COMPOSITE
    elif func in _decomps():
        info.kind, info.handler, info.how = K_DECOMP, _decomps()[func], "decomposed"
    elif packet in O.TRANSCENDENTAL_OPS or torch.Tag.pointwise in tags:
        info.kind, info.how = K_F64, "float64, rounded once"
    else:
        info.kind, info.how = K_OPONCE, "rounded once (no flop handler)"
    return info


#: classifications shared by every fuzzy block: (OpOverload, granularity) -> _OpInfo, and
#: (OpOverload, include globs, exclude globs) -> (included, excluded). Both depend only
#: on the op and on these arguments (the handler tables are filled at import).
_CLASSIFIED: dict = {}
_SELECTED: dict = {}
#: the two above combined per block configuration: (granularity, include, exclude) ->
#: {OpOverload: (_OpInfo, included, excluded)}, the table :meth:`FuzzyMode._dispatch`
#: reads first. Shared by every block of that configuration: a block is often one forward,
#: and filling a table of its own cost each block a miss, two lookups and a store per
#: distinct op (26 µs of a 0.97 ms multihead_attention forward at op granularity)
_INFOS: dict = {}
#: recorded decompositions: signature -> replay.Program, or None (not replayable)
_PROGRAMS: dict = {}
#: decomposed ops with a compiled kernel that computes the decomposition's bits:
#: op -> fn(ctx, args, kwargs, nkeys) -> result, or None (the decomposition runs)
_FUSED: dict = {torch.ops.aten.grid_sampler_2d.default: GK.grid_sampler_2d,
                torch.ops.aten.affine_grid_generator.default: GK.affine_grid_generator,
                torch.ops.aten.upsample_linear1d.default: GK.upsample_linear,
                torch.ops.aten.upsample_bilinear2d.default: GK.upsample_linear,
                torch.ops.aten.upsample_trilinear3d.default: GK.upsample_linear,
                torch.ops.aten.native_layer_norm.default: NK.native_layer_norm,
                torch.ops.aten.native_batch_norm.default: NK.native_batch_norm,
                torch.ops.aten._native_batch_norm_legit_no_training.default:
                    NK.batch_norm_no_training,
                torch.ops.aten.native_batch_norm_backward.default: NK.batch_norm_backward_op,
                torch.ops.aten.native_layer_norm_backward.default:
                    NK.native_layer_norm_backward,
                torch.ops.aten.native_group_norm.default: NK.native_group_norm,
                torch.ops.aten._softmax.default: NK.softmax,
                torch.ops.aten._safe_softmax.default: NK.safe_softmax,
                torch.ops.aten._softmax_backward_data.default: NK.softmax_backward_op,
                torch.ops.aten.hardswish.default: AK.hardswish,
                torch.ops.aten.hardsigmoid.default: AK.hardsigmoid,
                torch.ops.aten.hardswish_backward.default: AK.hardswish_backward,
                torch.ops.aten.hardsigmoid_backward.default: AK.hardsigmoid_backward,
                torch.ops.aten.sigmoid_backward.default: AK.sigmoid_backward,
                torch.ops.aten.tanh_backward.default: AK.tanh_backward}
#: signature -> (keys the decomposition drew, [(count category, op name, count, how)])
_FUSED_SEEN: dict = {}
#: fused op -> positions of float arguments its kernel reads at run time and its
#: decomposition's ops and counts do not depend on: left out of the signature under which
#: the kernel is taken (BatchNorm's momentum, which ``momentum=None`` makes 1/k at step k:
#: every step a new signature, the decomposition recorded again each time)
_FUSED_FREE_ARGS: dict = {torch.ops.aten.native_batch_norm.default: (6,)}
#: recurrent-layer signature -> (keys, counts) as _FUSED_SEEN, or None: op by op
_RECURRENT_SEEN: dict = {}
#: categories a fused path may stand for (nothing escaped, excluded or run natively)
_FUSABLE = ("instrumented", "decomposed", "exact")


def _fused_key(func, key, args, kwargs):
    """The signature a fused op's kernel is taken under: ``key``, or, for the float
    arguments of :data:`_FUSED_FREE_ARGS` passed by position, ``key`` without them (calls
    that differ only there draw the same keys and count the same sub-ops)."""
    free = _FUSED_FREE_ARGS.get(func)
    if free is None or kwargs or not all(p < len(args) and type(args[p]) is float
                                         for p in free):
        return key
    return RP.without_args(key, free)


def _classified(func, granularity: str) -> _OpInfo:
    key = (func, granularity)
    info = _CLASSIFIED.get(key)
    if info is None:
        info = _CLASSIFIED[key] = _classify(func, granularity)
    return info


_INEXACT = FLOATS | {torch.complex64, torch.complex128}


def _has_float(args, kwargs) -> bool:
    """Some argument is a float or complex tensor (or a list holding one)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype in _INEXACT:
                return True
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor) and x.dtype in _INEXACT:
                    return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.dtype in _INEXACT:
            return True
    return False


# --------------------------------------------------------------------------- report
@dataclass
class FuzzyReport:
    """What a fuzzy block did, per aten op name (``aten.mm.default``) and call count.

    ``instrumented``: ops whose results numvar rounded (``how`` says how: flop kernel,
    elementwise, float64 rounded once, rounded once). ``decomposed``: ops split into
    sub-ops (counted themselves). ``native``: ops that ran natively for want of a handler
    (NOT perturbed). ``exact``: never-perturbed ops (data movement, exact float ops,
    integer tensors). ``excluded``: ops left native by ``exclude``/``include``.
    ``outside_modules``: ops that ran outside the ``modules`` selection.
    ``escaped``: ops NOT perturbed at the requested granularity (run natively, or rounded
    once at ``flop`` granularity), with ``escape_reasons`` saying why and where each
    was first seen; printed first.
    """

    mode: str
    granularity: str
    instrumented: dict[str, int] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    decomposed: dict[str, int] = field(default_factory=dict)
    native: dict[str, int] = field(default_factory=dict)
    exact: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    outside_modules: dict[str, int] = field(default_factory=dict)
    escaped: dict[str, int] = field(default_factory=dict)
    escape_reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}

    def escapes(self) -> dict[str, dict]:
        """``{op: {"count": n, "reason": why}}`` (what a run stores in its metadata)."""
        return {k: {"count": n, "reason": self.escape_reasons.get(k, "")}
                for k, n in self.escaped.items()}

    def __str__(self) -> str:
        lines = [f"numvar fuzzy report: mode={self.mode} granularity={self.granularity}"]
        if self.escaped:
            lines.append(escape_summary(self.escaped, self.escape_reasons, self.granularity))
        for title, d in (("instrumented", self.instrumented), ("decomposed", self.decomposed),
                         ("native (NOT perturbed: no handler)", self.native),
                         ("excluded", self.excluded), ("outside modules", self.outside_modules),
                         ("exact (never perturbed)", self.exact)):
            if not d:
                continue
            lines.append(f"{title}: {sum(d.values())} calls, {len(d)} ops")
            for name, n in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])):
                extra = f"  [{self.how[name]}]" if title == "instrumented" and name in self.how else ""
                lines.append(f"  {n:8d}  {name}{extra}")
        return "\n".join(lines)


def escape_summary(counts: dict[str, int], reasons: dict[str, str], granularity: str) -> str:
    """The lines that list escaped ops (block summary, report)."""
    lines = [f"ESCAPED (NOT perturbed at {granularity} granularity): "
             f"{sum(counts.values())} calls, {len(counts)} ops"]
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {n:8d}  {name}: {reasons.get(name, '')}")
    return "\n".join(lines)


class _ModuleStack:
    """The module whose forward is running (global forward hooks), to name where an op
    ran; in backward, the autograd node."""

    def __init__(self, model) -> None:
        self.paths: dict[int, str] = {}
        self.fixed = isinstance(model, torch.nn.Module)
        if self.fixed:
            self._index(model)
        self.stack: list = []
        self.handles: list = []

    def _index(self, root) -> None:
        top = type(root).__name__
        for path, mod in root.named_modules(remove_duplicate=True):
            self.paths.setdefault(id(mod), f"{top}.{path}" if path else top)

    def pre(self, module, args):
        if not self.stack and not self.fixed and id(module) not in self.paths:
            self._index(module)
        self.stack.append(module)

    def post(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def where(self) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            return f"the backward node {node.name()}"
        if not self.stack:
            return "no module (top-level code)"
        m = self.stack[-1]
        return f"module {self.paths.get(id(m), '?')} ({type(m).__name__})"

    def install(self) -> None:
        from torch.nn.modules import module as M

        self.handles = [M.register_module_forward_pre_hook(self.pre),
                        M.register_module_forward_hook(self.post, always_call=True)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.stack.clear()


# ------------------------------------------------------------------------ modules filter
class _ModuleFilter:
    """Which ops run inside the selected modules, in forward (a stack maintained by global
    module hooks) and in backward (autograd nodes created inside a selected module, found
    by their sequence numbers)."""

    def __init__(self, globs: tuple[str, ...], model) -> None:
        self.globs = globs
        self.paths: dict[int, str] = {}
        self.fixed = model is not None
        if model is not None:
            if not isinstance(model, torch.nn.Module):
                raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
            self._index(model)
        self.stack: list[tuple[bool, bool, int]] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.handles: list = []
        self.matched: set[str] = set()

    def _index(self, root) -> None:
        for path, mod in root.named_modules(remove_duplicate=True):
            self.paths.setdefault(id(mod), path)

    def _match(self, path: str) -> bool:
        return any(O.fnmatch.fnmatchcase(path, g) for g in self.globs)

    def pre(self, module, args):
        if not self.stack and not self.fixed and id(module) not in self.paths:
            self._index(module)
        path = self.paths.get(id(module))
        parent = self.stack[-1][0] if self.stack else False
        own = path is not None and self._match(path)
        if own:
            self.matched.add(path)
        self.stack.append((parent or own, own and not parent,
                           torch._C._autograd._get_sequence_nr()))

    def post(self, module, args, output):
        if not self.stack:
            return
        _, record, lo = self.stack.pop()
        if record:
            hi = torch._C._autograd._get_sequence_nr()
            if hi > lo:
                self.starts.append(lo)
                self.ends.append(hi)

    def active(self) -> bool:
        node = torch._C._current_autograd_node()
        if node is None:
            return bool(self.stack) and self.stack[-1][0]
        seq = node._sequence_nr()
        i = bisect.bisect_right(self.starts, seq) - 1
        # intervals are recorded in increasing, non-overlapping order per thread
        while i >= 0:
            if self.starts[i] <= seq < self.ends[i]:
                return True
            if self.ends[i] <= seq:
                return False
            i -= 1
        return False

    def install(self) -> None:
        from torch.nn.modules import module as M

        self.handles = [M.register_module_forward_pre_hook(self.pre),
                        M.register_module_forward_hook(self.post)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.stack.clear()


# --------------------------------------------------------------------------- the mode
@guards_itself
class FuzzyMode(TorchDispatchMode):
    """The TorchDispatchMode behind :func:`fuzzy` (use :func:`fuzzy`, not this class)."""

    def __init__(self, fz: Fuzzy) -> None:
        super().__init__()
        self.fz = fz
        self.depth = 0
        self._recorders: list[RP.Recorder] = []  # decompositions being recorded (innermost last)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _dynamo_callback() is not None:  # dynamo runs: PyTorch's path (guards_itself)
            return self._guarded(func, types, args, kwargs)
        kwargs = kwargs or {}
        recs = self._recorders
        if recs and recs[-1].depth == self.depth:
            return recs[-1].call(func, args, kwargs, self._dispatch)
        return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        """Steps 1-5 of the module docstring for one op (also replayed decompositions' ops)."""
        fz = self.fz
        entry = fz._infos.get(func)
        if entry is None:
            entry = fz._infos[func] = (_classified(func, fz.config.granularity),
                                       *fz._selection(func))
        info, included, excluded = entry
        if info.kind == K_EXACT:
            fz._exact[info.name] += 1  # (fz._count("exact", ...) inlined: the most frequent)
            if info.handler is not None:
                return info.handler(*args, **kwargs)
            return func(*args, **kwargs)
        if fz._filter is not None and not fz._filter.active():
            fz._count("outside_modules", info.name)
            return func(*args, **kwargs)
        if excluded or (not included and self.depth == 0):
            fz._count("excluded", info.name)
            return func(*args, **kwargs)
        if not _has_float(args, kwargs):
            fz._count("exact", info.name)
            return func(*args, **kwargs)
        return self._run(func, info, args, kwargs)

    def _reenter(self, fn, *args, **kwargs):
        self.depth += 1
        try:
            with self:
                return fn(*args, **kwargs)
        finally:
            self.depth -= 1

    def _functional_reentered(self, fn, args, kwargs):
        return self._reenter(fn, *args, **kwargs)

    def _decompose(self, func, info: _OpInfo, args, kwargs):
        """Run the decomposition with the mode re-entered, recording the ops it dispatches;
        later calls with the same signature replay them (numvar.instrument.replay), or
        take the op's compiled kernel (:data:`_FUSED`)."""
        key = RP.signature(func, args, kwargs)
        if key is None:
            return self._reenter(info.handler, *args, **kwargs)
        fused = _FUSED.get(func)
        fz = self.fz
        if fused is not None and fz._include is None and not fz._exclude:
            # (every sub-op rounded)
            return self._fused(fused, key, _fused_key(func, key, args, kwargs), info, args,
                               kwargs)
        return self._decompose_reference(key, info, args, kwargs)

    def _fused(self, fused, key, fkey, info: _OpInfo, args, kwargs):
        """A decomposed op through its compiled kernel: the first call with a signature runs
        the decomposition (recorded as usual) and notes the stream keys it drew and the
        counts of its sub-ops; later calls run ``fused(ctx, args, kwargs, nkeys)``, which
        draws as many keys and computes the same bits (or returns None: the
        decomposition runs under its own signature ``key``), and add those counts, so the
        report is the same. ``fkey``: the signature the kernel is taken under
        (:func:`_fused_key`)."""
        fz = self.fz
        seen = _FUSED_SEEN.get(fkey)
        if seen is not None:
            nkeys, delta = seen
            out = fused(fz._ctx, args, kwargs, nkeys)
            if out is not None:
                self._counted(delta)
                return out
            return self._decompose_reference(key, info, args, kwargs)
        stream = fz._ctx.stream
        c0 = stream.counter
        before = {cat: Counter(c) for cat, c in fz._counts.items()}
        out = self._decompose_reference(key, info, args, kwargs)
        delta = self._delta(before)
        if all(cat in _FUSABLE for cat, *_ in delta):
            _FUSED_SEEN[fkey] = (stream.counter - c0, delta)
        return out

    def _counted(self, delta) -> None:
        fz = self.fz
        for cat, name, n, how in delta:
            fz._counts[cat][name] += n
            if how is not None:
                fz._how[name] = how

    def _delta(self, before) -> list:
        fz = self.fz
        return [(cat, name, n - before[cat][name], fz._how.get(name))
                for cat, c in fz._counts.items() for name, n in c.items()
                if n != before[cat][name]]

    def _compute(self, func, *args):
        """One float op through its handler, as :meth:`_run` computes it, uncounted (for
        compiled paths that stand for a recorded sequence of ops)."""
        ctx = self.fz._ctx
        info = _classified(func, self.fz.config.granularity)
        if info.kind == K_HANDLER:
            out = info.handler(ctx, func, args, {})
            if out is not H.EXACT:
                return out
        return H.op_once(ctx, func, args, {})

    def _recurrent(self, name: str, torch_fn, args):
        """A ``torch._VF`` recurrent layer (:mod:`numvar.instrument.rnn_kernels`), called
        with this mode on the stack: the first call with a signature runs op by op and
        notes its keys and counts, then the compiled steps run from the same stream
        position and must give the same bits with as many keys; later calls take them and
        add those counts. NotImplemented: PyTorch runs the call (op by op)."""
        fz = self.fz
        ctx = fz._ctx
        if (self.depth or self._recorders or fz._filter is not None or fz._include is not None
                or fz._exclude or not RN.serves(ctx)):
            return NotImplemented
        layer = RN.parse(name, args)
        if layer is None:
            return NotImplemented
        # (a packed sequence's batch sizes are values: its ops' counts depend on them)
        key = (name, RP._key_of(args), getattr(layer, "batch_sizes", None),
               fz.config.granularity, ctx.code, ctx.contraction, torch.is_grad_enabled())
        seen = _RECURRENT_SEEN.get(key, False)
        if seen is None:
            return NotImplemented
        if seen is not False:
            with _pop_mode_temporarily():
                out = RN.run(ctx, self._compute, layer)
            self._counted(seen[1])
            return out
        stream = ctx.stream
        c0 = stream.counter
        before = {cat: Counter(c) for cat, c in fz._counts.items()}
        out = torch_fn(*args)  # op by op, through this mode
        c1 = stream.counter
        delta = self._delta(before)
        ok = all(cat in _FUSABLE for cat, *_ in delta)
        if ok:
            stream.counter = c0
            try:
                with _pop_mode_temporarily():
                    mine = RN.run(ctx, self._compute, layer)
                    ok = stream.counter == c1 and RN.same(out, mine)
            except Exception as e:  # noqa: BLE001 - the op-by-op result stands
                logger.debug("numvar: compiled %s steps failed (%s); op by op", name, e)
                ok = False
            finally:
                stream.counter = c1
        if not ok:
            logger.debug("numvar: %s %s runs op by op (compiled steps differ)", name, key[1])
        if len(_RECURRENT_SEEN) >= RP.MAX_PROGRAMS:
            _RECURRENT_SEEN.clear()
        _RECURRENT_SEEN[key] = (c1 - c0, delta) if ok else None
        return out

    def _decompose_reference(self, key, info: _OpInfo, args, kwargs):
        """The decomposition, replayed when recorded (the path of :meth:`_decompose`)."""
        prog = _PROGRAMS.get(key, False)
        if prog:
            self.depth += 1
            try:
                return RP.replay(prog, RP.flatten(args, kwargs), self._dispatch)
            finally:
                self.depth -= 1
        if prog is False and len(_PROGRAMS) < RP.MAX_PROGRAMS:
            rec = RP.Recorder(self.depth + 1, RP.flatten(args, kwargs))
            self._recorders.append(rec)
            try:
                out = self._reenter(info.handler, *args, **kwargs)
            finally:
                self._recorders.remove(rec)
            _PROGRAMS[key] = rec.finish(out)
            return out
        return self._reenter(info.handler, *args, **kwargs)

    def _run(self, func, info: _OpInfo, args, kwargs):
        fz = self.fz
        ctx = fz._ctx
        if info.functional is not None:
            return self._mutating(func, info, args, kwargs)
        kind = info.kind
        try:
            if kind == K_HANDLER:
                out = info.handler(ctx, func, args, kwargs)
                if out is H.EXACT:
                    fz._count("exact", info.name)
                    return func(*args, **kwargs)
            elif kind == K_DECOMP:
                fz._count("decomposed", info.name)
                return self._decompose(func, info, args, kwargs)
            elif kind == K_FOREACH:
                fz._count("decomposed", info.name)
                return self._reenter(info.handler, ctx, func, args, kwargs)
            else:  # K_F64, K_OPONCE
                out = H.op_once(ctx, func, args, kwargs)
        except (NotImplementedError, RuntimeError, TypeError) as e:
            fz._escape(info, f"runs natively, NOT perturbed ({type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})", e)
            fz._count("native", info.name)
            return func(*args, **kwargs)
        if kind == K_OPONCE and fz.config.granularity == "flop":
            fz._escape(info, ROUNDED_ONCE)
        name = info.name  # (fz._count("instrumented", name, info.how) inlined)
        fz._instrumented[name] += 1
        fz._how[name] = info.how
        return out

    def _below(self, func, args, kwargs):
        """``func`` dispatched one level down, as with the mode re-entered
        (:meth:`_reenter`) but without the mode's push and pop and the dispatcher's
        round trip: for arguments in the form torch hands them to ``__torch_dispatch__``."""
        self.depth += 1
        try:
            return self._dispatch(func, args, kwargs)
        finally:
            self.depth -= 1

    def _mutating(self, func, info: _OpInfo, args, kwargs):
        """In-place / out= op: compute functionally (through the mode), copy into place."""
        fz = self.fz
        fz._count("decomposed", info.name)
        call = self._below if info.direct else self._functional_reentered
        if info.inplace:
            res = call(info.functional, args, kwargs)
            dest = args[0]
            if isinstance(dest, (list, tuple)):  # e.g. a list op returning new tensors
                for d, r in zip(dest, res):
                    d.copy_(r)
                return None
            dest.copy_(res)  # this mode is popped here: the copy itself is not seen
            return dest
        kw = {k: v for k, v in kwargs.items() if k not in info.out_args}
        res = call(info.functional, args, kw)
        outs = [kwargs[k] for k in info.out_args]
        res_l = list(res) if isinstance(res, (tuple, list)) else [res]
        for o, r in zip(outs, res_l):
            for oo, rr in (zip(o, r) if isinstance(o, (list, tuple)) else ((o, r),)):
                if oo.shape != rr.shape:
                    oo.resize_(rr.shape)
                oo.copy_(rr)
        return outs[0] if len(outs) == 1 else tuple(outs)


def _route_recurrent(name: str, torch_fn, args):
    """:class:`numvar.instrument.rnn_kernels.patched`'s route: the calling thread's fuzzy
    block when its mode is on top of the stack, else NotImplemented (PyTorch runs it)."""
    mode = _get_current_dispatch_mode()
    if type(mode) is not FuzzyMode:
        return NotImplemented
    return mode._recurrent(name, torch_fn, args)


class Fuzzy:
    """A fuzzy block: ``with Fuzzy(config) as fz: ...; fz.report()``.

    ``Fuzzy(config)`` runs a :class:`FuzzyConfig` (e.g. ``FuzzyConfig.from_env()``;
    ``Fuzzy(config.replace(seed=s))`` for another seed). Each entry starts a
    fresh random stream from ``config.seed``, so the same seed reproduces a realization
    bit for bit. The report accumulates over entries; the escape warning at the end of
    each entry lists that entry's escapes.
    """

    def __init__(self, config: FuzzyConfig, *, backend: str = "auto") -> None:
        self.config = config
        self.backend = backend  # numvar.rounding backend of elementwise roundings
        # per category, op name -> calls (defaultdicts: a block is made per forward, and
        # seven Counters cost 4 µs of it)
        self._counts: dict[str, defaultdict[str, int]] = {k: defaultdict(int) for k in (
            "instrumented", "decomposed", "native", "exact", "excluded", "outside_modules",
            "escaped")}
        self._exact = self._counts["exact"]  # (the two most frequent, for the hot path)
        self._instrumented = self._counts["instrumented"]
        self._how: dict[str, str] = {}
        self._reasons: dict[str, str] = {}  # escaped op -> why, and where first seen
        self._block: Counter = Counter()  # escapes of the current entry
        self._modules: _ModuleStack | None = None
        self._include = O.expand_kinds(config.include) if config.include is not None else None
        self._exclude = O.expand_kinds(config.exclude)
        unknown = [g for g in (config.include or ()) if not _looks_like_op_glob(g)]
        if unknown:
            raise ConfigError(f"include: {unknown[0]!r} is neither an op kind "
                              f"({', '.join(O.OP_KINDS)}) nor an aten-name glob (aten.*)")
        bad = [g for g in config.exclude if not _looks_like_op_glob(g)]
        if bad:
            raise ConfigError(f"exclude: {bad[0]!r} is neither an op kind "
                              f"({', '.join(O.OP_KINDS)}) nor an aten-name glob (aten.*)")
        # OpOverload -> (_OpInfo, included, excluded), shared with every block of this
        # granularity and selection (_INFOS)
        self._infos: dict = _INFOS.setdefault(
            (config.granularity, self._include, self._exclude), {})
        self._filter: _ModuleFilter | None = None
        self._ctx: Ctx | None = None
        self._mode: FuzzyMode | None = None
        self._codepath = None
        self._recurrent = None  # numvar.instrument.rnn_kernels.patched, while open

    def _selection(self, func) -> tuple[bool, bool]:
        key = (func, self._include, self._exclude)
        sel = _SELECTED.get(key)
        if sel is None:
            included = True if self._include is None else O.op_matches(func, self._include)
            excluded = bool(self._exclude) and O.op_matches(func, self._exclude)
            sel = _SELECTED[key] = (included, excluded)
        return sel

    def _count(self, cat: str, name: str, how: str | None = None) -> None:
        self._counts[cat][name] += 1
        if how is not None:
            self._how[name] = how

    def _escape(self, info: _OpInfo, reason: str, error: BaseException | None = None) -> None:
        """An op is not perturbed as asked: count it, or raise under ``strict``."""
        name = info.name
        if self.config.strict:
            where = self._modules.where() if self._modules is not None else "?"
            raise UninstrumentedOpError(
                f"numvar (strict): {name} in {where}: {reason}. To fix: give it a "
                f"handler (numvar.instrument.handlers) or a decomposition "
                f"(numvar.instrument.ops.DECOMPOSED_OPS); or accept it running natively with "
                f"exclude=['{info.packet}']; or use granularity='op' or strict=False "
                f"(`numvar ops` shows how every op is handled)",
                op=name, module=where, reason=reason) from error
        self._count("escaped", name)
        self._block[name] += 1
        self._reasons.setdefault(name, reason)

    def _handler_escape(self, func, reason: str) -> None:
        """``Ctx.on_escape``: a handler fell back below flop granularity."""
        self._escape(_OpInfo(O.full_name(func), O.packet_name(func), K_OPONCE), reason)

    @property
    def stream(self) -> R.Stream | None:
        return None if self._ctx is None else self._ctx.stream

    def __enter__(self) -> Fuzzy:
        if self._mode is not None:
            raise ConfigError("this fuzzy block is already active")
        if any(isinstance(m, FuzzyMode) for m in _get_current_dispatch_mode_stack()):
            raise ConfigError("numvar.fuzzy blocks cannot be nested")
        c = self.config
        heap.keep_freed_memory()  # (once per process: numvar.instrument.heap)
        prefault.fault_in_gelu_constants()  # (once per process: numvar.instrument.prefault)
        self._ctx = Ctx(c.mode, c.granularity, c.precision, R.Stream(c.seed), self.backend,
                        on_escape=self._handler_escape, contraction=c.contraction,
                        format=c.format, accumulate=c.accumulate)
        if c.modules is not None:
            self._filter = _ModuleFilter(c.modules, c.model)
            self._filter.install()
        if c.strict:  # global module hooks cost ~8 µs per module call: only when asked
            self._modules = _ModuleStack(c.model)
            self._modules.install()
        self._block = Counter()
        # fused kernels without a decomposition (SDPA flash, MHA fast path, mkldnn RNN)
        # off: the composite paths run (numvar.instrument.paths)
        self._codepath = codepath()
        self._codepath.__enter__()
        self._recurrent = RN.patched(_route_recurrent)
        self._recurrent.__enter__()
        self._mode = FuzzyMode(self)
        self._mode.__enter__()
        heap.block_entered()  # (large blocks from the heap while blocks are active)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._mode is not None:
                heap.block_exited()
                self._mode.__exit__(*exc)
        finally:
            self._mode = None
            if self._codepath is not None:
                self._codepath.__exit__(*exc)
                self._codepath = None
            if self._recurrent is not None:
                self._recurrent.__exit__(*exc)
                self._recurrent = None
            if self._filter is not None:
                self._filter.remove()
            if self._modules is not None:
                self._modules.remove()
                self._modules = None
        if self._block:
            logger.warning("numvar: %s\n(strict=True raises at the first of them, naming "
                           "its module; `numvar ops` shows how each op is handled)",
                           escape_summary(self._block, self._reasons, self.config.granularity))
        return None

    def report(self) -> FuzzyReport:
        """Which aten ops ran instrumented (with counts and how) and which ran natively."""
        c = self._counts
        return FuzzyReport(
            mode=self.config.mode, granularity=self.config.granularity,
            instrumented=dict(c["instrumented"]), how=dict(self._how),
            decomposed=dict(c["decomposed"]), native=dict(c["native"]), exact=dict(c["exact"]),
            excluded=dict(c["excluded"]), outside_modules=dict(c["outside_modules"]),
            escaped=dict(c["escaped"]), escape_reasons=dict(self._reasons),
        )

    @property
    def matched_modules(self) -> set[str]:
        """Module paths that matched ``modules`` so far (empty without ``modules``)."""
        return set() if self._filter is None else set(self._filter.matched)


def _looks_like_op_glob(g: str) -> bool:
    return g in O.OP_KINDS or "." in g or "*" in g


def fuzzy(mode: str = "sr", granularity: str = "flop", precision: int | None = None,
          seed: int = 0, exclude=(), include=None, modules=None, model=None,
          strict: bool = False, contraction: str = "separate", format=None,
          accumulate: str = "native") -> Fuzzy:
    """Instrument every aten op run in the ``with`` block (forward, backward, optimizer).

    ``mode``: ieee | sr | ud | random | up | down | zero | farthest; ``granularity``:
    flop | op; ``precision``: virtual precision in bits (None: the format's own);
    ``format``: a :class:`numvar.Format` or its name (``"e4m3fn"``, ``"bfloat16"``,
    ``"custom:7,5"``): every op result (op) or every flop (flop) rounded to it, the
    tensors keeping their dtype; ``accumulate``: ``"native"`` (default: contractions and
    reductions below binary32 accumulate in binary32 under the mode, their result
    rounded once to the format) or ``"same"`` (every partial sum rounded to the format);
    ``seed``: the realization's seed;
    ``exclude``/``include``: globs over aten op names or op kinds of :data:`OP_KINDS`
    (include selects the outermost ops; the sub-ops of a selected decomposition follow
    it, exclusions apply at every level); ``modules``: globs over ``named_modules()``
    paths of ``model`` (or of the outermost module called), so that only ops run inside
    those modules' forward, and their backward, are perturbed; ``strict``: raise
    :class:`numvar.errors.UninstrumentedOpError` at the first op that would run natively
    or below the requested granularity (default: run it, and list it in the block's
    summary warning and in :meth:`Fuzzy.report`). ``contraction``
    (flop): ``"separate"`` (every product and add of a contraction rounded) or ``"fma"``
    (one rounding per multiply-add, the product exact).
    """
    return Fuzzy(FuzzyConfig(mode=mode, granularity=granularity, precision=precision, seed=seed,
                             exclude=exclude, include=include, modules=modules, model=model,
                             strict=strict, contraction=contraction, format=format,
                             accumulate=accumulate))
