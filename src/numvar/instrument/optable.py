"""How numvar handles every aten op it knows, at each granularity: :func:`ops_table`.

Generated from the handler table (:mod:`numvar.instrument.handlers`), the
classification of :mod:`numvar.instrument.ops` and the dispatch decision of
:class:`numvar.instrument.FuzzyMode` (the same function the mode calls), so it cannot
drift from what the mode does. ``python -m numvar.instrument.optable`` prints it as
Markdown (``--format json`` for JSON); ``numvar ops`` is the same command.

Each op gets one of these handlings per granularity:

=====================  ==============================================================
handling               meaning
=====================  ==============================================================
``flop kernel``        a handler rounds every scalar operation (or, at ``op``
                       granularity, the op's result once)
``decomposition``      split into aten ops (torch._decomp, the op's
                       CompositeImplicitAutograd kernel, or per tensor), each handled
                       by its own entry
``rounded once``       the float64 result rounded once: by design for transcendental
                       functions at ``flop`` granularity and for every op at ``op``
                       granularity; an *escape* for other ops at ``flop`` granularity
``exact``              never perturbed: data movement, exact results, random draws
``in place``           computed by its functional form (next column), copied into place
``not reached``        a fused kernel that the block's switches turn off (the composite
                       path runs instead)
=====================  ==============================================================
"""

from __future__ import annotations

import json
import sys

import torch

from . import handlers as H
from . import mode as M
from . import ops as O
from .codepath import AVOIDED_OPS

#: columns of the table
COLUMNS = ("op", "flop", "op granularity", "why")


def _packets() -> list[str]:
    names: set[str] = set(O.EXACT_OPS) | set(O.DECOMPOSED_OPS) | set(O.TRANSCENDENTAL_OPS)
    names |= set(H.FLOP_HANDLERS) | set(H.OP_HANDLERS) | set(H.PER_TENSOR)
    for globs in O.OP_KINDS.values():
        names |= {g for g in globs if "*" not in g}
    names |= {f"aten.{n}" for n in ("linear", "matmul", "conv2d", "batch_norm", "layer_norm",
                                    "lstm", "gru", "einsum", "dropout")}
    return sorted(names)


def _overload(packet: str):
    ns, name = packet.split(".", 1)
    pk = getattr(getattr(torch.ops, ns), name, None)
    if pk is None:
        return None
    ovs = pk.overloads()
    if not ovs:
        return None
    return getattr(pk, "default" if "default" in ovs else ovs[0])


def _handling(func, granularity: str) -> tuple[str, str]:
    """(handling, reason) of ``func`` at ``granularity``, as the mode decides it."""
    info = M._classify(func, granularity)
    if info.functional is not None:
        fname = M.O.packet_name(info.functional)
        return f"in place: as {fname}", "mutating op: its functional form, copied into place"
    if info.kind == M.K_EXACT:
        tags = getattr(func, "tags", ())
        if info.packet in O.EXACT_OPS:
            return "exact", "data movement or an exact result (ops.EXACT_OPS)"
        if torch.Tag.nondeterministic_seeded in tags:
            return "exact", "random draw from torch's RNG (never perturbed)"
        return "exact", "a view (aliases its input)"
    if info.kind == M.K_HANDLER:
        return ("flop kernel" if granularity == "flop" else "rounded once"), f"handler: {info.how}"
    if info.kind == M.K_DECOMP:
        why = info.how if info.how == M.COMPOSITE else "torch._decomp decomposition"
        return "decomposition", why
    if info.kind == M.K_FOREACH:
        return "decomposition", info.how
    if info.kind == M.K_F64:
        return "rounded once", "transcendental or pointwise function: float64 result rounded once"
    if granularity == "flop":
        return "rounded once (ESCAPE)", "no flop handler: the op result rounded once"
    return "rounded once", "op granularity: float64 result rounded once"


def ops_table() -> list[dict[str, str]]:
    """Every aten op numvar knows, with its handling at each granularity and why.

    One row per op (its ``default`` overload, else the first one): ``{"op", "flop",
    "op granularity", "why"}``. Ops that the block's switches keep from running say
    ``not reached``.
    """
    rows = []
    for packet in _packets():
        if packet in AVOIDED_OPS:
            rows.append({"op": packet, "flop": "not reached", "op granularity": "not reached",
                         "why": AVOIDED_OPS[packet]})
            continue
        func = _overload(packet)
        if func is None:
            continue
        hf, wf = _handling(func, "flop")
        ho, wo = _handling(func, "op")
        why = wf if wf == wo else f"flop: {wf}; op: {wo}"
        rows.append({"op": packet, "flop": hf, "op granularity": ho, "why": why})
    for packet, why in sorted(AVOIDED_OPS.items()):
        if packet not in {r["op"] for r in rows}:
            rows.append({"op": packet, "flop": "not reached", "op granularity": "not reached",
                         "why": why})
    return rows


def to_markdown(rows: list[dict[str, str]]) -> str:
    """The table as GitHub Markdown (``|`` escaped)."""
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def render(fmt: str = "markdown") -> str:
    """:func:`ops_table` as ``markdown`` or ``json``."""
    from ..errors import ConfigError

    rows = ops_table()
    if fmt == "markdown":
        return ("<!-- generated by `python -m numvar.instrument.optable`; do not edit -->\n\n"
                + to_markdown(rows))
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    raise ConfigError(f"format must be 'markdown' or 'json', got {fmt!r}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fmt = "markdown"
    if args[:1] == ["--format"] and len(args) == 2:
        fmt = args[1]
    elif args:
        print("usage: python -m numvar.instrument.optable [--format markdown|json]",
              file=sys.stderr)
        return 2
    sys.stdout.write(render(fmt))
    return 0


__all__ = ["ops_table", "render", "to_markdown", "COLUMNS"]

if __name__ == "__main__":
    sys.exit(main())
