"""On-disk layout of a run directory, and the in-memory :class:`Samples`.

Layout (schema 1)::

    runs/NAME/
      manifest.json          schema, versions, command, config, per-realization records
      reference.safetensors  the IEEE (uninstrumented) realization
      r0000.safetensors      realization 0, ...
      logs/r0000.stdout      per-realization logs (script runs)
      logs/r0000.stderr

Capture names (keys of the safetensors files):

- ``name``              a ``numvar.capture(name, value)`` call; pytrees flatten to
                        ``name.0``, ``name.key``, ... (dots join the path)
- ``name@k``            the k-th repeated capture of ``name`` (a series, e.g. a loss per step)
- ``modules/NNN.Class`` output of the NNN-th top-level ``nn.Module`` call
- ``layers/path#k``     output of submodule ``path`` on its k-th call
- ``stdout``            float64 vector of the numbers a script printed, by position
- ``files/relpath``     a file the script wrote (``.npy``/``.safetensors``), by relative path

``manifest["captures"]`` maps each name to its kind (``api``, ``series``, ``module``,
``layer``, ``stdout``, ``file``) in first-capture order (network order for layers).
Every file is written atomically (see :mod:`numvar._io`).
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json, load_tensors, read_json, save_tensors
from ..errors import CaptureError, StoreError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
REFERENCE = "reference.safetensors"
SERIES_RE = re.compile(r"^(?P<base>.+)@(?P<step>\d+)$")


def realization_file(index: int) -> str:
    return f"r{index:04d}.safetensors"


def _versions() -> dict[str, str]:
    from .. import __version__

    return {"numvar": __version__, "torch": torch.__version__}


@dataclass
class Samples:
    """Realizations of every captured value, stacked along a leading axis of size R.

    ``captures[name]`` has shape ``(R, *shape)``; ``reference[name]`` is the IEEE value
    (absent when no reference was stored). ``indices`` are the realization indices
    that succeeded, in order; ``seeds`` their seeds.
    """

    captures: dict[str, torch.Tensor]
    reference: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    indices: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    timings: list[float] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    #: ops that escaped perturbation, over the realizations: op -> {"count", "reason",
    #: "realizations"} (see :func:`merge_escapes`)
    escapes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.indices)

    @property
    def names(self) -> list[str]:
        return list(self.captures)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.captures[name]

    def series(self) -> dict[str, list[str]]:
        """Group ``name@k`` captures into series: base name → names ordered by step."""
        groups: dict[str, list[tuple[int, str]]] = {}
        for name in self.captures:
            m = SERIES_RE.match(name)
            if m:
                groups.setdefault(m["base"], []).append((int(m["step"]), name))
        return {b: [n for _, n in sorted(v)] for b, v in groups.items()}


def merge_escapes(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Merge the ``escapes`` of realization records (ops numvar ran natively or below the
    requested granularity): per op, the calls summed over realizations, the first
    reason, and in how many realizations it escaped."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        for op, e in (r.get("escapes") or {}).items():
            m = out.setdefault(op, {"count": 0, "reason": e.get("reason", ""), "realizations": 0})
            m["count"] += int(e.get("count", 0))
            m["realizations"] += 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["count"], kv[0])))


def stack_realizations(per_run: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack per-realization dicts; names, shapes and dtypes must agree (CaptureError)."""
    if not per_run:
        return {}
    names = list(per_run[0])
    for i, d in enumerate(per_run[1:], start=1):
        if set(d) != set(names):
            missing = sorted(set(names) - set(d))
            extra = sorted(set(d) - set(names))
            raise CaptureError(
                f"realization {i} captured a different set of values: "
                f"missing {missing}, extra {extra}")
    out = {}
    for name in names:
        first = per_run[0][name]
        for i, d in enumerate(per_run[1:], start=1):
            t = d[name]
            if t.shape != first.shape or t.dtype != first.dtype:
                raise CaptureError(
                    f"capture {name!r}: realization {i} has shape {tuple(t.shape)} "
                    f"dtype {t.dtype}, realization 0 has {tuple(first.shape)} {first.dtype}")
        out[name] = torch.stack([d[name] for d in per_run])
    return out


class RunStore:
    """A run directory. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, path: str | Path, manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.manifest = manifest

    # -- creation and loading -------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, *, config: dict[str, Any], seeds: list[int],
               command: list[str] | None = None) -> "RunStore":
        path = Path(path)
        if (path / MANIFEST).exists():
            raise StoreError(f"{path} already holds a run; use --resume or another --out")
        path.mkdir(parents=True, exist_ok=True)
        manifest = {
            "schema": SCHEMA_VERSION,
            "versions": _versions(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "command": command,
            "config": config,
            "captures": {},
            "reference": {"status": "pending"},
            "realizations": [
                {"index": i, "seed": s, "status": "pending"} for i, s in enumerate(seeds)
            ],
        }
        store = cls(path, manifest)
        store.flush()
        return store

    @classmethod
    def open(cls, path: str | Path) -> "RunStore":
        path = Path(path)
        if not path.is_dir():
            raise StoreError(f"no run directory at {path}")
        manifest = read_json(path / MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA_VERSION:
            raise StoreError(f"{path / MANIFEST}: unknown schema "
                             f"{manifest.get('schema') if isinstance(manifest, dict) else '?'}")
        return cls(path, manifest)

    def flush(self) -> None:
        atomic_write_json(self.path / MANIFEST, self.manifest)

    # -- writing ------------------------------------------------------------------
    def _note_captures(self, tensors: dict[str, torch.Tensor], kinds: dict[str, str] | None):
        caps = self.manifest["captures"]
        for name in tensors:
            if name not in caps:
                caps[name] = (kinds or {}).get(name) or _default_kind(name)

    def save_reference(self, tensors: dict[str, torch.Tensor], *,
                       kinds: dict[str, str] | None = None, **info: Any) -> None:
        save_tensors(self.path / REFERENCE, tensors)
        self._note_captures(tensors, kinds)
        self.manifest["reference"] = {"status": "ok", "file": REFERENCE, **info}
        self.flush()

    def save_realization(self, index: int, tensors: dict[str, torch.Tensor], *,
                         kinds: dict[str, str] | None = None, **info: Any) -> None:
        """Store realization ``index`` (its tensors first, then the manifest record)."""
        fname = realization_file(index)
        save_tensors(self.path / fname, tensors)
        self._note_captures(tensors, kinds)
        rec = self.manifest["realizations"][index]
        rec.update(info)
        rec.update({"status": "ok", "file": fname})
        self.flush()

    def mark_failed(self, index: int | None, **info: Any) -> None:
        """Record a failed realization (``index=None``: the reference)."""
        rec = self.manifest["reference"] if index is None else self.manifest["realizations"][index]
        rec.update(info)
        rec["status"] = "failed"
        self.flush()

    # -- reading ------------------------------------------------------------------
    def pending(self) -> list[int]:
        """Indices not stored yet (pending or failed): what ``--resume`` runs."""
        return [r["index"] for r in self.manifest["realizations"]
                if r["status"] != "ok" or not (self.path / r.get("file", "")).is_file()]

    def load(self) -> Samples:
        """Load every successful realization and the reference as :class:`Samples`."""
        ok = [r for r in self.manifest["realizations"] if r["status"] == "ok"]
        per_run = [load_tensors(self.path / r["file"]) for r in ok]
        captures = stack_realizations(per_run)
        order = list(self.manifest.get("captures", {}))
        captures = {k: captures[k] for k in order if k in captures} | {
            k: v for k, v in captures.items() if k not in order}
        ref = {}
        if self.manifest["reference"].get("status") == "ok":
            ref = load_tensors(self.path / REFERENCE)
        return Samples(
            captures=captures,
            reference=ref,
            config=dict(self.manifest.get("config", {})),
            kinds={k: self.manifest["captures"].get(k, _default_kind(k)) for k in captures},
            indices=[r["index"] for r in ok],
            seeds=[r["seed"] for r in ok],
            timings=[float(r.get("wall_s", float("nan"))) for r in ok],
            failed=[r for r in self.manifest["realizations"] if r["status"] == "failed"],
            escapes=merge_escapes(ok),
        )


def _default_kind(name: str) -> str:
    if name.startswith("modules/"):
        return "module"
    if name.startswith("layers/"):
        return "layer"
    if name == "stdout":
        return "stdout"
    if name.startswith("files/"):
        return "file"
    if SERIES_RE.match(name):
        return "series"
    return "api"


def load_run(path: str | Path) -> Samples:
    """Load a run directory written by ``numvar run`` or ``numvar.sample(..., out=...)``."""
    return RunStore.open(path).load()
