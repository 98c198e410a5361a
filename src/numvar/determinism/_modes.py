"""Remove a dispatch mode from the middle of the mode stack.

``TorchDispatchMode.__exit__`` pops the *top* mode; a mode entered by a function call
(``enable_hash_mode()``) may have others above it by the time it is disabled. We pop
the ones above, pop ours, push the others back, and repair the "is a mode active"
flags each mode saved on entry so that their own exits restore the right values.
"""

from __future__ import annotations

from typing import Any

import torch.utils._python_dispatch as pd

__all__ = ["remove_mode"]


def _flags(below: list[Any]) -> tuple[bool, bool, bool]:
    def f(m: Any, name: str, default: bool) -> bool:
        try:
            return bool(getattr(m, name)())
        except Exception:
            return default

    return (bool(below), any(not f(m, "is_infra_mode", False) for m in below),
            any(not f(m, "ignore_compile_internals", False) for m in below))


def remove_mode(mode: Any) -> bool:
    """Take ``mode`` off the dispatch mode stack wherever it sits. False when absent."""
    stack = pd._get_current_dispatch_mode_stack()
    if not any(m is mode for m in stack):
        return False
    if stack[-1] is mode:
        mode.__exit__(None, None, None)
        return True
    above: list[Any] = []
    while True:
        top = pd._pop_mode()
        if top is mode:
            break
        above.append(top)
    above.reverse()  # bottom to top
    for m in above:
        pd._push_mode(m)
    # Our own saved flags are obsolete; the modes above saved flags computed with us below.
    for lst in ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
                "old_without_ignore_compile_internals_dispatch_mode_flags"):
        saved = getattr(mode, lst, None)
        if saved:
            saved.pop()
    new_stack = pd._get_current_dispatch_mode_stack()
    for i, m in enumerate(new_stack):
        if any(m is a for a in above):
            f = _flags(list(new_stack[:i]))
            for lst, v in zip(("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
                               "old_without_ignore_compile_internals_dispatch_mode_flags"), f):
                saved = getattr(m, lst, None)
                if saved:
                    saved[-1] = v
    active, non_infra, no_ignore = _flags(list(new_stack))
    pd._is_in_torch_dispatch_mode = active
    pd._is_in_non_infra_torch_dispatch_mode = non_infra
    pd._is_in_any_mode_without_ignore_compile_internals = no_ignore
    try:
        pd.set_is_in_mode_without_ignore_compile_internals(no_ignore)
    except Exception:
        pass
    return True


def quiet_below() -> Any:
    """Inside ``__torch_dispatch__``: a context hiding our own bookkeeping ops (hashing,
    cloning, comparing) from the modes below us, at no cost when there are none."""
    import contextlib

    if pd._get_current_dispatch_mode_stack():
        return pd._disable_current_modes()
    return contextlib.nullcontext()
