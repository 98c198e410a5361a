"""A fork server for realization processes (the "zygote").

Starting Python and importing torch costs seconds per realization; the scripts
themselves are often faster than that. The zygote is one process that imports torch
and numvar once, then forks a realization process per request. Each realization is
still a separate process that has run no user code before: its environment, working
directory, stdin/stdout/stderr, ``sys.argv`` and ``sys.path[0]`` are set as for
``python -m numvar.exec``, and Python's and numpy's global random generators are
reseeded from the OS, as in a fresh interpreter (``numvar run`` then sets every
generator to the run's recorded state: :mod:`numvar.runner.rng`). Torch's and numba's
thread counts are set in the realization (:func:`numvar.runner.engine.limit_threads`).

Per request the zygote forks a supervisor, which forks the realization, reports its
pid, waits for it and reports its exit status (negative: killed by that signal, as
``subprocess.Popen.returncode``). Supervisors and realizations die with their parent
(Linux ``PR_SET_PDEATHSIG``); the zygote exits when its client process goes away.

POSIX only. ``NUMVAR_ZYGOTE=0`` turns it off (every realization is then a plain
``python -m numvar.exec`` subprocess); results are the same either way.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Any

# Variables that configure one realization: the instrumentation's (numvar.instrument.
# config.ENV_VARS) and the runner's own. They are set per task and never inherited from
# the parent; every other NUMVAR_* variable (NUMVAR_CACHE_DIR, NUMVAR_ZYGOTE, ...) passes.
RUN_ENV_VARS = frozenset({
    "NUMVAR_MODE", "NUMVAR_GRANULARITY", "NUMVAR_PRECISION", "NUMVAR_SEED",
    "NUMVAR_EXCLUDE", "NUMVAR_INCLUDE", "NUMVAR_MODULES", "NUMVAR_STRICT", "NUMVAR_REFERENCE",
    "NUMVAR_FORMAT", "NUMVAR_ACCUMULATE", "NUMVAR_CONTRACTION",
    "NUMVAR_RUNNER", "NUMVAR_REALIZATION", "NUMVAR_WORKDIR", "NUMVAR_INVOKE_DIR",
})


def inheritable_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the per-realization variables of :data:`RUN_ENV_VARS`."""
    return {k: v for k, v in env.items() if k not in RUN_ENV_VARS}

log = logging.getLogger(__name__)

#: file holding the pid of the process that owns a numvar temporary folder
OWNER_FILE = "numvar-owner"


def mark_owner(folder: str | os.PathLike) -> None:
    """Mark a temporary folder as this process's, so that a later run can remove it
    once this process is gone (``numvar.runner.script.cleanup_leftovers``)."""
    try:
        with open(os.path.join(folder, OWNER_FILE), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass


def enabled() -> bool:
    return (os.environ.get("NUMVAR_ZYGOTE", "1") != "0" and hasattr(os, "fork")
            and hasattr(socket, "AF_UNIX"))


def _pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))
    except Exception:  # pragma: no cover
        pass


# -- server side --------------------------------------------------------------------
def _recv_line(conn: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _realization(req: dict[str, Any]) -> int:
    """In the forked realization process: set it up like a fresh interpreter, run."""
    import random

    # as a fresh interpreter: KeyboardInterrupt on SIGINT, unless the client ignores SIGINT
    signal.signal(signal.SIGINT, signal.SIG_IGN if req.get("sigint_ignored")
                  else signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _pdeathsig()
    fd_in = os.open(os.devnull, os.O_RDONLY)
    fd_out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fd_err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    env = dict(req["env"])
    if env.get("NUMVAR_RUNNER"):
        spec = json.loads(env["NUMVAR_RUNNER"])
        spec["parent_pid"] = os.getppid()
        env["NUMVAR_RUNNER"] = json.dumps(spec)
    os.environ.clear()
    os.environ.update(env)
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    from ..exec import main

    try:
        code = main(req["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return code


def _supervise(conn: socket.socket, req: dict[str, Any]) -> None:
    """In the forked supervisor: fork the realization, report pid and exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _pdeathsig()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            conn.close()
            code = _realization(req)
        finally:
            os._exit(code & 0xFF if code >= 0 else 1)
    conn.sendall(f"pid {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())


def preload() -> None:
    """Import what every realization needs, once, without starting any thread pool
    (a process that has run numba's or torch's OpenMP pool must not fork)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    from .. import exec as _exec  # noqa: F401
    from . import collect, transport  # noqa: F401

    try:
        from .. import instrument  # noqa: F401
    except Exception:  # reported by the realizations that need it
        pass
    _warm_dispatch()
    _warm_numba()


def _warm_numba() -> None:
    """numba's first compilation sets up its typing and target contexts (seconds); do it
    with a trivial serial function, which starts no thread pool."""
    try:
        import numba
    except ImportError:  # pragma: no cover
        return

    @numba.njit(cache=False)
    def _one(x):
        return x + 1.0

    _one(1.0)


def _warm_dispatch() -> None:
    """Entering a dispatch mode the first time imports ~800 modules (seconds); do it
    here once. One tiny op: no thread pool is started, so forking stays safe."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Warm(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _Warm():
        torch.ones(2) + torch.ones(2)


def serve(path: str) -> None:
    """Zygote main loop: preload, say ``ready``, fork on every request."""
    client = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's to handle
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped automatically
    preload()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    srv.settimeout(1.0)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            if os.getppid() != client:
                return
            continue
        conn.settimeout(None)
        try:
            req = json.loads(_recv_line(conn))
        except (ValueError, OSError):
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                srv.close()
                _supervise(conn, req)
            finally:
                os._exit(0)
        conn.close()


# -- client side --------------------------------------------------------------------
class ZygoteProcess:
    """A realization forked by the zygote; ``wait()`` returns its exit status."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._file = conn.makefile("r", encoding="ascii")
        line = self._file.readline().split()
        if len(line) != 2 or line[0] != "pid":
            raise OSError("the zygote did not start the realization")
        self.pid = int(line[1])
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            line = self._file.readline().split()
            # no status: the supervisor itself was killed; report the realization killed
            self.returncode = int(line[1]) if len(line) == 2 and line[0] == "exit" else -9
            self._file.close()
            self._conn.close()
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


class Zygote:
    """Client handle of a zygote process started with environment ``env``."""

    def __init__(self, env: dict[str, str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="numvar-zygote-")
        mark_owner(self._dir)
        self.path = os.path.join(self._dir, "z.sock")
        self._log = open(os.path.join(self._dir, "zygote.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "numvar.runner.zygote", self.path], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log)
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            self.close()
            raise OSError("the zygote failed to start")

    def spawn(self, argv: list[str], *, env: dict[str, str], cwd: str, stdout: str,
              stderr: str) -> ZygoteProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        req = {"argv": argv, "env": env, "cwd": cwd, "stdout": stdout, "stderr": stderr,
               "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}
        conn.sendall(json.dumps(req).encode() + b"\n")
        return ZygoteProcess(conn)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # its supervisors and realizations follow (PDEATHSIG)
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)


_ZYGOTES: dict[tuple, Zygote] = {}
_LOCK = threading.Lock()


def get(env: dict[str, str]) -> Zygote | None:
    """The zygote for this interpreter and PYTHONPATH (started on first use), or None
    when disabled or when it cannot start (then callers use plain subprocesses)."""
    if not enabled():
        return None
    key = (sys.executable, env.get("PYTHONPATH", ""), env.get("PYTHONHASHSEED"), os.getpid())
    with _LOCK:
        z = _ZYGOTES.get(key)
        if z is not None and z.alive():
            return z
        base = inheritable_env(env)
        try:
            z = Zygote(base)
        except OSError as exc:
            log.warning("zygote unavailable (%s); starting each realization from scratch", exc)
            return None
        _ZYGOTES[key] = z
        return z


def close_all() -> None:
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


import atexit  # noqa: E402

atexit.register(close_all)

if __name__ == "__main__":
    serve(sys.argv[1])
