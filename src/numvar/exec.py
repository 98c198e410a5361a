"""Run an unmodified Python script or module with numvar switched on.

    python -m numvar.exec script.py [args...]
    python -m numvar.exec -m package.module [args...]

Like ``python script.py`` (the script runs as ``__main__`` through :mod:`runpy`, with
its ``sys.argv`` and ``sys.path[0]`` as Python would set them), except that:

- when ``NUMVAR_MODE`` is set, the instrumentation is entered before the script's first
  line (``numvar.instrument.FuzzyConfig.from_env()``: ``NUMVAR_MODE``,
  ``NUMVAR_GRANULARITY``, ``NUMVAR_PRECISION``, ``NUMVAR_SEED``, ``NUMVAR_EXCLUDE``,
  ``NUMVAR_INCLUDE``, ``NUMVAR_MODULES``, ``NUMVAR_STRICT``) and left after its last;
  ops that escaped it are written to the result (``escapes``);
- when ``NUMVAR_REFERENCE=1`` (the IEEE reference of ``numvar run``), the script runs
  natively inside :func:`numvar.instrument.reference_path`, the realizations' code path;
- when ``NUMVAR_RUNNER`` holds a runner spec (JSON, set by ``numvar run``), captures
  are recorded (``numvar.capture`` calls, top-level module outputs, ``layers``
  globs; at most ``capture_limit`` bytes) and written to the spec's ``result`` file
  when the script ends, with the thread counts in effect, the digests of the random
  states the script started from (restored from the spec's ``rng``), the script's
  time and the part of it numba spent compiling (``compile_s``).

Exit status: the script's own (``sys.exit(n)`` → n, an uncaught exception → 1 with its
traceback on stderr); 2 for a usage error of this launcher.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

USAGE = "usage: python -m numvar.exec [-m module | script.py] [args...]"


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: get SIGKILLed when the process that launched us dies (no orphans)."""
    if not parent_pid or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - exotic libc
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(137)


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """-> (module, script, rest); raises SystemExit(2) on bad usage."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    if argv[0] == "-m":
        if len(argv) < 2:
            print(f"numvar.exec: error: -m needs a module name\n{USAGE}", file=sys.stderr)
            raise SystemExit(2)
        return argv[1], None, argv[2:]
    if argv[0].startswith("-"):
        print(f"numvar.exec: error: unknown option {argv[0]!r}\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    if not os.path.isfile(argv[0]):
        print(f"numvar.exec: error: script not found: {argv[0]}", file=sys.stderr)
        raise SystemExit(2)
    return None, argv[0], argv[1:]


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    module, script, rest = _parse(argv)
    spec: dict[str, Any] | None = None
    raw = os.environ.get("NUMVAR_RUNNER")
    if raw:
        spec = json.loads(raw)
        _die_with_parent(spec.get("parent_pid"))

    import runpy

    from .runner.collect import Collector, ModuleHooks, collecting

    # sys.path[0] as `python script.py` / `python -m module` would set it
    if script is not None:
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        sys.path[0] = (spec or {}).get("invoke_dir") or os.getcwd()

    ctx = None
    if os.environ.get("NUMVAR_MODE"):
        from .instrument import Fuzzy, FuzzyConfig

        cfg = FuzzyConfig.from_env()
        ctx = Fuzzy(cfg) if cfg is not None else None
    elif os.environ.get("NUMVAR_REFERENCE") == "1":
        from .instrument import reference_path

        ctx = reference_path()
    info: dict[str, Any] = {}
    if spec and spec.get("threads"):
        from .runner.engine import limit_threads

        # numba's pool only when instrumented: an uninstrumented run should not start it
        info["threads"] = limit_threads(int(spec["threads"]), numba=ctx is not None)

    capture = set((spec or {}).get("capture") or ())
    limit = (spec or {}).get("capture_limit")
    collector = Collector(limit=int(limit) if limit else None)
    hooks = ModuleHooks(collector, top_level="modules" in capture,
                        layers=(spec or {}).get("layers") or ())
    timer = _compile_timer(ctx is not None)
    if spec and spec.get("rng"):  # the program state every realization starts from
        from .runner.rng import restore

        info["rng"] = restore(spec["rng"])
    code = 0
    t0 = time.perf_counter()
    with collecting(collector) if spec else _null(), timer:
        with hooks if spec else _null():
            try:
                if ctx is not None:
                    ctx.__enter__()
                try:
                    if module is not None:
                        sys.argv = [module, *rest]
                        runpy.run_module(module, run_name="__main__", alter_sys=True)
                    else:
                        sys.argv = [script, *rest]
                        runpy.run_path(script, run_name="__main__")
                finally:
                    if ctx is not None:
                        ctx.__exit__(*sys.exc_info())
            except SystemExit as exc:
                code = _exit_code(exc)
            except KeyboardInterrupt:
                traceback.print_exc()
                code = 130
            except BaseException:
                traceback.print_exc()
                code = 1
    info["script_s"] = time.perf_counter() - t0
    info["compile_s"] = getattr(timer, "seconds", 0.0)
    if collector.dropped:
        info["dropped"] = collector.dropped
    sys.stdout.flush()
    if spec and spec.get("result"):
        escapes = ctx.report().escapes() if hasattr(ctx, "report") else None
        if escapes:
            info["escapes"] = escapes
        code = _write_result(spec["result"], collector, code, info) or code
    return code


def _compile_timer(instrumented: bool) -> Any:
    """Time numba spends compiling inside the script (only instrumented runs compile)."""
    if not instrumented:
        return _null()
    from .runner.warmup import CompileTimer

    return CompileTimer()


def _write_result(path: str, collector: Any, code: int, extra: dict[str, Any]) -> int:
    """Write the captures (or the capture error) to ``path``; returns 2 on capture errors."""
    from ._io import atomic_write_bytes
    from .errors import CaptureError
    from .runner.transport import pack

    info: dict[str, Any] = {"status": "ok" if code == 0 else "failed", **extra}
    tensors: dict = {}
    ret = 0
    if code == 0:
        try:
            tensors, kinds = collector.finish()
            info["kinds"] = kinds
        except CaptureError as exc:
            print(f"numvar.exec: error: {exc}", file=sys.stderr)
            info.update(status="failed", error=str(exc))
            ret = 2
    atomic_write_bytes(path, pack(tensors, info))
    return ret


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
