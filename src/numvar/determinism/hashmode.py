"""HashMode: a strong, order-sensitive hash of every aten op's outputs, in call order.

Two runs of the same program are bitwise identical exactly when (up to xxh3-128
collisions) their op sequences and hashes agree; the first op where they part ways is
where determinism broke. Outputs of ``empty*`` ops (uninitialised memory) are not hashed.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

from ._modes import quiet_below
from ._ops import flat, get_arg, is_uninitialized, mutable_args, op_name
from ._stack import Frame, format_frames, frames_from_json, op_stack
from ._tensors import describe, hash_value

__all__ = ["HashMode", "OpRecord", "OpDivergence", "compare_sequences"]

log = logging.getLogger(__name__)


@dataclass
class OpRecord:
    """One op call: position, name, occurrence of that name, hash of its outputs."""

    index: int
    op: str
    occurrence: int
    hash: str | None                 # None for uninitialised outputs (empty*)
    outputs: list[dict[str, Any]]    # dtype/shape of each output leaf
    stack: int | None = None         # index into the stack table, when recorded

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "op": self.op, "occurrence": self.occurrence,
                "hash": self.hash, "outputs": self.outputs, "stack": self.stack}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "OpRecord":
        return cls(int(d["index"]), str(d["op"]), int(d["occurrence"]),
                   None if d.get("hash") is None else str(d["hash"]),
                   list(d.get("outputs") or []),
                   None if d.get("stack") is None else int(d["stack"]))


@dataclass
class OpDivergence:
    """Where an op sequence departs from the reference's."""

    index: int
    kind: str                         # "hash", "op" (a different op ran), "extra", "missing"
    op: str | None                    # this run's op (None when missing)
    reference_op: str | None          # the reference's op (None when extra)
    occurrence: int | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    reference_outputs: list[dict[str, Any]] = field(default_factory=list)
    stack: list[Frame] = field(default_factory=list)
    reference_stack: list[Frame] = field(default_factory=list)

    def format(self, limit: int | None = 8) -> str:
        occ = f" (call #{self.occurrence} of it)" if self.occurrence is not None else ""
        if self.kind == "hash":
            head = (f"op #{self.index} {self.op}{occ}: outputs differ bitwise from the reference"
                    f" ({_shapes(self.outputs)})")
        elif self.kind == "op":
            head = (f"op #{self.index}: this run called {self.op}, the reference called "
                    f"{self.reference_op} (the op sequences diverge here)")
        elif self.kind == "extra":
            head = f"op #{self.index} {self.op}: extra op, the reference run had ended"
        else:
            head = f"op #{self.index} {self.reference_op}: missing, this run ended before it"
        parts = [head]
        if self.kind != "missing":
            parts.append("this run:\n" + format_frames(self.stack, limit))
        if self.kind != "extra":
            parts.append("reference:\n" + format_frames(self.reference_stack, limit))
        return "\n".join(parts)

    __str__ = format

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "op": self.op,
                "reference_op": self.reference_op, "occurrence": self.occurrence,
                "outputs": self.outputs, "reference_outputs": self.reference_outputs,
                "stack": [f.to_json() for f in self.stack],
                "reference_stack": [f.to_json() for f in self.reference_stack]}


def _shapes(outs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{o.get('dtype', o.get('type'))}{o.get('shape', '')}" for o in outs) or "-"


def _hash_leaves(leaves: list[Any], out: Any) -> str:
    h = xxhash.xxh3_128()
    h.update(f"{type(out).__name__}|{len(leaves)}|".encode())  # the op fixes the rest
    for x in leaves:
        try:
            token = hash_value(x)
        except Exception as exc:  # exotic tensor subclasses: never break the user's run
            if type(x) not in _warned:
                _warned.add(type(x))
                log.warning("HashMode cannot hash a %s (%s); it counts as its type only",
                            type(x).__name__, exc)
            token = f"unhashable:{type(x).__module__}.{type(x).__qualname__}"
        h.update(token.encode())
    return h.hexdigest()


_warned: set[type] = set()


class HashMode(TorchDispatchMode):
    """Hash every op's outputs (and the arguments it writes), in call order.

    ``mode.records``: one :class:`OpRecord` per op; ``mode.counts``: calls per op name.
    ``record_stacks=True`` stores each op's user stack (deduplicated in ``mode.stacks``).
    With ``reference`` (a sequence of :class:`OpRecord` and its stack table), each op is
    compared as it runs and ``mode.first_divergence`` gets this run's live stack.
    """

    def __init__(self, *, record_stacks: bool = False,
                 reference: Sequence[OpRecord] | None = None,
                 reference_stacks: Sequence[Sequence[Frame]] = ()) -> None:
        super().__init__()
        self.record_stacks = record_stacks
        self.records: list[OpRecord] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.stacks: list[list[Frame]] = []
        self._stack_ids: dict[tuple[Frame, ...], int] = {}
        self.reference = list(reference) if reference is not None else None
        self.reference_stacks = [list(s) for s in reference_stacks]
        self.first_divergence: OpDivergence | None = None
        self.n_differing = 0           # ops whose hashes differ while sequences align
        self._aligned = True

    @property
    def sequence(self) -> list[str]:
        """Op names in call order."""
        return [r.op for r in self.records]

    def _stack_id(self, frames: list[Frame]) -> int:
        key = tuple(frames)
        i = self._stack_ids.get(key)
        if i is None:
            i = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(list(frames))
        return i

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = op_name(func)
        occ = self.counts[name]
        self.counts[name] += 1
        leaves = flat(out) if out is not None else []
        for pos, an, kwo in mutable_args(func):  # written args not returned
            v = get_arg(args, kwargs, pos, an, kwo)
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor) and all(t is not x for x in leaves):
                    leaves.append(t)
        with quiet_below():
            h = None if is_uninitialized(func) else _hash_leaves(leaves, out)
            rec = OpRecord(len(self.records), name, occ, h, [describe(x) for x in leaves])
            if self.record_stacks:
                rec.stack = self._stack_id(op_stack()[0])
            self.records.append(rec)
            if self.reference is not None and self._aligned:
                self._check(rec)
        return out

    def _ref_stack(self, r: OpRecord) -> list[Frame]:
        if r.stack is not None and 0 <= r.stack < len(self.reference_stacks):
            return self.reference_stacks[r.stack]
        return []

    def _check(self, rec: OpRecord) -> None:
        ref = self.reference
        assert ref is not None
        if rec.index >= len(ref):
            self._aligned = False
            self._diverge(OpDivergence(rec.index, "extra", rec.op, None, rec.occurrence,
                                       rec.outputs))
            return
        r = ref[rec.index]
        if r.op != rec.op:
            self._aligned = False
            self._diverge(OpDivergence(rec.index, "op", rec.op, r.op, rec.occurrence,
                                       rec.outputs, r.outputs, reference_stack=self._ref_stack(r)))
        elif r.hash != rec.hash:
            self.n_differing += 1
            self._diverge(OpDivergence(rec.index, "hash", rec.op, r.op, rec.occurrence,
                                       rec.outputs, r.outputs, reference_stack=self._ref_stack(r)))

    def _diverge(self, d: OpDivergence) -> None:
        if self.first_divergence is None:
            d.stack = (self.stacks[self.records[d.index].stack]
                       if self.records[d.index].stack is not None else op_stack()[0])
            self.first_divergence = d

    def finish(self) -> OpDivergence | None:
        """After the run: report a reference longer than this run as 'missing'."""
        if (self.reference is not None and self.first_divergence is None
                and len(self.records) < len(self.reference)):
            r = self.reference[len(self.records)]
            self.first_divergence = OpDivergence(r.index, "missing", None, r.op, r.occurrence,
                                                 [], r.outputs,
                                                 reference_stack=self._ref_stack(r))
        return self.first_divergence

    def to_json(self) -> dict[str, Any]:
        return {"n_ops": len(self.records), "counts": dict(self.counts),
                "ops": [r.to_json() for r in self.records],
                "stacks": [[f.to_json() for f in s] for s in self.stacks]}

    @staticmethod
    def records_from_json(d: dict[str, Any]) -> tuple[list[OpRecord], list[list[Frame]]]:
        return ([OpRecord.from_json(x) for x in d.get("ops", [])],
                [frames_from_json(s) for s in d.get("stacks", [])])


def compare_sequences(reference: Sequence[OpRecord], run: Sequence[OpRecord],
                      reference_stacks: Sequence[Sequence[Frame]] = (),
                      stacks: Sequence[Sequence[Frame]] = ()) -> list[OpDivergence]:
    """Offline comparison of two recorded op sequences: every op whose hash differs while
    the sequences align, then the point where they stop aligning (if any)."""
    def st(table, r):
        return list(table[r.stack]) if r.stack is not None and r.stack < len(table) else []

    out: list[OpDivergence] = []
    for i in range(max(len(reference), len(run))):
        if i >= len(run):
            r = reference[i]
            out.append(OpDivergence(i, "missing", None, r.op, r.occurrence, [], r.outputs,
                                    reference_stack=st(reference_stacks, r)))
            break
        x = run[i]
        if i >= len(reference):
            out.append(OpDivergence(i, "extra", x.op, None, x.occurrence, x.outputs,
                                    stack=st(stacks, x)))
            break
        r = reference[i]
        if r.op != x.op:
            out.append(OpDivergence(i, "op", x.op, r.op, x.occurrence, x.outputs, r.outputs,
                                    st(stacks, x), st(reference_stacks, r)))
            break
        if r.hash != x.hash:
            out.append(OpDivergence(i, "hash", x.op, r.op, x.occurrence, x.outputs, r.outputs,
                                    st(stacks, x), st(reference_stacks, r)))
    return out

