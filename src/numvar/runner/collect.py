"""Capturing values inside a realization: ``numvar.capture`` and module hooks.

Outside a numvar run :func:`capture` returns after one global lookup (no torch work,
no allocation). Inside one, the active :class:`Collector` stores a detached CPU copy of
every leaf, so later in-place changes of the user's tensors don't alter what was
recorded. Copies are taken with any dispatch mode (the instrumentation) switched off,
so capturing never consumes random bits nor shows up in ``fuzzy().report()``.

Naming (see :mod:`numvar.runner.store`): a pytree captured as ``name`` flattens to
``name.0``, ``name.key``, ... ; a name captured k > 1 times in one realization becomes a
series ``name@0``, ``name@1``, ... (the suffix goes after the pytree path:
``name.key@1``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import numbers
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import CaptureError

if TYPE_CHECKING:
    import torch

#: Prefixes (and the exact name ``stdout``) reserved for captures the runner makes.
RESERVED_PREFIXES = ("modules/", "layers/", "files/")
RESERVED_NAMES = ("stdout",)

_ACTIVE: "Collector | None" = None
#: Depth of :func:`paused` blocks: while positive nothing is captured.
_PAUSED = 0
#: Default cap on the bytes one realization captures (``--capture-limit``): 1 GiB.
DEFAULT_CAPTURE_LIMIT = 1 << 30
#: Serializes in-process realizations: captures and global module hooks are
#: process-wide, so two realizations must not overlap in one process.
REALIZATION_LOCK = threading.RLock()


def capture(name: str, value: Any) -> None:
    """Record ``value`` (tensor, number, numpy array or pytree of them) as ``name``.

    Outside a numvar run (``numvar.sample`` or ``numvar run``) this does nothing.
    Calling it again with the same name in one realization records a series
    (``name@0``, ``name@1``, ...). Raises :class:`~numvar.errors.CaptureError` on
    non-numeric values and on names that collide.
    """
    c = _ACTIVE
    if c is None or _PAUSED:
        return
    c.add(name, value, kind="api")


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Capture nothing inside the block: neither ``capture`` calls nor module outputs.

    For set-up work that is not part of what realizations compare, and that not every
    realization does (e.g. training a model that later runs load from a cache)."""
    global _PAUSED
    _PAUSED += 1
    try:
        yield
    finally:
        _PAUSED -= 1


def active() -> "Collector | None":
    """The collector of the realization running in this process, if any."""
    return _ACTIVE


@contextlib.contextmanager
def no_dispatch() -> Iterator[None]:
    """Switch off torch dispatch modes (the instrumentation) inside the block."""
    import torch

    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover - very old torch
        yield
        return
    with _disable_current_modes(), torch.no_grad():
        yield


def _leaf_tensor(value: Any, where: str, *, strict: bool) -> torch.Tensor | None:
    """A detached, contiguous CPU copy of a numeric leaf; None for skipped leaves."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.is_sparse:
            t = t.to_dense()
        if t.device.type == "meta":
            raise CaptureError(f"capture {where!r}: meta tensors hold no values")
        return t.to("cpu", copy=True).contiguous()
    np = _numpy()
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc":
            if not strict:
                return None
            raise CaptureError(f"capture {where!r}: non-numeric numpy array of dtype "
                               f"{arr.dtype}")
        return torch.from_numpy(np.ascontiguousarray(arr).copy())
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, numbers.Integral):
        return torch.tensor(int(value), dtype=torch.int64)
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value), dtype=torch.float64)
    if isinstance(value, numbers.Complex):
        return torch.tensor(complex(value), dtype=torch.complex128)
    if not strict:
        return None
    raise CaptureError(f"capture {where!r}: non-numeric value of type "
                       f"{type(value).__name__} (capture tensors, numbers, numpy arrays "
                       f"or dicts/lists/tuples of them)")


def _numpy():
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return None
    return numpy


def flatten(name: str, value: Any, *, strict: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Flatten a pytree into ``(name + path, tensor)`` leaves, in traversal order.

    Dicts (also ``OrderedDict`` subclasses such as transformers' ``ModelOutput``) use
    their keys, lists/tuples their positions, namedtuples their field names; ``None``
    leaves are skipped. With ``strict=False`` non-numeric leaves are skipped as well
    (module hooks); otherwise they raise :class:`CaptureError`.
    """
    out: list[tuple[str, torch.Tensor]] = []

    def walk(prefix: str, v: Any, depth: int) -> None:
        if depth > 64:
            raise CaptureError(f"capture {name!r}: pytree nested deeper than 64 levels")
        if v is None:
            return
        if isinstance(v, Mapping):
            for k, item in v.items():
                walk(f"{prefix}.{k}", item, depth + 1)
            return
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            for k, item in zip(v._fields, v):
                walk(f"{prefix}.{k}", item, depth + 1)
            return
        if isinstance(v, (list, tuple)):
            for k, item in enumerate(v):
                walk(f"{prefix}.{k}", item, depth + 1)
            return
        t = _leaf_tensor(v, prefix, strict=strict)
        if t is not None:
            out.append((prefix, t))

    walk(name, value, 0)
    return out


def nbytes(value: Any, depth: int = 0) -> int:
    """Bytes a capture of ``value`` will hold, estimated before copying anything."""
    if depth > 64 or value is None:
        return 0
    nb = getattr(value, "nbytes", None)  # torch tensors, numpy arrays and scalars
    if isinstance(nb, int):
        return nb
    if isinstance(value, Mapping):
        return sum(nbytes(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v, depth + 1) for v in value)
    return 8


class Collector:
    """Everything captured during one realization, in capture order.

    ``limit`` caps the bytes kept (None: no cap). A capture that would take the total
    past it is dropped, not copied, and counted in :attr:`dropped` (per kind: calls,
    bytes, first and last name), so memory stays bounded by the limit.
    ``finish()`` resolves series (names captured more than once get ``@k``) and
    checks that no two final names collide.
    """

    def __init__(self, limit: int | None = None) -> None:
        # (base name, kind, [tensors per call]) in first-capture order
        self._calls: dict[str, tuple[str, list[list[tuple[str, torch.Tensor]]]]] = {}
        self._lock = threading.Lock()
        self.limit = limit
        self.bytes = 0
        self.dropped: dict[str, dict[str, Any]] = {}

    def _drop(self, name: str, kind: str, size: int) -> None:
        d = self.dropped.setdefault(kind, {"calls": 0, "bytes": 0, "first": name})
        d["calls"] += 1
        d["bytes"] += size
        d["last"] = name

    def add(self, name: str, value: Any, *, kind: str = "api", strict: bool = True,
            unique: bool = False) -> None:
        """Record one capture call (``unique``: the name must not have been used yet)."""
        if not isinstance(name, str) or not name:
            raise CaptureError(f"capture name must be a non-empty string, got {name!r}")
        if kind == "api" and (name.startswith(RESERVED_PREFIXES) or name in RESERVED_NAMES):
            raise CaptureError(
                f"capture name {name!r} collides with the runner's own captures "
                f"(names starting with {', '.join(RESERVED_PREFIXES)} or equal to 'stdout' "
                f"are reserved)")
        if "@" in name and kind == "api":
            raise CaptureError(f"capture name {name!r}: '@' is reserved for series "
                               f"(capture the same name repeatedly instead)")
        if self.limit is not None:
            size = nbytes(value)
            with self._lock:
                if self.bytes + size > self.limit:
                    self._drop(name, kind, size)
                    return
                self.bytes += size
        with no_dispatch():
            leaves = flatten(name, value, strict=strict)
        with self._lock:
            entry = self._calls.get(name)
            if unique and entry is not None:
                raise CaptureError(f"capture name {name!r} is reserved for the function's "
                                   f"return value; use another name")
            if entry is None:
                self._calls[name] = (kind, [leaves])
            else:
                entry[1].append(leaves)

    def finish(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Final ``name -> tensor`` and ``name -> kind`` dicts (CaptureError on collisions)."""
        tensors: dict[str, torch.Tensor] = {}
        kinds: dict[str, str] = {}
        origin: dict[str, str] = {}
        for base, (kind, calls) in self._calls.items():
            series = len(calls) > 1
            for k, leaves in enumerate(calls):
                for leaf_name, t in leaves:
                    final = f"{leaf_name}@{k}" if series else leaf_name
                    if final in tensors:
                        raise CaptureError(
                            f"capture name collision: {final!r} is produced both by "
                            f"capture {origin[final]!r} and by capture {base!r}")
                    tensors[final] = t
                    kinds[final] = "series" if series and kind == "api" else kind
                    origin[final] = base
        return tensors, kinds


@contextlib.contextmanager
def collecting(collector: Collector) -> Iterator[Collector]:
    """Make ``collector`` the active one for the block (one realization at a time)."""
    global _ACTIVE
    with REALIZATION_LOCK:
        prev = _ACTIVE
        _ACTIVE = collector
        try:
            yield collector
        finally:
            _ACTIVE = prev


class ModuleHooks:
    """Global forward hooks capturing module outputs into a :class:`Collector`.

    - ``top_level=True``: the output of every top-level ``nn.Module`` call (a call made
      while no other module is running) as ``modules/NNN.Class`` (NNN = call order).
    - ``layers``: fnmatch globs over ``named_modules()`` paths; each matching submodule's
      output on its k-th call is captured as ``layers/path#k``. Paths are those of
      ``model`` when given, else of the top-level module being called.

    Only tensor leaves of module outputs are kept (other leaves are skipped silently).
    """

    def __init__(self, collector: Collector, *, top_level: bool = False,
                 layers: list[str] | tuple[str, ...] = (), model: torch.nn.Module | None = None):
        self.collector = collector
        self.top_level = top_level
        self.layers = tuple(layers or ())
        self.model = model
        self._stack: list[torch.nn.Module] = []
        self._top_count = 0
        self._layer_count: dict[str, int] = {}
        self._paths: dict[int, tuple[torch.nn.Module, dict[int, str]]] = {}
        self._handles: list[Any] = []

    # paths of every submodule of `root` matching a glob, keyed by id(module)
    def _matches(self, root: torch.nn.Module) -> dict[int, str]:
        cached = self._paths.get(id(root))
        if cached is not None and cached[0] is root:
            return cached[1]
        found = {}
        for path, mod in root.named_modules():
            if path and any(fnmatch.fnmatchcase(path, g) for g in self.layers):
                found[id(mod)] = path
        self._paths[id(root)] = (root, found)
        return found

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if not _PAUSED:
            self._stack.append(module)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._stack or _PAUSED:
            return
        # unwind to this module (a forward that raised may have left entries behind)
        while self._stack and self._stack[-1] is not module:
            self._stack.pop()
        if not self._stack:
            return
        self._stack.pop()
        if output is None:
            return
        if self.layers:
            root = self.model if self.model is not None else (
                self._stack[0] if self._stack else module)
            path = self._matches(root).get(id(module))
            if path is not None:
                k = self._layer_count.get(path, 0)
                self._layer_count[path] = k + 1
                self.collector.add(f"layers/{path}#{k}", output, kind="layer", strict=False)
        if self.top_level and not self._stack:
            n = self._top_count
            self._top_count += 1
            self.collector.add(f"modules/{n:03d}.{type(module).__name__}", output,
                               kind="module", strict=False)

    def __enter__(self) -> "ModuleHooks":
        if self.top_level or self.layers:
            from torch.nn.modules import module as _m

            self._handles = [
                _m.register_module_forward_pre_hook(self._pre),
                _m.register_module_forward_hook(self._post, always_call=True),
            ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def parse_globs(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``'a.*,b'`` or ``['a.*', 'b']`` -> ``['a.*', 'b']`` (blank entries dropped)."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return [s.strip() for s in items if s and s.strip()]

