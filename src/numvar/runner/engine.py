"""Client side of a run: store results as they arrive, check them, report progress.

Every executor (in-process, local processes, Dask) hands :class:`Recorder` the same
bytes (see :mod:`numvar.runner.transport`), so stores are identical whatever ran them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .._io import atomic_write_text, load_tensors
from ..errors import RunError
from .store import REFERENCE, RunStore, Samples, merge_escapes, stack_realizations
from .transport import unpack

log = logging.getLogger(__name__)

#: progress callback: (event, payload); events "store" (run directory), "total" (int),
#: "done" (the record of a finished realization)
Progress = Callable[[str, Any], None]


def default_jobs() -> int:
    """Number of cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def thread_share(jobs: int) -> int:
    """Torch threads per worker when ``jobs`` workers share this machine's cores."""
    return max(1, default_jobs() // max(1, jobs))


def limit_threads(n: int, *, numba: bool = True) -> None:
    """Use ``n`` threads in torch and (when imported, and ``numba``) in numba's pool,
    which runs the instrumentation's parallel kernels."""
    import sys

    torch.set_num_threads(n)
    nb = sys.modules.get("numba") if numba else None
    if nb is not None:
        try:
            nb.set_num_threads(max(1, min(n, nb.config.NUMBA_NUM_THREADS)))
        except Exception as exc:  # pragma: no cover - exotic threading layers
            log.info("numba threads not limited: %s", exc)


def tag_of(index: int | None) -> str:
    return "reference" if index is None else f"r{index:04d}"


def _signature(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in tensors.items()}


def mismatch(sig: dict[str, tuple], tensors: dict[str, torch.Tensor], against: str) -> str | None:
    """Describe how ``tensors`` differ from ``sig`` (names, shapes, dtypes), or None."""
    got = _signature(tensors)
    missing = [k for k in sig if k not in got]
    extra = [k for k in got if k not in sig]
    if missing or extra:
        def show(names: list[str]) -> str:
            return ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
        parts = []
        if missing:
            parts.append(f"missing {show(missing)}")
        if extra:
            parts.append(f"extra {show(extra)}")
        return f"captured a different set of values than {against}: " + "; ".join(parts)
    for k, (shape, dtype) in sig.items():
        if got[k] != (shape, dtype):
            return (f"capture {k!r} has shape {got[k][0]} dtype {got[k][1]}, "
                    f"{against} has shape {shape} dtype {dtype}")
    return None


@dataclass
class Recorder:
    """Stores results into ``store`` (or keeps them in memory when it is None)."""

    store: RunStore | None
    seeds: list[int]
    config: dict[str, Any] = field(default_factory=dict)
    progress: Progress | None = None
    _sig: dict[str, tuple] | None = None
    _sig_from: str = ""
    _mem: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    _mem_ref: dict[str, torch.Tensor] = field(default_factory=dict)
    _kinds: dict[str, str] = field(default_factory=dict)
    _records: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    reference_record: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.store is None:
            return
        # resuming: shapes/dtypes must agree with what is stored already
        ref = self.store.manifest["reference"]
        if ref.get("status") == "ok" and (self.store.path / REFERENCE).is_file():
            self._sig = _signature(load_tensors(self.store.path / REFERENCE))
            self._sig_from = "the reference"
        else:
            for r in self.store.manifest["realizations"]:
                if r["status"] == "ok" and (self.store.path / r["file"]).is_file():
                    self._sig = _signature(load_tensors(self.store.path / r["file"]))
                    self._sig_from = f"realization {r['index']}"
                    break

    def record(self, index: int | None, blob: bytes) -> dict[str, Any]:
        """Check and store one result; returns its record (with ``status``)."""
        tensors, info = unpack(blob)
        tag = tag_of(index)
        rec: dict[str, Any] = {
            k: info[k] for k in ("exit_code", "wall_s", "host", "error", "stderr_tail", "escapes")
            if info.get(k) is not None
        }
        ok = info.get("status") == "ok"
        if ok and self._sig is not None:
            why = mismatch(self._sig, tensors, self._sig_from)
            if why is not None:
                ok = False
                rec["error"] = f"{tag}: {why}"
        if ok:
            rec.pop("stderr_tail", None)
        if ok and self._sig is None:
            self._sig = _signature(tensors)
            self._sig_from = "the reference" if index is None else f"realization {index}"
        kinds = info.get("kinds") or {}
        if self.store is not None:
            logs = self.store.path / "logs"
            for stream in ("stdout", "stderr"):
                text = info.get(f"{stream}_log")
                if text is not None:
                    atomic_write_text(logs / f"{tag}.{stream}", text)
            if ok and index is None:
                self.store.save_reference(tensors, kinds=kinds, **rec)
            elif ok:
                self.store.save_realization(index, tensors, kinds=kinds, **rec)
            else:
                self.store.mark_failed(index, **rec)
        else:
            if ok:
                for k in tensors:
                    self._kinds.setdefault(k, kinds.get(k, ""))
                if index is None:
                    self._mem_ref = tensors
                else:
                    self._mem[index] = tensors
        rec = {"index": index, "tag": tag, "status": "ok" if ok else "failed", **rec}
        if index is None:
            self.reference_record = rec
        else:
            self._records[index] = rec
            if not ok:
                self.failed.append(rec)
        if not ok:
            log.info("%s failed: %s", tag, rec.get("error") or f"exit code {rec.get('exit_code')}")
        if self.progress is not None:
            self.progress("done", rec)
        return rec

    def samples(self) -> Samples:
        """Everything stored so far as :class:`Samples`."""
        if self.store is not None:
            return self.store.load()
        order = sorted(self._mem)
        captures = stack_realizations([self._mem[i] for i in order])
        from .store import _default_kind

        return Samples(
            captures=captures,
            reference=dict(self._mem_ref),
            config=dict(self.config),
            kinds={k: self._kinds.get(k) or _default_kind(k) for k in captures},
            indices=order,
            seeds=[self.seeds[i] for i in order],
            timings=[float(self._records[i].get("wall_s", float("nan"))) for i in order],
            failed=[r for r in self.failed],
            escapes=merge_escapes([self._records[i] for i in order]),
        )


def failure_summary(failed: list[dict[str, Any]], total: int) -> str:
    """One line per failed realization: tag, exit code, the error or last stderr line."""
    lines = [f"{len(failed)} of {total} realizations failed:"]
    for r in sorted(failed, key=lambda r: (r["index"] is not None, r["index"] or 0)):
        what = r.get("error")
        if not what:
            tail = (r.get("stderr_tail") or "").strip().splitlines()
            what = tail[-1] if tail else "no stderr"
        code = r.get("exit_code")
        lines.append(f"  {r['tag']}" + (f" (exit code {code})" if code is not None else "")
                     + f": {what.strip().splitlines()[-1] if what.strip() else what}")
    return "\n".join(lines)


def raise_if_failed(rec: Recorder, total: int) -> None:
    if rec.failed:
        err = RunError(failure_summary(rec.failed, total))
        err.failed = list(rec.failed)  # type: ignore[attr-defined]
        raise err
