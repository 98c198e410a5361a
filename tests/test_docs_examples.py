"""Every example of the documentation runs: the README's and docs/'s code blocks.

Conventions (docs/internals.md, "Documentation examples"):

- A ```python block with ``title="NAME"`` is a file the page shows: it is written to
  NAME in the page's working directory, not run.
- Other ```python blocks run in page order, in one namespace per page, with the page's
  working directory (a fresh temporary folder) as the current directory.
- ```console blocks: lines starting with ``$ `` are commands (a trailing ``\\`` joins
  the next line), the rest is output and is not checked. ```bash blocks: every line is
  a command, ``#`` comments aside. Commands run in bash, in the same folder, with
  ``numvar`` on the PATH (this checkout's), and must exit with status 0.
- ``<!-- docs-test: skip REASON -->`` on the line before a fence leaves that block out;
  a reason is required. Such blocks are few: installing packages, the full demo, a SLURM
  cluster, the benchmarks (minutes each); each is run by its own test or script.

Also here: the CLI reference (docs/reference/cli.md) is what docs/gen_cli_reference.py
generates now, and ``mkdocs build --strict`` passes (no broken link or reference).
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_RE = re.compile(r"<!--\s*docs-test:\s*skip\b\s*(.*?)\s*-->")
FENCE_RE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)$")
#: generated (its examples are the --help texts') and the other branches' placeholders
NOT_EXAMPLES = {"reference/cli.md"}


def pages() -> list[Path]:
    out = [ROOT / "README.md"]
    out += sorted(p for p in DOCS.rglob("*.md")
                  if p.relative_to(DOCS).as_posix() not in NOT_EXAMPLES)
    return out


def blocks(path: Path) -> list[dict]:
    """The fenced blocks of a Markdown page: lang, title, code, skip reason, line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, attrs = len(m["indent"]), m["lang"], m["attrs"]
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(ln[indent:] for ln in lines[i + 1:j])
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP_RE.search(prev)
        title = re.search(r'title="([^"]+)"', attrs)
        out.append({"lang": lang, "title": title[1] if title else None, "code": code,
                    "skip": None if skip is None else skip[1], "line": start + 1})
        i = j + 1
    return out


def commands(block: dict) -> list[str]:
    """Shell commands of a bash or console block (continuation lines joined)."""
    cmds, cur = [], None
    for ln in block["code"].splitlines():
        if block["lang"] == "console":
            if cur is None and not ln.startswith("$ "):
                continue
            ln = ln[2:] if cur is None else ln
        elif cur is None and (not ln.strip() or ln.lstrip().startswith("#")):
            continue
        cur = ln if cur is None else cur + "\n" + ln
        if not ln.rstrip().endswith("\\"):
            cmds.append(cur)
            cur = None
    return cmds


def _shim(bin_dir: Path) -> dict:
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "numvar"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m numvar.cli \"$@\"\n")
    shim.chmod(0o755)
    py = bin_dir / "python"
    py.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    py.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("NUMBA_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    env["COLUMNS"] = "100"
    return env


RUNNABLE = ("python", "bash", "console")
SHELL_SYNTAX = re.compile(r"[|;&<>$`*?]|^\w+=")


def run_command(cmd: str, work: Path, env: dict, where: str, capsys) -> None:
    """Run one documented command; it must exit with status 0.

    A plain ``numvar ARGS`` (no shell syntax) runs in this process through
    ``numvar.cli.main`` (what the ``numvar`` entry point calls), which saves a Python
    start and a torch import per command; anything else runs in bash."""
    words = shlex.split(cmd.replace("\\\n", " "))
    if words and words[0] == "numvar" and not SHELL_SYNTAX.search(cmd.replace("'*'", "")):
        from numvar.cli import main

        rc = main(words[1:])
        out = capsys.readouterr()
        assert rc == 0, f"{where}: `{cmd}` exited {rc}\n{out.out[-2000:]}\n{out.err[-3000:]}"
        return
    r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (f"{where}: `{cmd}` exited {r.returncode}\n"
                               f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_examples_run(page, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    env = _shim(tmp_path / "bin")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))      # `from model import build`, as in a script
    before = set(sys.modules)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "100")
    namespace: dict = {"__name__": "__main__"}
    ran = 0
    for b in blocks(page):
        where = f"{page.relative_to(ROOT)}:{b['line']}"
        if b["lang"] not in RUNNABLE:
            continue
        if b["skip"] is not None:
            assert b["skip"], f"{where}: a skipped block needs a reason"
            continue
        if b["lang"] == "python" and b["title"]:
            (work / b["title"]).parent.mkdir(parents=True, exist_ok=True)
            (work / b["title"]).write_text(b["code"] + "\n")
            continue
        if b["lang"] == "python":
            try:
                exec(compile(b["code"], where, "exec"), namespace)
            except Exception as exc:  # name the block, keep the traceback
                raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
        else:
            for cmd in commands(b):
                run_command(cmd, work, env, where, capsys)
        ran += 1
    for name in set(sys.modules) - before:    # the page's own modules (model.py, ...)
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(work)):
            del sys.modules[name]
    print(f"{page.relative_to(ROOT)}: {ran} block(s) run")


def test_conventions_are_parsed():
    md = ("x\n<!-- docs-test: skip needs a GPU -->\n```python\nprint(1)\n```\n"
          '```python title="m.py"\nA = 1\n```\n```console\n$ numvar --version\nnumvar 1\n'
          "$ echo a \\\n  b\n```\n```bash\n# comment\nls\n```\n")
    p = Path(os.environ.get("TMPDIR", "/tmp")) / "numvar-docs-conventions.md"
    p.write_text(md)
    try:
        bs = blocks(p)
    finally:
        p.unlink()
    assert [b["skip"] for b in bs] == ["needs a GPU", None, None, None]
    assert bs[1]["title"] == "m.py"
    assert commands(bs[2]) == ["numvar --version", "echo a \\\n  b"]
    assert commands(bs[3]) == ["ls"]


def test_cli_reference_is_current():
    gen = runpy.run_path(str(DOCS / "gen_cli_reference.py"))
    assert (DOCS / "reference" / "cli.md").read_text(encoding="utf-8") == gen["render"](), \
        "docs/reference/cli.md is stale: run `python docs/gen_cli_reference.py`"


def test_mkdocs_build_strict(tmp_path):
    # no -q: with it, mkdocs does not count warnings and --strict lets them pass
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                        "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1",
                            "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
