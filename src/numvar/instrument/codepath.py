"""The code path numvar runs a model on, shared by the mode, references and benchmarks.

Inside a fuzzy block PyTorch must take the paths whose every op reaches a dispatch mode:

- scaled dot-product attention on its math backend (``bmm``, ``_safe_softmax``, ``mul``):
  the CPU flash kernel has no decomposition, and decomposing its forward while autograd
  records the fused backward gives wrong gradients;
- the fused inference fast path of ``nn.TransformerEncoderLayer`` / ``MultiheadAttention``
  (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``, nested tensors
  that write 0 at padded positions) off.

:func:`codepath` sets both for the duration of a ``with`` block and restores them after.
:class:`numvar.instrument.Fuzzy` enters it; so should anything that wants to compare with
a realization on the same path (an IEEE reference, the dispatch-mode floor of a
benchmark: :class:`IdentityMode` inside :func:`codepath`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@contextlib.contextmanager
def codepath() -> Iterator[None]:
    """SDPA on its math backend and the fused transformer fast path off, restored on exit."""
    with contextlib.ExitStack() as stack:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # torch < 2.3
            pass
        else:
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        mha = getattr(torch.backends, "mha", None)
        if mha is not None:
            old = mha.get_fastpath_enabled()
            mha.set_fastpath_enabled(False)
            stack.callback(mha.set_fastpath_enabled, old)
        yield


class IdentityMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the floor of any tool that sees every op.

    Use it inside :func:`codepath` to measure what numvar pays before doing any work.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
