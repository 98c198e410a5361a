"""Save and restore every random generator an op may draw from: the CPU default
generator, the default generator of every initialised CUDA device, and any
``torch.Generator`` passed to the op explicitly."""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["RngSnapshot"]


def _mentions_cuda(args: Iterable[Any]) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                return True
        elif isinstance(a, torch.device):
            if a.type == "cuda":
                return True
        elif isinstance(a, str) and a.startswith("cuda"):
            return True
    return False


def _cuda_generators(args: list[Any]) -> list[torch.Generator]:
    if not torch.cuda.is_available():
        return []
    if not torch.cuda.is_initialized():
        # An op about to create CUDA tensors initialises CUDA (and its generators) itself;
        # do it first so their states can be saved before the first run.
        if not _mentions_cuda(args):
            return []
        torch.cuda.init()
    try:
        if torch.cuda.is_current_stream_capturing():
            return []  # states cannot be read during graph capture
    except Exception:
        pass
    return list(torch.cuda.default_generators)


class RngSnapshot:
    """The states of a set of generators at one moment; ``restore()`` puts them back."""

    __slots__ = ("_states",)

    def __init__(self, generators: Iterable[torch.Generator]) -> None:
        self._states = [(g, g.get_state()) for g in generators]

    @staticmethod
    def generators(args: Iterable[Any] = ()) -> list[torch.Generator]:
        """The CPU default generator, the CUDA default generators (when CUDA is in use)
        and every generator among ``args``."""
        args = list(args)
        gens = [torch.default_generator, *_cuda_generators(args)]
        for a in args:
            if isinstance(a, torch.Generator) and all(a is not g for g in gens):
                gens.append(a)
        return gens

    def restore(self) -> None:
        for g, s in self._states:
            g.set_state(s)

    def equals(self, other: "RngSnapshot") -> bool:
        return len(self._states) == len(other._states) and all(
            g1 is g2 and torch.equal(s1, s2)
            for (g1, s1), (g2, s2) in zip(self._states, other._states))
