"""`python -m numvar.exec`: runs a script as __main__ with the instrumentation from NUMVAR_*."""

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

PROBE = """\
import os, sys
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
modes = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
print("name", __name__)
print("argv", sys.argv[1:])
print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("modes", modes)
sys.exit(int(sys.argv[1]))
"""


def launch(args, cwd, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMVAR_")}
    full.update(PYTHONPATH=SRC, **env)
    return subprocess.run([sys.executable, "-m", "numvar.exec", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def test_launcher_runs_the_script_instrumented_as_main(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    r = launch(["sub/probe.py", "3", "--flag"], tmp_path, NUMVAR_MODE="sr", NUMVAR_SEED="5")
    assert r.returncode == 3, r.stderr  # the script's own exit status
    lines = r.stdout.splitlines()
    assert lines[:3] == ["name __main__", "argv ['3', '--flag']", "path0 True"]
    assert lines[3].startswith("modes [") and lines[3] != "modes []"  # instrumented


def test_launcher_usage_errors(tmp_path):
    r = launch(["missing.py"], tmp_path)
    assert r.returncode == 2 and "script not found: missing.py" in r.stderr
    r = launch(["-m"], tmp_path)
    assert r.returncode == 2 and "-m needs a module name" in r.stderr
    r = launch(["-c", "print(1)"], tmp_path)
    assert r.returncode == 2 and "unknown option '-c'" in r.stderr
