"""User-code stacks: the frames of the caller's own code, for forward and backward ops.

An op run in backward has no user frame of its own; its stack is the *forward* call that
created the autograd node, as recorded by autograd's anomaly mode
(``node.metadata["traceback_"]``, a list of ``traceback.format_list`` strings).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import torch

__all__ = ["Frame", "user_stack", "op_stack", "format_frames", "frames_from_json"]


@dataclass(frozen=True)
class Frame:
    """One stack frame: file, line number, function and source line."""

    file: str
    line: int
    function: str
    code: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        s = f'  File "{self.file}", line {self.line}, in {self.function}'
        return s + (f"\n    {self.code}" if self.code else "")


def _norm(p: str) -> str:
    return os.path.normcase(os.path.realpath(p)) + os.sep


_TORCH_DIR = _norm(os.path.dirname(torch.__file__))
_NUMVAR_DIR = _norm(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STDLIB_DIRS = tuple({_norm(p) for k in ("stdlib", "platstdlib")
                      if (p := sysconfig.get_paths().get(k))})
# Test runners and CLI frameworks that sit between the interpreter and user code.
_RUNNER_MARKERS = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep,
                   os.sep + "typer" + os.sep, os.sep + "click" + os.sep)
_internal_cache: dict[str, bool] = {}


def _is_internal(filename: str) -> bool:
    hit = _internal_cache.get(filename)
    if hit is not None:
        return hit
    if filename.startswith("<"):  # <frozen runpy>, <string>, <stdin> ...
        res = filename.startswith("<frozen")
    else:
        p = _norm(filename)
        in_stdlib = any(p.startswith(d) for d in _STDLIB_DIRS) and not (
            "site-packages" in p or "dist-packages" in p)
        res = (p.startswith(_TORCH_DIR) or p.startswith(_NUMVAR_DIR) or in_stdlib
               or any(m in p for m in _RUNNER_MARKERS))
    _internal_cache[filename] = res
    return res


def _filter(frames: Iterable[Frame]) -> list[Frame]:
    return [f for f in frames if not _is_internal(f.file)]


def user_stack() -> list[Frame]:
    """The current call stack (outermost first), without torch, numvar, stdlib and
    test-runner frames. Walks the frames directly; source lines come from linecache."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        co = f.f_code
        fn = co.co_filename
        if not _is_internal(fn):
            line = f.f_lineno or 0
            out.append(Frame(fn, line, co.co_name, linecache.getline(fn, line).strip()))
        f = f.f_back
    out.reverse()
    return out


_FRAME_RE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<fn>[^\n]*)\n?(?P<code>.*)',
                       re.S)


def parse_formatted(lines: Sequence[str]) -> list[Frame]:
    """Parse ``traceback.format_list`` output (one string per frame) back into frames."""
    out = []
    for s in lines:
        for chunk in re.split(r"(?m)^(?=\s*File \")", s):
            m = _FRAME_RE.match(chunk)
            if m:
                code = m.group("code").strip().splitlines()
                out.append(Frame(m.group("file"), int(m.group("line")), m.group("fn").strip(),
                                 code[0].strip() if code else ""))
    return out


def current_autograd_node() -> Any:
    """The autograd node being executed in backward on this thread, or None."""
    try:
        return torch._C._current_autograd_node()
    except Exception:  # pragma: no cover - private API absent
        return None


def op_stack() -> tuple[list[Frame], str | None]:
    """The user stack responsible for the op now being dispatched.

    Returns ``(frames, node_name)``: in forward, the current user stack and None; in
    backward, the forward call's stack recorded by anomaly mode (or the current stack
    when none was recorded) and the autograd node's name, e.g. ``"ConvolutionBackward0"``.
    """
    node = current_autograd_node()
    if node is None:
        return user_stack(), None
    name = type(node).__name__
    if hasattr(node, "name"):
        try:
            name = node.name()
        except Exception:
            pass
    try:
        md = node.metadata
        frames = md.get("numvar_frames_")  # parsed once per node, kept with it
        if frames is None:
            tb = md.get("traceback_")
            frames = _filter(parse_formatted(tb)) if tb else []
            md["numvar_frames_"] = frames
    except Exception:
        frames = []
    if frames:
        return list(frames), name
    return user_stack(), name


def format_frames(frames: Sequence[Frame], limit: int | None = 8, indent: str = "") -> str:
    """Format frames innermost last, keeping the ``limit`` innermost ones."""
    frames = list(frames)
    if not frames:
        return indent + "  (no user frames)"
    shown = frames[-limit:] if limit else frames
    lines = []
    if len(shown) < len(frames):
        lines.append(f"{indent}  ... {len(frames) - len(shown)} outer frame(s)")
    for f in shown:
        lines.extend(indent + ln for ln in str(f).splitlines())
    return "\n".join(lines)


def frames_from_json(obj: Any) -> list[Frame]:
    """Frames from their JSON form (a list of dicts); tolerant of missing keys."""
    out = []
    for d in obj or []:
        out.append(Frame(str(d.get("file", "?")), int(d.get("line", 0)),
                         str(d.get("function", "?")), str(d.get("code", ""))))
    return out
