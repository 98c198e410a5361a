"""Child-process launcher: ``python -m numvar.determinism.launch (--record DIR | --check
REF) --result FILE (--script PATH | --module NAME) -- ARGS...``.

Runs the target as ``__main__`` (runpy) under HashMode, then writes the recording
(``--record``) and a result summary for the parent (``--result``).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from ..exec import _exit_code


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    p = argparse.ArgumentParser(prog="python -m numvar.determinism.launch")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--record", metavar="DIR")
    g.add_argument("--check", metavar="REF")
    p.add_argument("--result", required=True)
    p.add_argument("--no-stacks", action="store_true")
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--script")
    t.add_argument("--module")
    return p.parse_args(own), rest


def _run_target(ns: argparse.Namespace, args: list[str]) -> int:
    if ns.script:
        sys.argv = [ns.script, *args]
        sys.path[0] = str(Path(ns.script).resolve().parent)  # as `python SCRIPT` sets it
        runner = lambda: runpy.run_path(ns.script, run_name="__main__")  # noqa: E731
    else:
        sys.argv = [ns.module, *args]
        sys.path[0] = os.getcwd()  # as `python -m MODULE` sets it
        runner = lambda: runpy.run_module(ns.module, run_name="__main__", alter_sys=True)  # noqa: E731
    try:
        runner()
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ns, args = _parse(sys.argv[1:] if argv is None else argv)
    import torch

    from .._io import atomic_write_json
    from ..errors import NumvarError, StoreError
    from .hashmode import HashMode
    from .script import FORMAT, HASHES_FILE, VERSION, load_hashes

    result: dict[str, Any] = {}
    try:
        if ns.check:
            ref = load_hashes(ns.check)
            ops, stacks = HashMode.records_from_json(ref["hash_mode"])
            mode = HashMode(record_stacks=False, reference=ops, reference_stacks=stacks)
            result["reference_ops"] = len(ops)
        else:
            mode = HashMode(record_stacks=not ns.no_stacks)
    except NumvarError as exc:
        result = {"error": str(exc), "error_kind": "store" if isinstance(exc, StoreError)
                  else "other"}
        atomic_write_json(ns.result, result)
        return 2

    # Anomaly mode (without NaN checks) makes autograd remember each node's forward
    # call, so that ops run in backward report the user line that created them.
    prev = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    if not ns.no_stacks:
        torch.set_anomaly_enabled(True, False)
    try:
        with mode:
            rc = _run_target(ns, args)
    finally:
        torch.set_anomaly_enabled(*prev)
    sys.stdout.flush()
    result.update({"returncode": rc, "n_ops": len(mode.records), "counts": dict(mode.counts)})
    if ns.check:
        d = mode.finish()
        result["divergence"] = d.to_json() if d is not None else None
        result["n_differing"] = mode.n_differing
    elif rc == 0:
        atomic_write_json(Path(ns.record) / HASHES_FILE, {
            "format": FORMAT, "version": VERSION, "torch": torch.__version__,
            "target": ns.script or ns.module, "args": args, "hash_mode": mode.to_json()})
    atomic_write_json(ns.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
