"""BitwiseEquivalenceMode: run every aten op twice and compare the results bit for bit.

An op whose two executions on the same inputs (and the same generator states) differ
is nondeterministic: atomics in a reduction, an uninitialised read, a custom kernel
drawing fresh noise. The record names the op, the differing output and the user-code
stack of the forward call, also for ops run in backward (autograd's anomaly-mode trace).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ..errors import NondeterminismError
from ._modes import quiet_below
from ._ops import flat, get_arg, is_uninitialized, mutable_args, op_name, runs_once, shape_of
from ._rng import RngSnapshot
from ._stack import Frame, format_frames, op_stack
from ._tensors import diff_tensors, values_equal

__all__ = ["BitwiseEquivalenceMode", "Mismatch"]

log = logging.getLogger(__name__)


@dataclass
class Mismatch:
    """One op whose two executions differed."""

    op: str
    output: int | str            # index in the flattened outputs, or "arg:<name>"
    shapes: tuple[list[int], list[int]] | None
    dtypes: tuple[str, str] | None
    n_differing: int             # -1 when shapes/dtypes/types differ
    max_abs_diff: float
    stack: list[Frame] = field(default_factory=list)   # forward call, outermost first
    in_backward: bool = False
    autograd_node: str | None = None
    note: str = ""

    def format(self, limit: int | None = 8) -> str:
        where = f" in backward ({self.autograd_node})" if self.in_backward else ""
        head = f"nondeterministic op {self.op}{where}, output {self.output}"
        if self.n_differing >= 0 and self.shapes is not None:
            n_el = math.prod(self.shapes[0]) if self.shapes[0] else 1
            head += (f": {self.n_differing} of {n_el} element(s) differ, "
                     f"max |diff| {self.max_abs_diff:.6g}")
        if self.shapes is not None:
            head += f"; shapes {self.shapes[0]} / {self.shapes[1]}"
        if self.dtypes is not None:
            head += f", dtypes {self.dtypes[0]} / {self.dtypes[1]}"
        if self.note:
            head += f" ({self.note})"
        label = "forward call (recorded by autograd)" if self.in_backward else "call"
        return f"{head}\n{label}:\n{format_frames(self.stack, limit)}"

    __str__ = format

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "output": self.output,
                "shapes": None if self.shapes is None else [list(x) for x in self.shapes],
                "dtypes": None if self.dtypes is None else list(self.dtypes),
                "n_differing": self.n_differing,
                "max_abs_diff": None if math.isnan(self.max_abs_diff) else self.max_abs_diff,
                "stack": [f.to_json() for f in self.stack], "in_backward": self.in_backward,
                "autograd_node": self.autograd_node, "note": self.note}


def _storage_key(t: torch.Tensor) -> Any:
    return t.untyped_storage()._cdata


def _same_layout_on(t: torch.Tensor, storage: Any) -> torch.Tensor:
    """A tensor with t's dtype, size, stride and storage offset on ``storage``."""
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    out.set_(storage, t.storage_offset(), t.size(), t.stride())
    return out


def _plain(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_quantized
            and t.device.type != "meta")


class BitwiseEquivalenceMode(TorchDispatchMode):
    """Run each aten op twice and compare all outputs bitwise.

    ``with BitwiseEquivalenceMode() as mode: ...`` then ``mode.get_mismatches()``.

    - In-place and ``out=`` ops: every storage an op writes to is cloned (same strides
      and storage offset) before the first run; the second run works on the clones,
      together with every other input viewing those storages.
    - Random ops: the CPU generator, every initialised CUDA generator and generators
      passed explicitly are restored before the second run and set back to their state
      after the first run, so results and the RNG stream match a plain run.
    - ``backward_stacks=True`` turns on autograd anomaly mode (``check_nan=False``) for
      the block so backward ops can name their forward call; the previous anomaly setting
      is restored on exit. Warning filters are never touched.
    - ``raise_on_mismatch=True`` raises :class:`NondeterminismError` (``.record`` is the
      :class:`Mismatch`) at the first mismatch.
    """

    def __init__(self, raise_on_mismatch: bool = False, *, backward_stacks: bool = True,
                 check_rng: bool = True) -> None:
        super().__init__()
        self.raise_on_mismatch = raise_on_mismatch
        self.backward_stacks = backward_stacks
        self.check_rng = check_rng
        self.mismatches: list[Mismatch] = []
        self.ops_checked = 0
        self.ops_run_once = 0
        self._anomaly_stack: list[tuple[bool, bool]] = []

    # -- context -------------------------------------------------------------------------
    def __enter__(self) -> "BitwiseEquivalenceMode":
        prev = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        self._anomaly_stack.append(prev)
        if self.backward_stacks and not prev[0]:
            torch.set_anomaly_enabled(True, False)
        try:
            return super().__enter__()
        except BaseException:
            torch.set_anomaly_enabled(*self._anomaly_stack.pop())
            raise

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        try:
            super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            torch.set_anomaly_enabled(*self._anomaly_stack.pop())

    # -- results -------------------------------------------------------------------------
    def get_mismatches(self) -> list[Mismatch]:
        """Mismatches in the order they occurred."""
        return list(self.mismatches)

    def report(self, limit: int | None = 8) -> str:
        if not self.mismatches:
            return f"bitwise identical: {self.ops_checked} op(s) run twice, no mismatch"
        parts = [f"{len(self.mismatches)} mismatch(es) in {self.ops_checked} op(s) run twice"]
        parts += [m.format(limit) for m in self.mismatches]
        return "\n\n".join(parts)

    # -- dispatch ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if runs_once(func):
            self.ops_run_once += 1
            return func(*args, **kwargs)
        flat_in = flat(args)
        if kwargs:
            flat(kwargs, flat_in)
        # Storages the op writes to: clone them (whole storage, so offsets/strides hold).
        written: list[tuple[str, torch.Tensor]] = []
        for pos, name, kwo in mutable_args(func):
            v = get_arg(args, kwargs, pos, name, kwo)
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor):
                    written.append((name, t))
        args2, kwargs2, written2 = args, kwargs, []
        if written:
            with quiet_below():
                args2, kwargs2, written2 = self._rebase(args, kwargs, written)

        generators = RngSnapshot.generators(flat_in)
        s0 = RngSnapshot(generators)
        out1 = func(*args, **kwargs)
        s1 = RngSnapshot(generators)
        s0.restore()
        try:
            out2 = func(*args2, **kwargs2)
        except Exception as exc:  # the first run succeeded: the op is not a function
            s1.restore()
            self._record(func, "-", None, None, -1, math.nan,
                         f"second run raised {type(exc).__name__}: {exc}")
            return out1
        s2 = RngSnapshot(generators) if self.check_rng else None
        s1.restore()
        self.ops_checked += 1
        if is_uninitialized(func):
            return out1
        with quiet_below():
            self._compare(func, out1, out2, written, written2)
            if s2 is not None and not s1.equals(s2):
                self._record(func, "rng", None, None, -1, math.nan,
                             "the two runs advanced a random generator differently")
        return out1

    def _rebase(self, args, kwargs, written):
        """Copies of args/kwargs in which every tensor sharing a written storage views a
        clone of that storage instead."""
        clones: dict[Any, Any] = {}
        fallback: dict[int, torch.Tensor] = {}
        for _, t in written:
            if _plain(t):
                key = _storage_key(t)
                if key not in clones:
                    clones[key] = t.untyped_storage().clone()
            else:  # sparse / quantized / meta: a plain clone is the best we can do
                fallback[id(t)] = t.clone()

        def sub(x):
            if not isinstance(x, torch.Tensor):
                return x
            if id(x) in fallback:
                return fallback[id(x)]
            if _plain(x):
                st = clones.get(_storage_key(x))
                if st is not None:
                    return _same_layout_on(x, st)
            return x

        memo: dict[int, Any] = {}

        def sub_memo(x):
            if isinstance(x, torch.Tensor):
                r = memo.get(id(x))
                if r is None:
                    r = memo[id(x)] = sub(x)
                return r
            return x

        args2 = tree_map(sub_memo, args)
        kwargs2 = tree_map(sub_memo, kwargs)
        written2 = [(name, sub_memo(t)) for name, t in written]
        return args2, kwargs2, written2

    def _compare(self, func, out1, out2, written, written2) -> None:
        f1, f2 = flat(out1), flat(out2)
        if len(f1) != len(f2) or shape_of(out1) != shape_of(out2):
            self._record(func, "-", None, None, -1, math.nan,
                         f"output structures differ: {shape_of(out1)} vs {shape_of(out2)}")
            return
        seen = set()
        for i, (x, y) in enumerate(zip(f1, f2)):
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                seen.add(id(x))
                d = diff_tensors(x, y)
                if d is not None:
                    self._record(func, i, d.shapes, d.dtypes, d.n_differing, d.max_abs_diff,
                                 d.note)
            elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                self._record(func, i, None, None, -1, math.nan,
                             f"output types differ: {type(x).__name__} vs {type(y).__name__}")
            elif not values_equal(x, y):
                self._record(func, i, None, None, -1, math.nan, f"values differ: {x!r} vs {y!r}")
        # Written arguments the op does not return (foreach ops, multi-out ops).
        for (name, a), (_, b) in zip(written, written2):
            if id(a) in seen or a is b:
                continue
            d = diff_tensors(a, b)
            if d is not None:
                self._record(func, f"arg:{name}", d.shapes, d.dtypes, d.n_differing,
                             d.max_abs_diff, d.note)

    def _record(self, func, output, shapes, dtypes, n, maxdiff, note) -> None:
        frames, node = op_stack()
        m = Mismatch(op=op_name(func), output=output, shapes=shapes, dtypes=dtypes,
                     n_differing=n, max_abs_diff=maxdiff, stack=frames,
                     in_backward=node is not None, autograd_node=node, note=note)
        self.mismatches.append(m)
        log.info("%s", m.format())
        if self.raise_on_mismatch:
            raise NondeterminismError(m.format(), m)
