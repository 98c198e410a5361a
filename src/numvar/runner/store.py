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
    partial: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: list[dict[str, Any]] = field(default_factory=list)
    reference_counts: dict[str, Any] | None = None
    dropped: list[dict[str, Any]] = field(default_factory=list)

    # ``partial``: captures not in every realization (or not of one shape and dtype):
    #   name -> {"present": k, "of": R, "reference": bool, "shapes": {"(2,) float32": k}};
    #   they are left out of ``captures``. ``counts``: per realization, how many times
    #   the script called its top-level modules and each captured series
    #   ({"modules": n, "series": {base: steps}}); ``reference_counts`` the same for the
    #   reference. ``dropped``: per realization, what the capture limit left out.

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


def _sig(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def combine(per_run: list[dict[str, torch.Tensor]], reference: dict[str, torch.Tensor] | None = None
            ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Stack the captures every realization holds with one shape and dtype; describe
    the others (``{"present": k, "of": R, "reference": bool, "shapes": {...}}``).

    Realizations of a script that trains until it converges call their modules a
    different number of times: the captures they share are analysed, the rest are
    reported by presence, and no realization is thrown away."""
    if not per_run:
        return {}, {}
    order: dict[str, None] = {}
    for d in per_run:
        order.update(dict.fromkeys(d))
    R = len(per_run)
    common: dict[str, torch.Tensor] = {}
    partial: dict[str, dict[str, Any]] = {}
    for name in order:
        present = [d[name] for d in per_run if name in d]
        sigs: dict[str, int] = {}
        for t in present:
            sigs[_sig(t)] = sigs.get(_sig(t), 0) + 1
        if len(present) == R and len(sigs) == 1:
            common[name] = torch.stack(present)
        else:
            partial[name] = {"present": len(present), "of": R,
                             "reference": bool(reference) and name in reference,
                             "shapes": sigs}
    for name in (reference or {}):
        if name not in order:
            partial[name] = {"present": 0, "of": R, "reference": True,
                             "shapes": {}}
    return common, partial


def call_counts(names: list[str] | Any, dropped: dict[str, Any] | None = None) -> dict[str, Any]:
    """How many top-level module calls and steps of each series a realization made."""
    modules = sum(1 for n in names if n.startswith("modules/"))
    modules += int(((dropped or {}).get("module") or {}).get("calls", 0))
    series: dict[str, set[int]] = {}
    for n in names:
        m = SERIES_RE.match(n)
        if m and not n.startswith(("modules/", "layers/")):
            base = m["base"].split(".")[0]
            series.setdefault(base, set()).add(int(m["step"]))
    return {"modules": modules, "series": {b: len(v) for b, v in series.items()}}


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (the manifest records it for every tensor file)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
        self.manifest["reference"] = {"status": "ok", "file": REFERENCE, **info,
                                      **self._file_record(REFERENCE)}
        self.flush()

    def _file_record(self, fname: str) -> dict[str, Any]:
        p = self.path / fname
        return {"bytes": p.stat().st_size, "sha256": file_digest(p)}

    def save_realization(self, index: int, tensors: dict[str, torch.Tensor], *,
                         kinds: dict[str, str] | None = None, **info: Any) -> None:
        """Store realization ``index`` (its tensors first, then the manifest record)."""
        fname = realization_file(index)
        save_tensors(self.path / fname, tensors)
        self._note_captures(tensors, kinds)
        rec = self.manifest["realizations"][index]
        for stale in ("error", "stderr_tail", "exit_code"):
            rec.pop(stale, None)
        rec.update(info)
        rec.update({"status": "ok", "file": fname, **self._file_record(fname)})
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

    def check_file(self, rec: dict[str, Any]) -> str | None:
        """Why the file of a stored record (``status`` ok) is unusable, or None.

        The file must exist, have the size and SHA-256 the manifest records, and read
        as safetensors (records written before checksums existed: the last only)."""
        p = self.path / rec.get("file", "")
        if not rec.get("file") or not p.is_file():
            return "file missing"
        if "sha256" in rec:
            if p.stat().st_size != rec.get("bytes", p.stat().st_size):
                return f"file has {p.stat().st_size} bytes, the manifest records {rec['bytes']}"
            if file_digest(p) != rec["sha256"]:
                return "file corrupt (checksum differs from the manifest's)"
            return None
        try:
            load_tensors(p)
        except StoreError as exc:
            return f"file corrupt ({exc})"
        return None

    def verify(self) -> list[tuple[int | None, str]]:
        """Check every stored file; mark the missing or corrupt ones pending (flushed)
        and return them as ``(index or None for the reference, why)``."""
        bad: list[tuple[int | None, str]] = []
        recs = [(None, self.manifest["reference"])] + [
            (r["index"], r) for r in self.manifest["realizations"]]
        for index, rec in recs:
            if rec.get("status") != "ok":
                continue
            why = self.check_file(rec)
            if why is not None:
                bad.append((index, why))
                for k in ("file", "sha256", "bytes"):
                    rec.pop(k, None)
                rec.update(status="pending", previous_problem=why)
        if bad:
            self.flush()
        return bad

    def extend(self, n: int) -> list[int]:
        """Grow the run to ``n`` realizations (seeds continue from the run's seed);
        returns the new indices. Fewer than the run has: StoreError."""
        reals = self.manifest["realizations"]
        if n < len(reals):
            raise StoreError(f"{self.path} has {len(reals)} realizations; -n {n} would "
                             f"drop some (give -n {len(reals)} or more)")
        seed = int(self.manifest["config"].get("seed", 0))
        new = list(range(len(reals), n))
        reals.extend({"index": i, "seed": seed + i, "status": "pending"} for i in new)
        self.manifest["config"]["n"] = n
        cmd = self.manifest.get("command")
        if isinstance(cmd, list) and "-n" in cmd:
            cmd[cmd.index("-n") + 1] = str(n)
        self.flush()
        return new

    def load(self) -> Samples:
        """Load every successful realization and the reference as :class:`Samples`.

        Captures present in every realization with one shape and dtype are stacked in
        ``captures``; the others are described in ``partial`` (see :func:`combine`)."""
        ok = [r for r in self.manifest["realizations"] if r["status"] == "ok"]
        per_run = [load_tensors(self.path / r["file"]) for r in ok]
        ref = {}
        if self.manifest["reference"].get("status") == "ok":
            ref = load_tensors(self.path / REFERENCE)
        captures, partial = combine(per_run, ref)
        order = list(self.manifest.get("captures", {}))
        captures = {k: captures[k] for k in order if k in captures} | {
            k: v for k, v in captures.items() if k not in order}
        refrec = self.manifest["reference"]
        return Samples(
            captures=captures,
            reference=ref,
            config=dict(self.manifest.get("config", {})),
            kinds={k: self.manifest["captures"].get(k, _default_kind(k)) for k in captures},
            indices=[r["index"] for r in ok],
            seeds=[r["seed"] for r in ok],
            timings=[realization_seconds(r) for r in ok],
            failed=[r for r in self.manifest["realizations"] if r["status"] == "failed"],
            escapes=merge_escapes(ok),
            partial=partial,
            counts=[call_counts(list(d), r.get("dropped")) for d, r in zip(per_run, ok)],
            reference_counts=call_counts(list(ref), refrec.get("dropped")) if ref else None,
            dropped=[{"index": r["index"], **r["dropped"]} for r in ok if r.get("dropped")],
        )


def realization_seconds(rec: dict[str, Any]) -> float:
    """A realization's own time: the script's run time without numba compilation
    (``script_s - compile_s``); process wall time for older records."""
    if rec.get("script_s") is not None:
        return float(rec["script_s"]) - float(rec.get("compile_s") or 0.0)
    return float(rec.get("wall_s", float("nan")))


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
