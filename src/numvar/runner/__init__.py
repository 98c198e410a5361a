"""Realizations of a function or of an unmodified script: capture, storage, executors.

- :func:`sample` — R realizations of a Python function (in-process, process pool, Dask).
- :func:`capture` — record a value from inside user code (a no-op outside a run).
- :func:`run_script` / :func:`resume_script` — what ``numvar run`` does.
- :class:`RunStore`, :class:`Samples`, :func:`load_run` — the run directory.

Only :func:`capture` is imported eagerly (it needs neither torch nor the executors);
the rest loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .collect import capture

_LAZY = {
    "sample": ".sampling", "run_script": ".script", "resume_script": ".script",
    "RunStore": ".store", "Samples": ".store", "load_run": ".store",
}

__all__ = ["RunStore", "Samples", "capture", "load_run", "resume_script", "run_script", "sample"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'numvar.runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
