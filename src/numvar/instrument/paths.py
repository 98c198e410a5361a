"""The code path of an instrumented block, shared by its IEEE reference.

PyTorch picks different kernels depending on global switches, and some of those
kernels cannot be instrumented (they have no decomposition, or fail in float64). Inside
a fuzzy block numvar turns them off so that the model runs through composite code whose
every aten op reaches the mode:

* ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``: scaled dot-product attention by
  its math path (``bmm``, softmax), whose backward is consistent with its forward;
* ``torch.backends.mha.set_fastpath_enabled(False)``: ``nn.TransformerEncoderLayer`` /
  ``nn.MultiheadAttention`` without their fused inference kernels and without nested
  tensors (the fast path writes 0 at padded positions; the composite path computes them);
* ``torch._C._set_mkldnn_enabled(False)``: ``nn.LSTM``/``GRU``/``RNN`` by their cell
  arithmetic (``addmm``, gates) instead of ``mkldnn_rnn_layer``, which has no float64
  kernel, and so forward and backward at flop granularity;
* ``torch.backends.cudnn.enabled = False``: the same on CUDA (``_cudnn_rnn``), and batch
  norm as ``native_batch_norm``.

:func:`fast_paths_off` does exactly this; :class:`numvar.instrument.Fuzzy` enters it,
and :func:`reference_path` enters it with a pass-through dispatch mode, so that the IEEE
reference of ``numvar.sample`` / ``numvar run`` follows the realizations' code path (a
dispatch mode on the stack also changes which paths PyTorch takes, e.g. it keeps
``torch.compile`` eager). An ``ieee`` realization then matches the reference up to the
summation order of numvar's kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


#: fused kernels that :func:`fast_paths_off` keeps from running, and the switch
AVOIDED_OPS: dict[str, str] = {
    "aten._scaled_dot_product_flash_attention_for_cpu": "SDPA forced to its math path",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": "SDPA forced to its math path",
    "aten._native_multi_head_attention": "torch.backends.mha fast path off",
    "aten._transformer_encoder_layer_fwd": "torch.backends.mha fast path off",
    "aten._nested_tensor_from_mask": "torch.backends.mha fast path off (no nested tensors)",
    "aten.mkldnn_rnn_layer": "mkldnn off: LSTM by its cell arithmetic",
    "aten.mkldnn_rnn_layer_backward": "mkldnn off: LSTM by its cell arithmetic",
    "aten._cudnn_rnn": "cudnn off: LSTM/GRU by their cell arithmetic",
    "aten._cudnn_rnn_backward": "cudnn off: LSTM/GRU by their cell arithmetic",
}


@contextlib.contextmanager
def fast_paths_off() -> Iterator[None]:
    """SDPA math path, no MHA/Transformer fast path, no mkldnn, no cudnn (restored on exit)."""
    with contextlib.ExitStack() as stack:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        except ImportError:  # pragma: no cover - torch < 2.3
            pass
        mha = getattr(torch.backends, "mha", None)
        if mha is not None:
            was = mha.get_fastpath_enabled()
            mha.set_fastpath_enabled(False)
            stack.callback(mha.set_fastpath_enabled, was)
        mkldnn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        stack.callback(torch._C._set_mkldnn_enabled, mkldnn)
        cudnn = torch.backends.cudnn.enabled
        torch.backends.cudnn.enabled = False
        stack.callback(setattr, torch.backends.cudnn, "enabled", cudnn)
        yield


class PassthroughMode(TorchDispatchMode):
    """A dispatch mode that runs every op as it is (the reference's stand-in for
    :class:`~numvar.instrument.FuzzyMode`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Run the block natively along the code path of a fuzzy block.

    ``with numvar.instrument.reference_path(): y = model(x)`` computes the IEEE
    reference that numvar's realizations are compared against: the same switches as
    :func:`numvar.fuzzy` (see :mod:`numvar.instrument.paths`) and a dispatch mode that
    passes every op through unchanged.
    """
    with fast_paths_off(), PassthroughMode():
        yield


__all__ = ["fast_paths_off", "reference_path", "PassthroughMode", "AVOIDED_OPS"]
