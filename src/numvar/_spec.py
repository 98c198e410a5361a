"""Command-line specs shared by several commands: ``file.py:function``, shapes, inputs.

``numvar bounds model.py:build`` and ``numvar locate model.py:build`` name a Python file
and a function in it that returns the model. Loading it executes that file: it is the
user's own code, run as the user would run it. Tensors come only from safetensors.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError


def load_object(spec: str) -> Callable[..., Any]:
    """Resolve ``path/to/file.py:name`` or ``package.module:name`` to the named object."""
    if ":" not in spec:
        raise ConfigError(f"{spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"{spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    if target.endswith(".py") or "/" in target or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"{spec!r}: no such file {path}")
        mod_name = f"_numvar_user_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"{spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            module_spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"{spec!r}: cannot import module {target}: {exc}") from exc
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{spec!r}: {target} has no attribute {name!r}") from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,1,28,28"`` (or ``"1x1x28x28"``) → ``(1, 1, 28, 28)``; a clear error otherwise."""
    parts = [p.strip() for p in re.split(r"[,x×]", text.strip())]
    if not text.strip() or any(not p.isdigit() for p in parts):
        raise ConfigError(f"--input-shape {text!r}: expected comma-separated positive integers")
    shape = tuple(int(p) for p in parts)
    if any(s <= 0 for s in shape):
        raise ConfigError(f"--input-shape {text!r}: expected positive integers")
    return shape


def load_input(path: str | Path, key: str | None = None):
    """The input tensor from a safetensors file (its only tensor, or ``key``)."""
    from ._io import load_tensors

    tensors = load_tensors(path)
    if key is not None:
        if key not in tensors:
            raise ConfigError(f"{path}: no tensor named {key!r} (has {sorted(tensors)})")
        return tensors[key]
    if len(tensors) != 1:
        raise ConfigError(f"{path}: holds {len(tensors)} tensors {sorted(tensors)}; name one")
    return next(iter(tensors.values()))
