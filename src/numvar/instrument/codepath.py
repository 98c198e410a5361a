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

:class:`codepath` sets these for the duration of a ``with`` block and restores them after.
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


def _sdp_switches() -> tuple:
    """``(getter, setter)`` of every SDPA backend flag of this torch, math's first: the
    ``torch._C`` calls ``torch.nn.attention.sdpa_kernel`` makes
    (``_get_<name>_sdp_enabled`` / ``_set_sdp_use_<name>``; torch ≥ 2.4 has math, flash,
    mem_efficient and cudnn, later ones overrideable too)."""
    switches = []
    for name in ("math", "flash", "mem_efficient", "cudnn", "overrideable"):
        get = getattr(torch._C, f"_get_{name}_sdp_enabled", None)
        put = getattr(torch._C, f"_set_sdp_use_{name}", None)
        if get is not None and put is not None:
            switches.append((get, put))
    return tuple(switches)


_SDP = _sdp_switches()
_MHA = getattr(torch.backends, "mha", None)


class codepath:  # noqa: N801 - used as a function: ``with codepath(): ...``
    """SDPA on its math backend, the fused transformer fast path off, mkldnn and cudnn
    off; all restored on exit.

    A class rather than a generator: a fuzzy block enters it on every forward, and the
    switches set directly cost about 3 µs where ``contextlib`` and
    ``torch.nn.attention.sdpa_kernel`` cost 24 (``benchmarks/bench_block.py``). The
    SDPA flags are the ones ``sdpa_kernel(SDPBackend.MATH)`` sets (math on, every other
    backend off) and restores (each to its value at entry).
    """

    __slots__ = ("_saved",)

    def __enter__(self) -> None:
        sdp = tuple(get() for get, _ in _SDP)
        first = True
        for _, put in _SDP:
            put(first)  # math on, the others off
            first = False
        mha = None
        if _MHA is not None:
            mha = _MHA.get_fastpath_enabled()
            _MHA.set_fastpath_enabled(False)
        mkldnn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        cudnn = torch._C._get_cudnn_enabled()
        torch._C._set_cudnn_enabled(False)
        self._saved = (sdp, mha, mkldnn, cudnn)

    def __exit__(self, *exc) -> None:
        sdp, mha, mkldnn, cudnn = self._saved
        torch._C._set_cudnn_enabled(cudnn)
        torch._C._set_mkldnn_enabled(mkldnn)
        if _MHA is not None:
            _MHA.set_fastpath_enabled(mha)
        for (_, put), on in zip(_SDP, sdp):
            put(on)


try:
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_callback
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
except ImportError:  # pragma: no cover - a torch without them: PyTorch's wrapper stays
    set_code_exec_strategy = None

    def _dynamo_callback():
        return None


def dynamo_running() -> bool:
    """Whether dynamo's frame evaluation is on in this thread (a ``torch.compile``d
    function is running). See :func:`guards_itself`."""
    return _dynamo_callback() is not None


def guards_itself(cls):
    """Class decorator of numvar's dispatch modes: ``__torch_dispatch__`` without the
    wrapper PyTorch puts around it, guarding itself instead.

    PyTorch wraps every mode's ``__torch_dispatch__`` in ``torch._disable_dynamo`` so
    that dynamo never traces the mode's own code: two Python frames and three
    ``set_eval_frame`` calls per op, about 1.1 µs (an add of 64 elements through a
    do-nothing mode: 7.1 against 6.1 µs, ``benchmarks/bench_block.py``). A mode so
    decorated starts its ``__torch_dispatch__`` with ``if dynamo_running(): return
    self._guarded(...)``, where
    ``_guarded`` is the method wrapped as PyTorch wraps it, and the method's own frame is
    marked for dynamo to skip (what ``torch._dynamo.eval_frame.skip_code`` does): inside
    a ``torch.compile``d function every op takes PyTorch's path, elsewhere none pays for
    it. On a torch without those calls the mode keeps PyTorch's wrapper."""
    wrapped = cls.__dict__["__torch_dispatch__"]  # (PyTorch's wrapper, or the method)
    raw = getattr(wrapped, "__wrapped__", wrapped)
    cls._guarded = wrapped  # where PyTorch's wrapper stays (then it is never called)
    code = getattr(raw, "__code__", None)
    if set_code_exec_strategy is None or code is None or code.co_name != "__torch_dispatch__":
        return cls
    try:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    except Exception:  # pragma: no cover - another torch's signature: the wrapper stays
        return cls
    cls._guarded = torch._disable_dynamo(raw, recursive=True)
    cls.__torch_dispatch__ = raw
    return cls


@guards_itself
class IdentityMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the floor of any tool that sees every op,
    and the reference's stand-in for :class:`~numvar.instrument.FuzzyMode`.

    Use it inside :func:`codepath` to measure what numvar pays before doing any work. It
    meets dynamo as :class:`~numvar.instrument.FuzzyMode` does (:func:`guards_itself`).
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _dynamo_callback() is not None:  # dynamo_running()
            return self._guarded(func, types, args, kwargs)
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


__all__ = ["codepath", "IdentityMode", "reference_path", "AVOIDED_OPS", "dynamo_running",
           "guards_itself"]
