"""Realizations of a function or of an unmodified script: capture, storage, executors.

- :func:`sample` — R realizations of a Python function (in-process, process pool, Dask).
- :func:`capture` — record a value from inside user code (a no-op outside a run).
- :func:`run_script` / :func:`resume_script` — what ``numvar run`` does.
- :class:`RunStore`, :class:`Samples`, :func:`load_run` — the run directory.
"""

from .collect import capture
from .sample import sample
from .script import resume_script, run_script
from .store import RunStore, Samples, load_run

__all__ = ["RunStore", "Samples", "capture", "load_run", "resume_script", "run_script", "sample"]
