"""``--help`` reads like documentation; ``--version``; ``dir(numvar)``; no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import numvar
from numvar.cli import command, main

SRC = Path(numvar.__file__).resolve().parent


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = [p for p, _ in _commands(command())]


def help_text(capsys, monkeypatch, path) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    assert main([*path, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "numvar")
def test_help_has_no_python_type_names_and_one_default_style(path, capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, path)
    for leak in ("<bool>", "<int>", "<str>", "<float>", "<list", "{", "python -m numvar.cli"):
        assert leak not in text, (leak, text)
    assert "[default:" not in text                     # defaults: "(default: X)" only
    assert "--n " not in text and "--n," not in text   # -n is -n
    assert text.lstrip().startswith(f"Usage: numvar {' '.join(path)}".rstrip())


def test_usage_lines_and_examples(capsys, monkeypatch):
    demo = help_text(capsys, monkeypatch, ["demo"])
    assert "COMMAND [ARGS]" not in demo.splitlines()[1]
    check = help_text(capsys, monkeypatch, ["determinism", "check"])
    assert "Usage: numvar determinism check [OPTIONS] REF -- COMMAND [ARGS]..." in check
    record = help_text(capsys, monkeypatch, ["determinism", "record"])
    assert "-- COMMAND [ARGS]..." in record.splitlines()[1]
    for cmd in ("run", "report", "compare", "bounds", "locate"):
        text = help_text(capsys, monkeypatch, [cmd])
        assert "Example" in text and f" $ numvar {cmd} " in text, cmd
    run = help_text(capsys, monkeypatch, ["run"])
    # the example stays on one line: hard-wrapped docstrings are joined, examples kept
    assert "numvar run -n 10 --jobs 2 --out runs/mnist -- python infer.py --batch 64" in run
    rounding = help_text(capsys, monkeypatch, ["demo", "rounding"])
    seed_line = next(ln for ln in rounding.splitlines() if "--seed" in ln)
    assert "Seed" in seed_line
    report = help_text(capsys, monkeypatch, ["report"])
    assert "--wide" in report and "(default: 10)" in report   # decimal digits by default


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"numvar {numvar.__version__} (torch ")


def test_dir_numvar_is_the_public_api():
    names = dir(numvar)
    assert names == sorted(numvar.__all__)
    for helper in ("Any", "annotations", "importlib", "_importlib"):
        assert helper not in names


# Entry points may import anything; the packages below them must form a DAG.
ENTRY_POINTS = {"", "cli", "exec"}


def _package_graph() -> dict[str, set[str]]:
    """numvar subpackage -> subpackages it imports (module-level and in functions)."""
    def part(mod: str) -> str:
        bits = mod.split(".")
        return bits[1] if len(bits) > 1 else ""

    graph: dict[str, set[str]] = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC.parent).with_suffix("")
        mod = ".".join(rel.parts).removesuffix(".__init__")
        base = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    b = base[:len(base) - node.level + 1]
                    targets.append(".".join(b + ([node.module] if node.module else [])))
                    targets += [".".join(b + [a.name]) for a in node.names] if not node.module \
                        else []
                else:
                    targets.append(node.module or "")
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            for t in targets:
                if t.startswith("numvar") and part(t) != part(mod):
                    graph.setdefault(part(mod), set()).add(part(t))
    return graph


def test_no_import_cycles_between_packages():
    graph = {k: v - ENTRY_POINTS for k, v in _package_graph().items() if k not in ENTRY_POINTS}
    assert "locate" not in graph.get("analysis", set())   # the former locate_json cycle
    seen: dict[str, int] = {}

    def visit(node, stack):
        if seen.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*stack, node])}")
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*stack, node])
        seen[node] = 2

    for node in sorted(graph):
        visit(node, [])
