"""Write docs/reference/cli.md from the ``numvar`` typer app (the same click command tree
that ``numvar --help`` prints). ``tests/test_docs_examples.py`` checks the committed file
is current; as an mkdocs hook (``on_page_markdown``) it also regenerates the page at build
time, so the site never shows a stale reference.

    PYTHONPATH=src python docs/gen_cli_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "reference" / "cli.md"

HEADER = """# Command line

Generated from the `numvar` command itself (`python docs/gen_cli_reference.py`); the same
text as `numvar COMMAND --help`. Every command exits with status 0 on success, 2 on bad
input (one line naming the culprit), 1 when the work ran but found a failure
(`run`: failed realizations; `determinism check`: a divergence).
"""


def _help_markdown(text: str) -> list[str]:
    out = []
    for para in text.split("\n\n"):
        if para.startswith("Example"):
            head, _, rest = para.partition("\n")
            out += [f"{head}", "", "```text"]
            out += [f"$ {ln.strip().removeprefix('$ ')}" for ln in rest.splitlines()
                    if ln.strip()]
            out += ["```", ""]
        else:
            out += [para.replace("|", "\\|").replace("*", "\\*"), ""]
    return out


def _option_row(param) -> str:
    names = ", ".join(f"`{o}`" for o in [*param.opts, *getattr(param, "secondary_opts", [])])
    meta = param.metavar or ""
    help_text = (param.help or "").replace("|", "\\|").replace("\n", " ")
    return f"| {names} | {meta} | {help_text} |"


def _command(cmd, ctx, path: list[str]) -> list[str]:
    name = " ".join(path)
    out = [f"## `{name}`" if len(path) > 1 else "## `numvar`", ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += ["```text", f"Usage: {name} {usage}", "```", ""]
    if cmd.help:
        out += _help_markdown(cmd.help)
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    opts = [p for p in cmd.params if p.param_type_name == "option"]
    if args:
        out += ["| argument | description |", "|---|---|"]
        out += [f"| {(p.metavar or p.name.upper()).replace('|', chr(92) + '|')} | "
                f"{(getattr(p, 'help', None) or '').replace('|', chr(92) + '|')} |" for p in args]
        out.append("")
    if opts:
        out += ["| option | value | description |", "|---|---|---|"]
        out += [_option_row(p) for p in opts]
        out.append("")
    for sub_name, sub in getattr(cmd, "commands", {}).items():
        sub_ctx = sub.context_class(sub, info_name=sub_name, parent=ctx)
        out += _command(sub, sub_ctx, [*path, sub_name])
    return out


def render() -> str:
    """The Markdown of the CLI reference."""
    from numvar.cli import command

    root = command()
    ctx = root.context_class(root, info_name="numvar")
    return HEADER + "\n" + "\n".join(_command(root, ctx, ["numvar"])).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """mkdocs hook (mkdocs.yml ``hooks:``): the site's CLI page is always generated from
    the command as built, even when the committed copy is stale."""
    if page.file.src_uri == "reference/cli.md":
        return render()
    return markdown
