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

from .._io import atomic_write_text
from ..errors import RunError
from .store import RunStore, Samples, combine, merge_escapes
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


def limit_threads(n: int, *, numba: bool = True) -> dict[str, int]:
    """Use ``n`` threads in torch and (with ``numba``) in numba's pool, which runs the
    instrumentation's parallel kernels; returns the counts now in effect.

    numba's pool is launched here (``numba.set_num_threads`` starts its threading layer),
    before torch is set: launching numba's OpenMP layer resets torch's OpenMP thread
    count to the number of cores, which is how forked realizations ended up with every
    core each."""
    counts: dict[str, int] = {}
    if numba:
        try:
            import numba as nb
        except ImportError:  # pragma: no cover - numba is a dependency
            nb = None
        if nb is not None:
            try:
                nb.set_num_threads(max(1, min(n, nb.config.NUMBA_NUM_THREADS)))
                counts["numba"] = int(nb.get_num_threads())
            except Exception as exc:  # pragma: no cover - exotic threading layers
                log.info("numba threads not limited: %s", exc)
    torch.set_num_threads(n)
    counts["torch"] = int(torch.get_num_threads())
    return counts


def tag_of(index: int | None) -> str:
    return "reference" if index is None else f"r{index:04d}"


@dataclass
class Recorder:
    """Stores results into ``store`` (or keeps them in memory when it is None).

    A realization is rejected only when it failed: its process exited with an error,
    or it started from another random state than the run's (``config["rng"]``).
    Realizations whose captures differ from the others' (a training loop that runs
    until it converges calls its modules a different number of times) are kept; the
    analysis compares what they share and reports the rest."""

    store: RunStore | None
    seeds: list[int]
    config: dict[str, Any] = field(default_factory=dict)
    progress: Progress | None = None
    _mem: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    _mem_ref: dict[str, torch.Tensor] = field(default_factory=dict)
    _kinds: dict[str, str] = field(default_factory=dict)
    _records: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    reference_record: dict[str, Any] | None = None

    def record(self, index: int | None, blob: bytes) -> dict[str, Any]:
        """Check and store one result; returns its record (with ``status``)."""
        tensors, info = unpack(blob)
        tag = tag_of(index)
        rec: dict[str, Any] = {
            k: info[k] for k in RECORD_FIELDS if info.get(k) is not None
        }
        ok = info.get("status") == "ok"
        rng = self.config.get("rng")
        if ok and rng:
            from .rng import mismatch

            why = mismatch(rng, info.get("rng"))
            if why is not None:
                ok = False
                rec["error"] = f"{tag}: {why}"
        if ok:
            rec.pop("stderr_tail", None)
            rec.pop("error", None)
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
        per_run = [self._mem[i] for i in order]
        captures, partial = combine(per_run, self._mem_ref)
        from .store import _default_kind, call_counts, realization_seconds

        return Samples(
            captures=captures,
            reference=dict(self._mem_ref),
            config=dict(self.config),
            kinds={k: self._kinds.get(k) or _default_kind(k) for k in captures},
            indices=order,
            seeds=[self.seeds[i] for i in order],
            timings=[realization_seconds(self._records[i]) for i in order],
            failed=[r for r in self.failed],
            escapes=merge_escapes([self._records[i] for i in order]),
            partial=partial,
            counts=[call_counts(list(d)) for d in per_run],
            reference_counts=call_counts(list(self._mem_ref)) if self._mem_ref else None,
        )


#: fields of a worker's result kept in the realization's record
RECORD_FIELDS = ("exit_code", "wall_s", "script_s", "compile_s", "threads", "rng", "dropped",
                 "escapes",
                 "host", "error", "stderr_tail")


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
