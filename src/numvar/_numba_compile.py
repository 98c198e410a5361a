"""Two of numba's compiler passes copied in linear time, fixed at import
(:mod:`numvar.rounding.kernels`, which every numvar kernel module imports, imports this).

Why: a cold compile of numvar's kernels spent most of its time in numba's own Python
passes, copying IR, not in LLVM. Measured (numba 0.68.1, AMD EPYC Zen 4, a cold cache):
``kernels._narrow32`` took 46.4 s to compile on one core, 44.7 s of them in numba's
``InlineInlinables`` pass (45 million ``deepcopy`` calls under ``cProfile``); the whole
test warm-up (``tests/_warmup.py``, 2 processes) 515 s. docs/internals.md, "Compile
time", has the measurements with the fixes.

- **The inliner** (numba issue #8989): a function marked ``@njit(inline="always")`` is
  inlined by copying the callee's IR twice per call site (``InlineWorker.inline_ir``'s
  nested ``copy_ir``), block by block, each block under a ``deepcopy`` memo of its own.
  Every variable refers to the function's one ``Scope``, which lists all its variables,
  so each block's copy copied the whole Scope again: blocks × variables objects per
  copy, and numvar's kernels inline their rounding steps into vectorised loops several
  levels deep, one copy per rounding mode. Fixed: one memo for the blocks of one copy,
  which then share one Scope, as the original's blocks do.
- **Copy propagation** (``ir_utils.copy_propagate``, run on every ``parallel=True``
  kernel): it iterates its data-flow equations to a fixed point and snapshots its state
  each round with ``copy.deepcopy``, a dict of sets of (variable name, variable name)
  pairs: strings in tuples, nothing mutable below the sets. Fixed: the snapshot copies
  each set (the same snapshot).

How: each fix is numba's own function recompiled from its source with the lines of
:data:`FIXES` replaced (each found exactly the number of times given), installed as that
function's code (``__code__``: a module that imported the function by name runs the fix
too). Where the installed numba's source differs (numba changed it, perhaps fixed it),
that function is left as it is and its :data:`APPLIED` entry is false. The fixes change
what numba's compiler spends, not what it compiles: the same machine code
(``tests/test_numba_compile.py`` compares a kernel's assembly both ways; measured on
numvar's five heaviest kernels, ``_narrow32``, ``_cleanfma32``, ``_clean64``, ``_row64``
and ``_tile32``, each compiled in a process with the fixes and one without: the same
assembly byte for byte, numba's per-compile version number taken out of the symbol
names). ``NUMVAR_NUMBA_FIXES=0`` leaves numba alone.
"""

from __future__ import annotations

import inspect
import os
import textwrap
import types
from dataclasses import dataclass

from numba.core import inline_closurecall, ir_utils


@dataclass(frozen=True)
class Fix:
    """numba's ``function`` with each ``(old, new, count)`` of ``replacements``: the source
    line ``old`` (found ``count`` times) replaced by ``new``."""

    name: str
    function: types.FunctionType
    replacements: tuple[tuple[str, str, int], ...]


FIXES: tuple[Fix, ...] = (
    Fix("inline_closurecall.InlineWorker.inline_ir", inline_closurecall.InlineWorker.inline_ir,
        (("kernel_copy.blocks = {}", "kernel_copy.blocks = {}; _numvar_memo = {}", 1),
         ("new_block = copy.deepcopy(the_ir.blocks[block_label])",
          "new_block = copy.deepcopy(the_ir.blocks[block_label], _numvar_memo)", 1))),
    Fix("ir_utils.copy_propagate", ir_utils.copy_propagate,
        (("new_point = copy.deepcopy(out_copies)",
          "new_point = {_l: set(_c) for _l, _c in out_copies.items()}", 2),)),
)
#: each fixed function's own code, as imported
ORIGINAL_CODE: dict[str, types.CodeType] = {fix.name: fix.function.__code__ for fix in FIXES}
#: per fix, whether its function runs the fixed code
APPLIED: dict[str, bool] = {fix.name: False for fix in FIXES}


def fixed_code(function: types.FunctionType,
               replacements: tuple[tuple[str, str, int], ...]) -> types.CodeType | None:
    """``function``'s code compiled from its source with ``replacements`` made, or None
    where the source is not available or a line is not there the given number of times."""
    try:
        lines, first = inspect.getsourcelines(function)
        path = inspect.getsourcefile(function) or "<numba>"
    except (OSError, TypeError):
        return None
    source = "".join(lines)
    for old, new, count in replacements:
        if source.count(old) != count:
            return None
        source = source.replace(old, new)
    try:  # at numba's line numbers, for tracebacks
        module = compile("\n" * (first - 1) + textwrap.dedent(source), path, "exec")
    except SyntaxError:
        return None
    code = next((c for c in module.co_consts
                 if isinstance(c, types.CodeType) and c.co_name == function.__name__), None)
    if code is None or code.co_freevars != function.__code__.co_freevars:
        return None
    return code


def apply() -> dict[str, bool]:
    """Install each fix of :data:`FIXES` whose source matches (once); returns
    :data:`APPLIED`. Installs nothing where ``NUMVAR_NUMBA_FIXES`` is ``0``."""
    if os.environ.get("NUMVAR_NUMBA_FIXES", "1").strip() == "0":
        return APPLIED
    for fix in FIXES:
        if APPLIED[fix.name]:
            continue
        code = fixed_code(fix.function, fix.replacements)
        if code is not None:
            fix.function.__code__ = code
            APPLIED[fix.name] = True
    return APPLIED


def restore() -> None:
    """numba's own code back in every fixed function (the tests compare both)."""
    for fix in FIXES:
        fix.function.__code__ = ORIGINAL_CODE[fix.name]
        APPLIED[fix.name] = False


apply()
