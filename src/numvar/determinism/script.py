"""Record a whole script's op hashes, or check a run of it against a recording.

The script runs in a child interpreter (``python -m numvar.determinism.launch``) under
:class:`HashMode`; the child writes a small result file the parent reads back.
Reference folder layout: ``REF/hashes.json`` (op sequence, hashes, deduplicated stacks).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numvar

from .._io import read_json
from ..errors import ConfigError, RunError, StoreError
from .hashmode import OpDivergence
from ._stack import frames_from_json

__all__ = ["RecordResult", "CheckResult", "record_script", "check_script", "HASHES_FILE",
           "FORMAT", "load_hashes", "launcher_command"]

HASHES_FILE = "hashes.json"
FORMAT = "numvar.determinism.hashes"
VERSION = 1
_PY = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?", re.I)


@dataclass
class RecordResult:
    path: Path                  # the hashes.json written
    n_ops: int
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class CheckResult:
    identical: bool
    n_ops: int
    reference_ops: int
    n_differing: int            # ops whose outputs differ while the sequences align
    divergence: OpDivergence | None
    returncode: int             # the script's exit status

    def message(self, limit: int | None = 10) -> str:
        if self.identical:
            return f"bitwise identical ({self.n_ops} ops)"
        if self.divergence is None:
            return f"the script exited with status {self.returncode}"
        s = "first divergent op:\n" + self.divergence.format(limit)
        if self.n_differing > 1:
            s += f"\n{self.n_differing} op(s) differ in all while the op sequences align"
        s += f"\n({self.n_ops} ops in this run, {self.reference_ops} in the reference)"
        return s


def launcher_command(command: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``python [flags] (SCRIPT | -m MODULE) args...`` into the interpreter part
    (with the launcher module appended) and the target/argument part."""
    command = list(command)
    if not command:
        raise ConfigError("no command given after `--` (e.g. `-- python train_step.py`)")
    first = command[0]
    if _PY.fullmatch(os.path.basename(first)):
        exe = shutil.which(first) or first
        rest = command[1:]
    elif first.endswith(".py"):
        exe, rest = sys.executable, command
    else:
        raise ConfigError(f"cannot run {first!r}: the command must be `python SCRIPT.py ...`,"
                          " `python -m MODULE ...` or `SCRIPT.py ...`")
    flags: list[str] = []
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        f = rest.pop(0)
        flags.append(f)
        if f in ("-W", "-X") and rest:
            flags.append(rest.pop(0))
    if not rest:
        raise ConfigError("no script or -m MODULE in the command")
    if "-c" in flags:
        raise ConfigError("`python -c CODE` is not supported: put the code in a script file")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise ConfigError("`-m` needs a module name")
        target = ["--module", rest[1], "--", *rest[2:]]
    else:
        if not Path(rest[0]).is_file():
            raise ConfigError(f"script not found: {rest[0]}")
        target = ["--script", rest[0], "--", *rest[1:]]
    return [exe, *flags, "-m", "numvar.determinism.launch"], target


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(numvar.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def load_hashes(path: str | os.PathLike) -> dict[str, Any]:
    """Load a recording (``REF/`` or ``REF/hashes.json``); StoreError if missing/corrupt."""
    p = Path(path)
    if p.is_dir() or not p.suffix:
        p = p / HASHES_FILE
    if not p.is_file():
        raise StoreError(f"no recording at {p} (run `numvar determinism record -o DIR -- ...`"
                         " first)")
    d = read_json(p)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise StoreError(f"{p} is not a numvar determinism recording")
    if d.get("version") != VERSION or not isinstance(d.get("hash_mode"), dict) \
            or not isinstance(d["hash_mode"].get("ops"), list):
        raise StoreError(f"corrupt or unsupported recording {p}")
    return d


def _launch(args: list[str], command: Sequence[str]) -> dict[str, Any]:
    head, target = launcher_command(command)
    with tempfile.TemporaryDirectory(prefix="numvar-det-") as tmp:
        result = Path(tmp) / "result.json"
        proc = subprocess.run([*head, *args, "--result", str(result), *target], env=_env())
        if not result.is_file():
            raise RunError(f"the launcher exited with status {proc.returncode} without a "
                           "result (see its output above)")
        res = read_json(result)
    if res.get("error"):
        raise StoreError(res["error"]) if res.get("error_kind") == "store" else \
            RunError(res["error"])
    return res


def record_script(command: Sequence[str], out: str | os.PathLike, *,
                  stacks: bool = True) -> RecordResult:
    """Run ``command`` (``["python", "train_step.py", ...]``) under HashMode and write
    ``out/hashes.json``. RunError when the script fails (nothing is written then)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out}: exists and is not a folder")
    args = ["--record", str(out.resolve())] + ([] if stacks else ["--no-stacks"])
    res = _launch(args, command)
    if res.get("returncode", 0) != 0:
        raise RunError(f"the script exited with status {res['returncode']}; "
                       "no reference written")
    return RecordResult(out / HASHES_FILE, int(res["n_ops"]), dict(res.get("counts", {})))


def check_script(reference: str | os.PathLike, command: Sequence[str]) -> CheckResult:
    """Run ``command`` under HashMode, comparing each op with the recording in
    ``reference`` as it runs."""
    ref = Path(reference)
    load_hashes(ref)  # fail early and clearly
    res = _launch(["--check", str(ref.resolve())], command)
    div = res.get("divergence")
    d = None
    if div:
        d = OpDivergence(int(div["index"]), str(div["kind"]), div.get("op"),
                         div.get("reference_op"), div.get("occurrence"),
                         list(div.get("outputs") or []), list(div.get("reference_outputs") or []),
                         frames_from_json(div.get("stack")),
                         frames_from_json(div.get("reference_stack")))
    rc = int(res.get("returncode", 0))
    return CheckResult(identical=d is None and rc == 0, n_ops=int(res["n_ops"]),
                       reference_ops=int(res.get("reference_ops", 0)),
                       n_differing=int(res.get("n_differing", 0)), divergence=d, returncode=rc)
