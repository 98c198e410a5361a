"""Atomic file writes: a temporary file in the target's folder, fsync, then rename.

A crash or Ctrl-C leaves either the old file or the complete new one, never a
partial file. Every file numvar writes for a user goes through here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; create parent folders. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, Any],
                 metadata: Mapping[str, str] | None = None) -> Path:
    """Save a name → tensor mapping as safetensors, atomically.

    Tensors are moved to CPU and copied into fresh contiguous storage first
    (safetensors refuses tensors that share memory, e.g. two views of one buffer).
    """
    from safetensors.torch import save

    flat = {k: v.detach().to("cpu").clone(memory_format=torch.contiguous_format)
            for k, v in tensors.items()}
    data = save(flat, metadata=dict(metadata) if metadata else None)
    return atomic_write_bytes(path, data)


def load_tensors(path: str | os.PathLike) -> dict:
    """Load a safetensors file (never pickle). Raises StoreError on a bad file."""
    from safetensors.torch import load_file

    from .errors import StoreError

    path = Path(path)
    if not path.is_file():
        raise StoreError(f"missing tensor file: {path}")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise StoreError(f"corrupt tensor file {path}: {exc}") from exc


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; StoreError names the file when it is missing or corrupt."""
    from .errors import StoreError

    path = Path(path)
    if not path.is_file():
        raise StoreError(f"missing file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreError(f"corrupt JSON in {path}: {exc}") from exc
