"""The code path numvar runs a model on, shared by the mode, references and benchmarks.

PyTorch picks different kernels depending on global switches, and some of those kernels
cannot be instrumented (no decomposition, or no float64 kernel for the re-run). Inside a
fuzzy block numvar turns them off so that the model runs through code whose every aten
op reaches the mode:

- scaled dot-product attention on its math backend (``bmm``, ``_safe_softmax``, ``mul``):
  the CPU flash kernel has no decomposition, and decomposing its forward while autograd
  records the fused backward gives wrong gradients;
- the fused inference fast path of ``nn.TransformerEncoderLayer`` / ``MultiheadAttention``
  (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``, nested tensors
  that write 0 at padded positions) off;
- mkldnn off (``torch._C._set_mkldnn_enabled(False)``): ``nn.LSTM``/``GRU``/``RNN`` run
  their cell arithmetic (``addmm``, gates) instead of ``mkldnn_rnn_layer``, which has no
  float64 kernel, so forward and backward are perturbed at flop granularity (a fuzzy
  block then runs the cells' steps in compiled calls: numvar.instrument.rnn_kernels);
- cudnn off (``torch.backends.cudnn.enabled = False``): the same on CUDA (``_cudnn_rnn``).

:func:`codepath` sets these for the duration of a ``with`` block and restores them after.
:class:`numvar.instrument.Fuzzy` enters it; :func:`reference_path` enters it with
:class:`IdentityMode` (a dispatch mode on the stack also changes which paths PyTorch
takes, e.g. it keeps ``torch.compile`` eager), so that the IEEE reference of
``numvar.sample`` / ``numvar run`` follows the realizations' code path and an ``ieee``
realization matches it up to the summation order of numvar's kernels. Benchmarks use the
same pair as the floor of any tool that sees every op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: fused kernels that :func:`codepath` keeps from running, and the switch that does it
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
def codepath() -> Iterator[None]:
    """SDPA on its math backend, the fused transformer fast path off, mkldnn and cudnn
    off; all restored on exit."""
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
        mkldnn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        stack.callback(torch._C._set_mkldnn_enabled, mkldnn)
        cudnn = torch.backends.cudnn.enabled
        torch.backends.cudnn.enabled = False
        stack.callback(setattr, torch.backends.cudnn, "enabled", cudnn)
        yield


class IdentityMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the floor of any tool that sees every op,
    and the reference's stand-in for :class:`~numvar.instrument.FuzzyMode`.

    Use it inside :func:`codepath` to measure what numvar pays before doing any work.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Run the block natively along the code path of a fuzzy block.

    ``with numvar.instrument.reference_path(): y = model(x)`` computes the IEEE
    reference that numvar's realizations are compared against: :func:`codepath` and a
    dispatch mode that passes every op through unchanged (:class:`IdentityMode`).
    """
    with codepath(), IdentityMode():
        yield


__all__ = ["codepath", "IdentityMode", "reference_path", "AVOIDED_OPS"]
