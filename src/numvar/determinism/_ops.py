"""Op tables shared by the modes: which ops return uninitialised memory, which must run
only once, and which arguments an op writes to (from its schema)."""

from __future__ import annotations

from typing import Any

__all__ = ["UNINITIALIZED_OPS", "RUN_ONCE_OPS", "RUN_ONCE_NAMESPACES", "op_name",
           "is_uninitialized", "runs_once", "mutable_args", "get_arg", "flat", "shape_of"]

# Ops whose outputs hold uninitialised memory: never hashed, never compared.
UNINITIALIZED_OPS = frozenset({
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
    "aten.new_empty_strided", "aten.empty_permuted", "aten._empty_affine_quantized",
    "aten._empty_per_channel_affine_quantized", "aten.resize_", "aten.resize_as_",
})
# Ops with effects outside their tensors (assertions, streams, printing): run once.
RUN_ONCE_OPS = frozenset({
    "aten._assert_async", "aten._assert_scalar", "aten.sym_constrain_range",
    "aten.sym_constrain_range_for_size", "aten._functional_assert_async",
    "aten._functional_assert_scalar", "aten.record_stream", "aten._print",
    "aten._make_dep_token",
})
# Collectives and profiler hooks: running them twice would communicate twice.
RUN_ONCE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd",
                                 "_dtensor", "profiler", "higher_order"})

_packet_cache: dict[Any, str] = {}
_mutable_cache: dict[Any, tuple[tuple[int, str, bool], ...]] = {}


_name_cache: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """``aten.add.Tensor`` style name of an OpOverload."""
    n = _name_cache.get(func)
    if n is None:
        n = _name_cache[func] = str(func)
    return n


def _packet(func: Any) -> str:
    p = _packet_cache.get(func)
    if p is None:
        ns = getattr(func, "namespace", "")
        try:
            base = func.overloadpacket.__name__
        except AttributeError:
            base = str(func)
        p = _packet_cache[func] = f"{ns}.{base}"
    return p


def is_uninitialized(func: Any) -> bool:
    return _packet(func) in UNINITIALIZED_OPS


def runs_once(func: Any) -> bool:
    return (getattr(func, "namespace", "") in RUN_ONCE_NAMESPACES
            or _packet(func) in RUN_ONCE_OPS)


def mutable_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """Schema arguments the op writes to: ``(position, name, kwarg_only)``."""
    res = _mutable_cache.get(func)
    if res is None:
        res = []
        schema = getattr(func, "_schema", None)
        for i, a in enumerate(getattr(schema, "arguments", ()) or ()):
            ai = a.alias_info
            if ai is not None and ai.is_write:
                res.append((i, a.name, bool(a.kwarg_only)))
        res = _mutable_cache[func] = tuple(res)
    return res


def get_arg(args: tuple, kwargs: dict, pos: int, name: str, kwarg_only: bool) -> Any:
    if not kwarg_only and pos < len(args):
        return args[pos]
    return kwargs.get(name)


def flat(obj: Any, out: list | None = None) -> list:
    """Leaves of an aten op's arguments or outputs (tensors, scalars, generators...):
    nested tuples/lists/dicts flattened in order. Faster than a general pytree."""
    if out is None:
        out = []
    if isinstance(obj, (tuple, list)):
        for x in obj:
            if isinstance(x, (tuple, list, dict)):
                flat(x, out)
            else:
                out.append(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            if isinstance(x, (tuple, list, dict)):
                flat(x, out)
            else:
                out.append(x)
    else:
        out.append(obj)
    return out


def shape_of(obj: Any) -> Any:
    """A cheap structure token of an op output: types and lengths of containers."""
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(shape_of(x) for x in obj))
    return "leaf"
