"""The candidate set of ``numvar locate``: which modules and op kinds can be blamed.

One IEEE forward pass runs under a recording dispatch mode; each aten op is attributed to
the innermost *leaf* module running it (a module without children), and classified into
an op kind of :data:`numvar.instrument.OP_KINDS` (conv, matmul, softmax, norm, pointwise,
transcendental, reduction) by its globs, or ``other`` when it is in no kind. An op counts
as *float compute* when it returns a floating-point tensor and is not one of the
instrumentation's exact ops (``numvar.instrument.ops.EXACT_OPS``: data movement, copies,
comparisons, max, abs, relu, ...), which are never perturbed and cannot cost digits.

Candidates:

- ``by="module"``: the leaf modules that ran at least one float-compute op, in order of
  first call. Leaf modules without float compute (``Flatten``, ``Dropout`` in eval,
  ``Identity``, ``Embedding``) are left out: perturbing them changes nothing. Containers
  are not candidates (their time is their children's); float ops a container runs in
  its own ``forward`` (e.g. a residual ``x + f(x)``) or that run outside any module are
  counted as *unattributed*: they stay IEEE in every module-mode evaluation.
- ``by="op"``: the op kinds that occurred, in :data:`OP_KINDS` order.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

UNATTRIBUTED = "(unattributed)"


@dataclass
class Candidate:
    """A module path (``features.3``, class ``Conv2d``) or an op kind (``conv``)."""

    name: str
    kind: str                       # "module" | "op"
    cls: str                        # module class, or "op kind"
    ops: dict[str, int] = field(default_factory=dict)   # op kind -> calls recorded

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "class": self.cls, "ops": dict(self.ops)}


def op_names(func: Any) -> tuple[str, ...]:
    """Spellings of an aten op that globs may use: ``aten.addmm`` (the form of
    :data:`~numvar.instrument.OP_KINDS`), ``addmm``, ``addmm.default``,
    ``aten.addmm.default``, ``aten::addmm``."""
    names = []
    packet = getattr(func, "_overloadpacket", None)
    if packet is not None:
        names.append(str(packet))
        names.append(getattr(packet, "__name__", ""))
    names.append(getattr(func, "__name__", ""))
    names.append(str(func))
    try:
        names.append(func.name())
    except Exception:  # not an OpOverload
        pass
    return tuple(n for n in names if n)


OTHER = "other"


def classify(func: Any, op_kinds: Mapping[str, Sequence[str]],
             exact_ops: frozenset[str] = frozenset()) -> str | None:
    """The first op kind whose globs match one spelling of ``func``; None for an exact
    op (its ``aten.name`` in ``exact_ops``); ``"other"`` for an op in no kind."""
    names = op_names(func)
    if exact_ops and names and names[0] in exact_ops:
        return None
    for kind, globs in op_kinds.items():
        for g in globs:
            if any(fnmatch.fnmatchcase(n, g) for n in names):
                return kind
    return OTHER if exact_ops else None


class _Recorder(TorchDispatchMode):
    def __init__(self, stack: list[str], op_kinds: Mapping[str, Sequence[str]],
                 exact_ops: frozenset[str]):
        super().__init__()
        self.stack = stack
        self.op_kinds = op_kinds
        self.exact_ops = exact_ops
        self.counts: dict[str, dict[str, int]] = {}
        self.other: set[str] = set()
        self._kind_cache: dict[Any, str | None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in self._kind_cache:
            self._kind_cache[func] = classify(func, self.op_kinds, self.exact_ops)
        kind = self._kind_cache[func]
        if kind is not None and any(isinstance(t, torch.Tensor) and t.is_floating_point()
                                    for t in tree_leaves(out)):
            owner = self.stack[-1] if self.stack else UNATTRIBUTED
            d = self.counts.setdefault(owner, {})
            d[kind] = d.get(kind, 0) + 1
            if kind == OTHER:
                self.other.add(op_names(func)[0])
        return out


@dataclass
class Discovery:
    """What one recorded IEEE forward found: candidates and unattributed op counts."""

    modules: list[Candidate]
    op_kinds: list[Candidate]
    unattributed: dict[str, int]
    classes: dict[str, str]
    output: Any = None              # the IEEE output of the recorded forward
    other_ops: tuple[str, ...] = ()  # aten names of the float ops in no kind ("other")

    def kind_globs(self, op_kinds: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
        """``op_kinds`` plus ``"other"`` -> the observed op names in no kind."""
        out = {k: tuple(v) for k, v in op_kinds.items()}
        if self.other_ops:
            out[OTHER] = tuple(self.other_ops)
        return out


def default_exact_ops() -> frozenset[str]:
    """The instrumentation's never-perturbed ops (empty if it exposes none: then only
    ops of :data:`OP_KINDS` count as float compute)."""
    try:
        from ..instrument.ops import EXACT_OPS
    except ImportError:
        return frozenset()
    return frozenset(EXACT_OPS)


def discover(model: torch.nn.Module, inputs: Sequence[Any],
             op_kinds: Mapping[str, Sequence[str]] | None = None,
             exact_ops: frozenset[str] | None = None) -> Discovery:
    """Run ``model(*inputs)`` once (no grad, IEEE) and record float compute per leaf.

    ``op_kinds`` defaults to :data:`numvar.instrument.OP_KINDS`, ``exact_ops`` to
    :func:`default_exact_ops`.
    """
    if op_kinds is None:
        from ..instrument import OP_KINDS as op_kinds  # noqa: N811
    if exact_ops is None:
        exact_ops = default_exact_ops()
    leaves = {id(m): p for p, m in model.named_modules() if p and not any(True for _ in m.children())}
    if not leaves and not any(True for _ in model.children()):
        leaves = {id(model): ""}     # a single leaf module as the whole model
    classes = {p: type(m).__name__ for p, m in model.named_modules()}
    stack: list[str] = []
    order: list[str] = []
    handles = []

    def pre(mod, args):
        path = leaves[id(mod)]
        stack.append(path)
        if path not in order:
            order.append(path)

    def post(mod, args, output):
        if stack:
            stack.pop()

    for p, m in model.named_modules():
        if id(m) in leaves:
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post, always_call=True))
    rec = _Recorder(stack, op_kinds, frozenset(exact_ops))
    try:
        with torch.no_grad(), rec:
            output = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    modules = [Candidate(name=p, kind="module", cls=classes.get(p, type(model).__name__),
                         ops=rec.counts[p]) for p in order if rec.counts.get(p)]
    totals: dict[str, int] = {}
    for d in rec.counts.values():
        for k, v in d.items():
            totals[k] = totals.get(k, 0) + v
    kinds = [Candidate(name=k, kind="op", cls="op kind", ops={k: totals[k]})
             for k in (*op_kinds, OTHER) if totals.get(k)]
    return Discovery(modules=modules, op_kinds=kinds,
                     unattributed=dict(rec.counts.get(UNATTRIBUTED, {})), classes=classes,
                     output=output, other_ops=tuple(sorted(rec.other)))


def glob_escape(path: str) -> str:
    """A glob matching exactly ``path`` under fnmatch (``[``, ``*``, ``?`` escaped)."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in path)
