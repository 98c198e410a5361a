"""Test-session set-up: the numba warm-up before pytest-xdist starts its workers."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own sessionstart, which starts the workers
def pytest_sessionstart(session):
    """With ``-n N`` (N >= 2), compile the heaviest kernels once, in parallel, before the
    workers start (see ``tests/_warmup.py``; a second run finds them cached in a few
    seconds). ``NUMVAR_TEST_WARMUP=0`` skips it."""
    config = session.config
    if hasattr(config, "workerinput") or os.environ.get("NUMVAR_TEST_WARMUP", "1") == "0":
        return
    n = getattr(config.option, "numprocesses", None)
    if not isinstance(n, int) or n < 2 or getattr(config.option, "dist", "no") == "no":
        return
    import _warmup

    tr = config.pluginmanager.get_plugin("terminalreporter")
    log = tr.write_line if tr is not None else print
    log(f"numba warm-up over {n} processes (NUMVAR_TEST_WARMUP=0 skips it):")
    log(f"numba warm-up: {_warmup.warm(n, log):.1f} s")
