"""Recorded decompositions: run a torch decomposition's Python once per input signature,
then replay the aten ops it dispatched.

At ``flop`` granularity an op such as ``native_layer_norm`` is decomposed (its torch
decomposition runs with the mode re-entered, so that every sub-op is rounded). The
decomposition's Python (reference implementations, type promotion wrappers, checks) costs
more than the arithmetic of the small tensors of a model. For a given input signature
(every tensor's dtype, device, shape, strides, storage offset and ``requires_grad``; every
other argument's type and value; the default dtype and grad mode; which arguments are
the same tensor) a decomposition dispatches the same sequence of ops with the same
non-tensor arguments, each tensor argument being an input, the output of an earlier op
or a constant. :class:`Recorder` writes that sequence down while the decomposition runs;
:func:`replay` later sends the same ops, in the same order, with the same arguments,
through the mode's own per-op logic (classification, counting, handlers, nested
decompositions), so the results, the random stream and the report are those of running
the decomposition again.

A recording is discarded (the decomposition keeps running as Python) when it cannot
stand for every input of its signature: an op returned a non-tensor value (``.item()``,
``is_nonzero``: the Python code may branch on data), an op's output shape depends on the
data (``nonzero``), a sub-op raised, or an output of the decomposition was not produced
by a recorded op.
"""

from __future__ import annotations

import weakref

import torch

#: the most recordings kept (signatures beyond it are not recorded)
MAX_PROGRAMS = 4096

_DYNAMIC_TAGS = tuple(getattr(torch.Tag, t)
                      for t in ("dynamic_output_shape", "data_dependent_output")
                      if hasattr(torch.Tag, t))

# argument templates: ("s", slot) tensor slot; ("c", tensor) constant tensor (cloned per
# use); ("l", type, [templates]) list/tuple; ("v", value) any other value
_S, _C, _L, _V = 0, 1, 2, 3


def _key_of(x):
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.device, tuple(x.shape), x.stride(), x.storage_offset(),
                x.requires_grad)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_key_of(v) for v in x))
    if type(x) is float:
        return (float, x.hex())  # tells -0.0 from 0.0; nan equals nan
    return (type(x), x)


def flatten(args, kwargs) -> list:
    """The tensors and values of ``args`` and ``kwargs``, lists expanded (one level)."""
    flat = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            flat.extend(a)
        else:
            flat.append(a)
    return flat


def signature(func, args, kwargs):
    """A hashable key under which a decomposition of ``func`` on these arguments dispatches
    the same ops, or None (an argument is not hashable)."""
    flat = flatten(args, kwargs)
    seen: dict = {}
    alias = tuple(seen.setdefault(id(t), i) for i, t in enumerate(flat)
                  if isinstance(t, torch.Tensor))
    key = (func, tuple(_key_of(a) for a in args), tuple(kwargs),
           tuple(_key_of(v) for v in kwargs.values()), alias, torch.get_default_dtype(),
           torch.is_grad_enabled())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def without_args(key, positions):
    """:func:`signature`'s ``key`` with the positional arguments at ``positions`` left
    out (the same key for calls that differ only there)."""
    args = tuple(None if p in positions else k for p, k in enumerate(key[1]))
    return (key[0], args, *key[2:])


class Program:
    """A recorded decomposition: ops with argument templates over numbered slots (the
    inputs first, then each op's tensor outputs), and the template of the result."""

    __slots__ = ("steps", "result", "nslots")

    def __init__(self, steps, result, nslots):
        self.steps = steps
        self.result = result
        self.nslots = nslots


def _build(tpl, vals):
    kind = tpl[0]
    if kind == _S:
        return vals[tpl[1]]
    if kind == _V:
        return tpl[1]
    if kind == _L:
        seq = [_build(t, vals) for t in tpl[2]]
        tp = tpl[1]
        if tp is list:
            return seq
        return tp(*seq) if hasattr(tp, "_fields") else tp(seq)  # named tuples: by position
    return tpl[1].clone()


def _store(spec, out, vals) -> None:
    if spec is None:
        return
    if isinstance(spec, int):
        vals[spec] = out
        return
    for s, o in zip(spec, out):
        if s is not None:
            vals[s] = o


def replay(prog: Program, flat_inputs: list, dispatch):
    """Run ``prog`` on new inputs (``flatten`` of the call), each op through ``dispatch``
    (func, args, kwargs) -> output."""
    vals = list(flat_inputs)
    vals.extend([None] * (prog.nslots - len(vals)))
    for func, atpl, ktpl, ospec in prog.steps:
        # (slots and plain values inline: most arguments are one or the other)
        args = tuple([vals[t[1]] if t[0] == _S else t[1] if t[0] == _V else _build(t, vals)
                      for t in atpl])
        kwargs = {k: _build(t, vals) for k, t in ktpl} if ktpl else {}
        _store(ospec, dispatch(func, args, kwargs), vals)
    return _build(prog.result, vals)


class Recorder:
    """Writes down the ops a decomposition dispatches at one depth of the mode."""

    def __init__(self, depth: int, flat_inputs: list) -> None:
        self.depth = depth
        # id -> (slot, weak reference): ids of dead tensors get reused, and strong
        # references would change what the dispatcher does with outputs
        self.slots: dict[int, tuple[int, weakref.ref]] = {}
        for i, t in enumerate(flat_inputs):
            if isinstance(t, torch.Tensor) and id(t) not in self.slots:
                self.slots[id(t)] = (i, weakref.ref(t))
        self.nslots = len(flat_inputs)
        self.consts: list = []
        self.steps: list = []
        self.ok = True

    def _slot(self, v: torch.Tensor):
        e = self.slots.get(id(v))
        return e[0] if e is not None and e[1]() is v else None

    def _tpl(self, v):
        if isinstance(v, torch.Tensor):
            s = self._slot(v)
            if s is None:  # made outside the dispatcher (torch.tensor(...)): a constant
                if self._shares_storage(v):
                    self.ok = False  # an input seen by a way the recorder does not see
                c = v.detach().clone()
                self.consts.append(v)
                return (_C, c)
            return (_S, s)
        if isinstance(v, (list, tuple)):
            return (_L, type(v), [self._tpl(x) for x in v])
        return (_V, v)

    def _shares_storage(self, v: torch.Tensor) -> bool:
        try:
            p = v.untyped_storage().data_ptr()
            for _, ref in self.slots.values():
                t = ref()
                if t is not None and t.untyped_storage().data_ptr() == p:
                    return True
        except (RuntimeError, NotImplementedError):
            return True
        return False

    def _out(self, o):
        if isinstance(o, torch.Tensor):
            s = self._slot(o)
            if s is None:
                s = self.nslots
                self.slots[id(o)] = (s, weakref.ref(o))
                self.nslots += 1
            return s
        if o is not None:
            self.ok = False  # a Python value the decomposition may branch on
        return None

    def call(self, func, args, kwargs, dispatch):
        """Dispatch one op of the decomposition and write it down."""
        if not self.ok:
            return dispatch(func, args, kwargs)
        if any(t in func.tags for t in _DYNAMIC_TAGS):
            self.ok = False
            return dispatch(func, args, kwargs)
        atpl = [self._tpl(a) for a in args]
        ktpl = tuple((k, self._tpl(v)) for k, v in kwargs.items())
        try:
            out = dispatch(func, args, kwargs)
        except BaseException:
            self.ok = False
            raise
        if isinstance(out, (list, tuple)):
            ospec = tuple(self._out(o) for o in out)
        else:
            ospec = self._out(out)
        self.steps.append((func, atpl, ktpl, ospec))
        return out

    def finish(self, result) -> Program | None:
        """The program, or None when it cannot stand for the decomposition."""
        if not self.ok:
            return None
        tpl = self._result_tpl(result)
        return None if tpl is None else Program(self.steps, tpl, self.nslots)

    def _result_tpl(self, v):
        if isinstance(v, torch.Tensor):
            s = self._slot(v)
            return None if s is None else (_S, s)
        if isinstance(v, (list, tuple)):
            parts = [self._result_tpl(x) for x in v]
            return None if any(p is None for p in parts) else (_L, type(v), parts)
        if v is None or isinstance(v, (bool, int, float)):
            return (_V, v)
        return None
