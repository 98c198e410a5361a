"""numvar._numba_compile: numba's IR copies in linear time, the same machine code.

Checked on kernels shaped like numvar's, compiled afresh (no cache) once with numba's
own code and once with the fixes, in this process: the number of IR variables
deep-copied (deterministic counts: the inliner copied blocks × variables, now variables)
or of copy-propagation snapshots deep-copied, and the assembly, equal once numba's
per-compile version number is taken out of the symbol names (and the ``.size`` lines,
whose string lengths follow from it).
"""

from __future__ import annotations

import copy
import re
import sys

import numpy as np
from numba import njit, prange
from numba.core import inline_closurecall, ir, ir_utils

import numvar.rounding.kernels  # noqa: F401  (applies the fixes, as every kernel module does)
from numvar import _numba_compile as F


@njit(inline="always")
def _step(x, r, mode):  # pragma: no cover - compiled
    if mode == 0:
        y = x * 2.0
    elif mode == 1:
        y = x + r
    else:
        y = x - r
    if y > 10.0:
        y = y * 0.5
    return y


@njit(inline="always")
def _loop(a, r, mode):  # pragma: no cover - compiled
    s = 0.0
    for i in range(a.size):
        s = _step(s + a[i], r, mode)
        if s < 0:
            s = -s
    return s


def _inlining(a, r, mode):  # pragma: no cover - compiled
    """One inlined copy of :func:`_loop` per mode, as numvar's kernels have."""
    if mode == 0:
        return _loop(a, r, 0)
    if mode == 1:
        return _loop(a, r, 1)
    return _loop(a, r, 2)


def _parallel(a, out, mode):  # pragma: no cover - compiled
    """A ``prange`` loop with copies for numba's parfor copy propagation."""
    for i in prange(a.shape[0]):
        row = a[i]
        acc = 0.0
        for j in range(row.size):
            v = row[j]
            w = v
            acc = _step(acc + w, 1.0, mode)
        out[i] = acc


def _python_loop(a, r, mode):
    """:func:`_loop` in Python (the same IEEE operations)."""
    s = 0.0
    for v in a:
        s = _step.py_func(s + v, r, mode)
        s = -s if s < 0 else s
    return s


def _compiled(monkeypatch, fixed: bool, function, parallel: bool, *args):
    """(objects counted while compiling, the assembly without numba's version numbers,
    the result) of ``function`` compiled afresh with numba's code or with the fixes: the
    IR variables deep-copied, and for a ``parallel`` kernel the copy-propagation
    snapshots deep-copied."""
    if fixed:
        F.apply()
    else:
        F.restore()
    counts = {"variables": 0, "snapshots": 0}
    var_copy = ir.Var.__deepcopy__

    def counted_var(self, memo):
        counts["variables"] += 1
        return var_copy(self, memo)

    deepcopy = copy.deepcopy

    def counted_deepcopy(x, memo=None, _nil=[]):  # noqa: B006 (copy.deepcopy's signature)
        if sys._getframe(1).f_code.co_name == "copy_propagate":
            counts["snapshots"] += 1
        return deepcopy(x, memo, _nil)

    monkeypatch.setattr(ir.Var, "__deepcopy__", counted_var)
    monkeypatch.setattr(ir_utils.copy, "deepcopy", counted_deepcopy)
    try:
        kernel = njit(cache=False, parallel=parallel)(function)
        result = kernel(*args)
    finally:
        monkeypatch.setattr(ir.Var, "__deepcopy__", var_copy)
        monkeypatch.setattr(ir_utils.copy, "deepcopy", deepcopy)
        F.apply()
    asm = kernel.inspect_asm(kernel.signatures[0])
    # numba's mangled names carry a version number per compile (``B2v7B``), a parallel
    # kernel's gufunc an address; ``.size`` lines give the length of strings that hold
    # such names (``v9`` to ``v10`` adds a character: seen in CI)
    asm = re.sub(r"0x[0-9a-f]+", "0x", re.sub(r"B\d+v\d+B", "BvB", asm))
    asm = "\n".join(line for line in asm.splitlines() if not line.startswith("\t.size\t"))
    return counts, asm, result


def test_every_fix_is_installed_under_the_installed_numba():
    missing = [name for name, applied in F.APPLIED.items() if not applied]
    assert not missing, (f"numba's {missing} no longer hold the lines numvar._numba_compile "
                         f"replaces: check whether numba fixed them (then drop the fix) or "
                         f"update FIXES")
    for fix in F.FIXES:
        assert fix.function.__code__ is not F.ORIGINAL_CODE[fix.name]


def test_inlined_copies_are_linear_and_compile_to_the_same_code(monkeypatch):
    a = np.arange(5.0)
    before, asm_before, result_before = _compiled(monkeypatch, False, _inlining, False,
                                                  a, 1.5, 1)
    after, asm_after, result_after = _compiled(monkeypatch, True, _inlining, False, a, 1.5, 1)
    # numba's copy: the Scope (every variable) once per block; the fix: once per IR copy.
    # Measured on numba 0.68.1: 7104 against 894 variables
    assert after["variables"] * 4 < before["variables"], (before, after)
    assert asm_after == asm_before
    assert result_after == result_before == _python_loop(a, 1.5, 1)


def test_copy_propagation_snapshots_and_the_same_code(monkeypatch):
    a = np.arange(12.0).reshape(3, 4) - 5.0
    out_before, out_after = np.empty(3), np.empty(3)
    before, asm_before, _ = _compiled(monkeypatch, False, _parallel, True, a, out_before, 1)
    after, asm_after, _ = _compiled(monkeypatch, True, _parallel, True, a, out_after, 1)
    assert before["snapshots"] > 0, before  # the kernel reaches copy propagation
    assert after["snapshots"] == 0, after
    assert asm_after == asm_before
    expected = [0.0] * 3
    for i in range(3):
        for v in a[i]:
            expected[i] = _step.py_func(expected[i] + v, 1.0, 1)
    assert out_after.tolist() == out_before.tolist() == expected


def test_the_switch_and_a_changed_numba_leave_numba_alone(monkeypatch):
    F.restore()
    try:
        monkeypatch.setenv("NUMVAR_NUMBA_FIXES", "0")
        assert not any(F.apply().values())
        assert all(fix.function.__code__ is F.ORIGINAL_CODE[fix.name] for fix in F.FIXES)
        monkeypatch.delenv("NUMVAR_NUMBA_FIXES")

        def changed(blocks, typemap):  # a numba whose function no longer has the lines
            return None

        for fix in F.FIXES:
            assert F.fixed_code(changed, fix.replacements) is None
        # a line found fewer times than the fix expects
        inline, propagate = F.FIXES
        assert F.fixed_code(propagate.function,
                            ((propagate.replacements[0][0], "pass", 1),)) is None
    finally:
        assert all(F.apply().values())
    assert inline_closurecall.InlineWorker.inline_ir.__code__ is not F.ORIGINAL_CODE[
        inline.name]


def _imports(path, module: str) -> set[str]:
    """The numvar modules ``module`` (at ``path``) imports, relative imports resolved."""
    import ast

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("numvar")}


def test_every_cached_kernel_module_applies_the_fixes_before_it_compiles():
    """Each module with cached numba kernels imports ``numvar.rounding.kernels`` (which
    imports ``numvar._numba_compile``), directly or through the modules it imports: read
    from the sources (an import in a fresh interpreter per module would take seconds)."""
    from pathlib import Path

    import numvar

    root = Path(numvar.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(("numvar",) + path.relative_to(root).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {name: _imports(path, name) & modules.keys() for name, path in modules.items()}
    assert "numvar._numba_compile" in graph["numvar.rounding.kernels"]
    kernels = [name for name, path in modules.items() if "cache=True" in path.read_text()]
    assert len(kernels) >= 15, kernels
    for name in kernels:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo += graph[current]
        assert "numvar.rounding.kernels" in seen or name == "numvar.rounding.kernels", name
