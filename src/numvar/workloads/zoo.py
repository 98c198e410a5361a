"""The model zoo: numvar's proof that no floating-point op of a real model escapes.

Each entry of :data:`ZOO` builds, in code and offline, a small model with example inputs
and the loss of a training step, at a ``"test"`` size (tiny: the zoo tests) or a
``"bench"`` size (``benchmarks/bench_zoo.py``), with fixed seeds: the same call builds
the same weights and inputs bit for bit.

The checks the tests assert and the table reports (one place, so they cannot drift):

- :func:`escapes`: the ops of a fuzzy report that were not perturbed at the granularity
  asked (run natively, or rounded once at flop granularity for want of a flop handler);
- :func:`probe`: the coverage probe, every module run on its own recorded inputs at
  ``precision=8`` must move its output by at least :data:`PROBE_TAU`;
- :func:`ieee_check`: ``mode="ieee"`` at flop granularity against native, within a
  tolerance derived for summation order;
- :func:`run`: one forward (``no_grad`` / ``inference_mode``) or one training step
  (SGD / fused AdamW) of an entry, returning every result as a dict of tensors.

``python -m numvar.workloads.zoo --table`` prints the table "model, ops escaping
(names and counts), ieee error, probe result" over every entry and regime.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import zoo_models as M

SIZES = ("test", "bench")
REGIMES = ("no_grad", "inference_mode", "sgd", "adamw_fused")
FORWARD_REGIMES = ("no_grad", "inference_mode")

#: unit roundoff 2^-(p) of round-to-nearest, per dtype (p significand bits incl. the hidden one)
UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24,
                 torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}

#: virtual precision of the coverage probe (bits) for binary32 and binary64 models
PROBE_PRECISION = 8
#: Coverage probe threshold on the relative change of a module output at precision 8.
#:
#: Derivation. At virtual precision p = 8 every rounded result lies on the 8-bit grid.
#: Let y be a module's native (24-bit) output element and ulp its 8-bit ulp; |y| lies in
#: [2^e, 2^(e+1)) and ulp = 2^(e-7), so ulp/|y| > 2^-8. The last rounding that produces y
#: under SR sends the exact value at fractional position t ∈ [0, 1) of its ulp interval
#: down (distance t·ulp, probability 1 - t) or up (distance (1 - t)·ulp, probability t).
#: For t uniform, P(distance < ε·ulp) = ∫_0^ε (1-t)dt + ∫_{1-ε}^1 t dt = 2ε - ε². With
#: τ = 2^-8 / 8, |ŷ - y|/|y| < τ needs distance < ulp/8, probability ≤ 2/8 - 1/64 =
#: 0.234 per element (earlier roundings only add spread). Only elements that native
#: rounded count (those that differ from a float64 computation): their exact value is
#: off the 24-bit grid, hence off the 8-bit one, so the last rounding does move them.
#: The median over n ≥ 16 such elements falls below τ only if ≥ n/2 elements do:
#: binomial tail P(X ≥ 8 | n=16, p=0.234) ≈ 0.018, 9e-4 at n=32, 3e-6 at n=64; with
#: fewer elements the probe takes the maximum, below τ with probability ≤ 0.234^n
#: (< 0.003 for n ≥ 4). An unperturbed
#: module (native, or fast path) moves by 0: it fails by a factor ∞. Seeds are fixed,
#: so a pass or fail is reproducible. For a format with fewer bits the probe runs at
#: :func:`probe_precision` (bfloat16: 4) and τ = 2^-precision / 8, by the same argument.
PROBE_TAU = 2.0 ** -8 / 8
PROBE_MEDIAN_MIN = 16


# --------------------------------------------------------------------------- entries
@dataclass
class Built:
    """One built entry: ``model(*inputs)`` returns a tensor; ``loss(out)`` a scalar."""

    name: str
    model: nn.Module
    inputs: tuple
    loss: Callable[[torch.Tensor], torch.Tensor]

    @property
    def dtype(self) -> torch.dtype:
        return next(t.dtype for t in self.model.parameters())

    def to(self, dtype: torch.dtype) -> Built:
        """A copy with parameters, buffers and float inputs in ``dtype``."""
        model = copy.deepcopy(self.model).to(dtype)
        inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                       else x for x in self.inputs)
        return Built(self.name, model, inputs, self.loss)


@dataclass(frozen=True)
class Entry:
    """A zoo entry: ``build(size)`` returns a :class:`Built` (seeded, deterministic)."""

    name: str
    covers: str
    build: Callable[[str], Built]
    needs: str = "torch"  # "transformers" for the Hugging Face entries


def _pick(size: str, test, bench):
    if size not in SIZES:
        from ..errors import ConfigError

        raise ConfigError(f"size must be one of {SIZES}, got {size!r}")
    return test if size == "test" else bench


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(n, c, hw, seed=1):
    return torch.randn(n, c, hw, hw, generator=_gen(seed))


def _classes_loss(classes: int, n: int):
    target = torch.arange(n) % classes

    def loss(out):
        return F.cross_entropy(out.float(), target)
    return loss


def _square_loss(out):
    return out.float().square().mean()


def _cnn(name, make, size, hw_test, hw_bench):
    torch.manual_seed(0)
    model = make(size)
    hw = _pick(size, hw_test, hw_bench)
    return Built(name, model, (_images(2, 3, hw),), _classes_loss(10, 2))


def _resnet_basic(size):
    return _cnn("resnet_basic", lambda s: M.ResNet(
        M.BasicBlock, *_pick(s, ((1, 1), (8, 16)), ((2, 2, 2, 2), (64, 128, 256, 512))),
        stem=_pick(s, (3, 1, False), (7, 2, True))), size, 16, 64)


def _resnet_bottleneck(size):
    return _cnn("resnet_bottleneck", lambda s: M.ResNet(
        M.Bottleneck, *_pick(s, ((1, 1), (4, 8)), ((1, 2, 2, 1), (16, 32, 64, 128))),
        stem=_pick(s, (3, 1, False), (7, 2, True))), size, 16, 64)


def _mobilenet(size):
    blocks = _pick(size, [(8, 8, 3, 1), (16, 12, 3, 2)],
                   [(16, 16, 3, 2), (72, 24, 3, 2), (88, 24, 3, 1), (96, 40, 5, 2),
                    (240, 40, 5, 1), (120, 48, 5, 1), (288, 96, 5, 2), (576, 96, 5, 1)])
    return _cnn("mobilenet_se", lambda s: M.MobileNet(
        _pick(s, 8, 16), blocks, _pick(s, 16, 576), nn.Hardswish, nn.Hardsigmoid, nn.ReLU),
        size, 16, 64)


def _efficientnet(size):
    blocks = _pick(size, [(8, 8, 3, 1), (32, 12, 5, 2)],
                   [(32, 16, 3, 1), (96, 24, 3, 2), (144, 24, 3, 1), (144, 40, 5, 2),
                    (240, 80, 3, 2), (480, 112, 5, 1), (672, 192, 5, 2)])
    return _cnn("efficientnet_mbconv", lambda s: M.MobileNet(
        _pick(s, 8, 32), blocks, _pick(s, 16, 320), nn.SiLU, nn.Sigmoid, nn.SiLU),
        size, 16, 64)


def _densenet(size):
    return _cnn("densenet", lambda s: M.DenseNet(
        *_pick(s, (8, 4, (2, 2)), (32, 16, (4, 4, 4)))), size, 8, 32)


def _unet(size):
    torch.manual_seed(0)
    hw, w = _pick(size, (16, 4), (64, 16))
    model = M.UNet(1, w)
    target = torch.randint(0, 3, (2, hw, hw), generator=_gen(2))
    return Built("unet", model, (_images(2, 1, hw),),
                 lambda out: F.cross_entropy(out.float(), target))


def _vit(size):
    torch.manual_seed(0)
    image, patch, d, heads, layers = _pick(size, (16, 4, 16, 2, 1), (32, 4, 64, 4, 2))
    return Built("vit", M.ViT(image, patch, d, heads, layers), (_images(2, 3, image),),
                 _classes_loss(10, 2))


def _recurrent(cell):
    def build(size):
        torch.manual_seed(0)
        feats, hidden, layers, seq = _pick(size, (4, 8, 2, 5), (16, 64, 2, 20))
        x = torch.randn(2, seq, feats, generator=_gen())
        return Built(cell.lower(), M.Recurrent(cell, feats, hidden, layers), (x,), _square_loss)
    return build


def _padded_tokens(vocab: int, batch: int, seq: int, pad: int):
    """Token ids (batch, seq) and a padding mask: the last sequence ends ``pad`` early."""
    tokens = torch.randint(1, vocab, (batch, seq), generator=_gen())
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[-1, seq - pad:] = True
    return tokens, mask


def _encoder(size):
    torch.manual_seed(0)
    vocab, d, heads, layers, seq = _pick(size, (32, 16, 2, 1, 6), (100, 64, 4, 2, 32))
    tokens, pad = _padded_tokens(vocab, 2, seq, seq // 3)
    return Built("transformer_encoder", M.Encoder(vocab, d, heads, layers), (tokens, pad),
                 _square_loss)


def _mha(size):
    torch.manual_seed(0)
    d, heads, seq = _pick(size, (16, 2, 6), (64, 4, 32))
    x = torch.randn(2, seq, d, generator=_gen())
    _, pad = _padded_tokens(2, 2, seq, seq // 3)
    return Built("multihead_attention", M.SelfAttention(d, heads), (x, pad), _square_loss)


def _bags(size):
    torch.manual_seed(0)
    vocab, d, bags, per = _pick(size, (12, 8, 4, 4), (1000, 64, 64, 16))
    idx = torch.randint(0, vocab // 2, (bags * per,), generator=_gen())  # repeats
    offsets = torch.arange(0, bags * per, per)
    weights = torch.rand(bags * per, generator=_gen(2))
    return Built("embedding_bag", M.Bags(vocab, d), (idx, offsets, weights), _square_loss)


def _fft(size):
    torch.manual_seed(0)
    channels, length = _pick(size, (4, 16), (16, 256))
    x = torch.randn(2, 1, length, generator=_gen())
    return Built("fft_filter", M.FFTNet(channels, length), (x,), _square_loss)


def _stn(size):
    torch.manual_seed(0)
    hw, w = _pick(size, (8, 4), (32, 16))
    return Built("spatial_transformer", M.SpatialTransformer(3, w), (_images(2, 3, hw),),
                 _classes_loss(10, 2))


def _solve(size):
    torch.manual_seed(0)
    n, batch = _pick(size, (6, 4), (64, 64))
    return Built("linear_solve", M.Solve(n), (torch.randn(batch, n, generator=_gen()),),
                 _square_loss)


def _norms(size):
    torch.manual_seed(0)
    c, hw = _pick(size, (4, 4), (16, 16))
    return Built("norms", M.Norms(c, hw), (_images(2, 3, hw),), _square_loss)


def _sine(name, dtype):
    """The sine-wave MLP in ``dtype`` (float64: the scientific-code model; float32: its
    twin, the same architecture, weights and inputs, for the binary64/binary32 ratio)."""
    def build(size):
        torch.manual_seed(0)
        window, hidden, batch = _pick(size, (8, 16, 8), (32, 128, 256))
        t = torch.arange(batch, dtype=torch.float64).unsqueeze(1) * 0.1 + torch.arange(
            window, dtype=torch.float64) * 0.1
        model = M.SineMLP(window, hidden).to(dtype)
        target = torch.sin(t[:, -1:] + 0.1).to(dtype)
        return Built(name, model, (torch.sin(t).to(dtype),),
                     lambda out: (out - target).square().mean())

    return build


# ----------------------------------------------------------------- transformers (tiny)
def _hf(name, make_config, make_model, make_inputs):
    """A ``transformers`` entry: random weights from a tiny config, nothing downloaded."""
    def build(size):
        torch.manual_seed(0)
        config = make_config(size)
        for k in ("dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
                  "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout_rate", "attention_dropout",
                  "activation_dropout", "hidden_dropout", "feat_proj_dropout", "final_dropout",
                  "layerdrop", "encoder_layerdrop", "decoder_layerdrop"):
            if hasattr(config, k):
                setattr(config, k, 0.0)
        config.use_cache = False
        model = make_model(config).eval()
        keys, inputs = make_inputs(size, config)
        return Built(name, M.HFModel(model, keys), inputs, _square_loss)
    return build


def _bert_config(size):
    from transformers import BertConfig

    h, layers, heads, seq = _pick(size, (16, 1, 2, 8), (128, 2, 2, 64))
    return BertConfig(vocab_size=64 if size == "test" else 1000, hidden_size=h,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=4 * h, max_position_embeddings=seq)


def _mask_inputs(size, config, seq):
    tokens, pad = _padded_tokens(config.vocab_size, 2, seq, seq // 4)
    return ("input_ids", "attention_mask"), (tokens, (~pad).long())


def _bert(size):
    from transformers import BertModel

    return _hf("bert", _bert_config, lambda c: BertModel(c, add_pooling_layer=False),
               lambda s, c: _mask_inputs(s, c, c.max_position_embeddings))(size)


def _gpt2(size):
    from transformers import GPT2Config, GPT2Model

    def config(s):
        h, layers, heads, seq = _pick(s, (16, 1, 2, 8), (128, 2, 2, 64))
        return GPT2Config(vocab_size=64 if s == "test" else 1000, n_positions=seq, n_embd=h,
                          n_layer=layers, n_head=heads, bos_token_id=1, eos_token_id=2)
    return _hf("gpt2", config, GPT2Model,
               lambda s, c: _mask_inputs(s, c, c.n_positions))(size)


def _t5(size):
    from transformers import T5Config, T5Model

    def config(s):
        d, layers, heads, _ = _pick(s, (16, 1, 2, 8), (64, 2, 4, 32))
        return T5Config(vocab_size=64 if s == "test" else 1000, d_model=d, d_kv=d // heads,
                        d_ff=2 * d, num_layers=layers, num_decoder_layers=layers,
                        num_heads=heads, relative_attention_num_buckets=8,
                        relative_attention_max_distance=16)

    def inputs(s, c):
        seq = _pick(s, 8, 32)
        tokens, pad = _padded_tokens(c.vocab_size, 2, seq, seq // 4)
        dec = torch.randint(1, c.vocab_size, (2, seq // 2), generator=_gen(3))
        return ("input_ids", "attention_mask", "decoder_input_ids"), (tokens, (~pad).long(), dec)
    return _hf("t5", config, T5Model, inputs)(size)


def _whisper(size):
    from transformers import WhisperConfig, WhisperModel

    def config(s):
        d, layers, heads, mels, src = _pick(s, (16, 1, 2, 8, 8), (64, 2, 4, 80, 64))
        return WhisperConfig(vocab_size=64 if s == "test" else 1000, num_mel_bins=mels,
                             d_model=d, encoder_layers=layers, decoder_layers=layers,
                             encoder_attention_heads=heads, decoder_attention_heads=heads,
                             encoder_ffn_dim=2 * d, decoder_ffn_dim=2 * d,
                             max_source_positions=src, max_target_positions=16,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             decoder_start_token_id=1)

    def inputs(s, c):
        feats = torch.randn(2, c.num_mel_bins, 2 * c.max_source_positions, generator=_gen())
        dec = torch.randint(3, c.vocab_size, (2, _pick(s, 4, 16)), generator=_gen(3))
        return ("input_features", "decoder_input_ids"), (feats, dec)
    return _hf("whisper", config, WhisperModel, inputs)(size)


def _wavlm(size):
    from transformers import WavLMConfig, WavLMModel

    def config(s):
        d, layers, heads, conv = _pick(s, (16, 1, 2, (8, 8)), (64, 2, 4, (32, 32, 32, 32)))
        kernel, stride = _pick(s, ((8, 3), (4, 2)), ((10, 3, 3, 3), (5, 2, 2, 2)))
        return WavLMConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=2 * d, conv_dim=list(conv), conv_kernel=list(kernel),
                           conv_stride=list(stride), num_feat_extract_layers=len(conv),
                           num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
                           num_buckets=8, max_bucket_distance=16, apply_spec_augment=False,
                           mask_time_prob=0.0, feat_extract_norm="group",
                           do_stable_layer_norm=False)

    def inputs(s, c):
        return ("input_values",), (torch.randn(2, _pick(s, 96, 4000), generator=_gen()),)
    return _hf("wavlm", config, WavLMModel, inputs)(size)


def _lowp(name, base, dtype=torch.bfloat16):
    """Entry ``base`` with its model and float inputs in ``dtype`` (bfloat16, float16)."""
    def build(size):
        b = base(size).to(dtype)
        b.name = name
        return b
    return build


_ENTRIES = [
    Entry("resnet_basic", "basic residual blocks, batch norm, max/avg pooling", _resnet_basic),
    Entry("resnet_bottleneck", "bottleneck residual blocks (1×1-3×3-1×1), batch norm",
          _resnet_bottleneck),
    Entry("mobilenet_se", "depthwise-separable convs, squeeze-excitation, hardswish",
          _mobilenet),
    Entry("efficientnet_mbconv", "MBConv blocks, squeeze-excitation, SiLU/sigmoid",
          _efficientnet),
    Entry("densenet", "dense block (concatenation), transition with avg pooling", _densenet),
    Entry("unet", "U-Net, ConvTranspose2d, bilinear upsampling, per-pixel cross entropy",
          _unet),
    Entry("vit", "patch embedding, class token, pre-norm blocks, SDPA, GELU", _vit),
    Entry("lstm", "nn.LSTM, 2 layers", _recurrent("LSTM")),
    Entry("gru", "nn.GRU, 2 layers", _recurrent("GRU")),
    Entry("transformer_encoder", "nn.TransformerEncoder with a key padding mask", _encoder),
    Entry("multihead_attention", "nn.MultiheadAttention with a key padding mask, weights",
          _mha),
    Entry("embedding_bag", "nn.EmbeddingBag mean and weighted sum, a gather x[idx]; repeated "
          "indices", _bags),
    Entry("fft_filter", "rfft, complex multiply (polar), irfft", _fft),
    Entry("spatial_transformer", "affine_grid, bilinear grid_sample", _stn),
    Entry("linear_solve", "torch.linalg.solve on a learned SPD matrix", _solve),
    Entry("norms", "batch/group/instance/layer/RMS norm, cumsum", _norms),
    Entry("sine_mlp_f64", "float64 tanh MLP (LBFGS-style sine-wave predictor)",
          _sine("sine_mlp_f64", torch.float64)),
    Entry("sine_mlp", "sine_mlp_f64 in float32 (its twin: the binary64 cost ratio)",
          _sine("sine_mlp", torch.float32)),
    Entry("bert", "transformers BertModel, attention mask", _bert, "transformers"),
    Entry("gpt2", "transformers GPT2Model, causal + padding mask", _gpt2, "transformers"),
    Entry("t5", "transformers T5Model, relative position bias, RMS norm", _t5, "transformers"),
    Entry("whisper", "transformers WhisperModel, conv front end, encoder-decoder", _whisper,
          "transformers"),
    Entry("wavlm", "transformers WavLMModel, conv feature encoder, group norm, weight norm",
          _wavlm, "transformers"),
    Entry("resnet_basic_bf16", "resnet_basic in bfloat16", _lowp("resnet_basic_bf16",
                                                                   _resnet_basic)),
    Entry("bert_bf16", "bert in bfloat16", _lowp("bert_bf16", _bert), "transformers"),
    Entry("resnet_basic_fp16", "resnet_basic in float16", _lowp("resnet_basic_fp16",
                                                                  _resnet_basic, torch.float16)),
]
#: name -> :class:`Entry`, in the order of the table
ZOO: dict[str, Entry] = {e.name: e for e in _ENTRIES}


def build(name: str, size: str = "test") -> Built:
    """Build zoo entry ``name`` at ``size`` ("test" or "bench"); seeded, deterministic."""
    try:
        entry = ZOO[name]
    except KeyError:
        from ..errors import ConfigError

        raise ConfigError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}") from None
    return entry.build(size)


# ------------------------------------------------------------------------------- runs
def _grad_context(regime: str):
    if regime == "inference_mode":
        return torch.inference_mode()
    if regime == "no_grad":
        return torch.no_grad()
    return contextlib.nullcontext()


def _optimizer(regime: str, params):
    if regime == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if regime == "adamw_fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    from ..errors import ConfigError

    raise ConfigError(f"regime must be one of {REGIMES}, got {regime!r}")


def run(built: Built, regime: str, context: Callable[[], Any] | None = None
        ) -> dict[str, torch.Tensor]:
    """One forward (regimes ``no_grad``, ``inference_mode``: model in eval mode) or one
    training step (``sgd``, ``adamw_fused``: train mode, forward, loss, backward, step) of
    a fresh copy of ``built``, with ``context()`` (e.g. a fuzzy block) around all of it.

    Returns ``{"out": output}`` for a forward, and ``{"loss", "grad.<param>",
    "param.<param>"}`` (gradients, parameters after the step) for a training step.
    """
    model = copy.deepcopy(built.model)
    inputs = built.inputs
    ctx = context or contextlib.nullcontext
    if regime in FORWARD_REGIMES:
        model.eval()
        with _grad_context(regime), ctx():
            out = model(*inputs)
        return {"out": out}
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = _optimizer(regime, [p for _, p in named])
    with ctx():
        loss = built.loss(model(*inputs))
        loss.backward()
        opt.step()
    res = {"loss": loss.detach()}
    res.update({f"grad.{n}": p.grad for n, p in named if p.grad is not None})
    res.update({f"param.{n}": p.detach() for n, p in named})
    return res


def fuzzy_block(**kwargs):
    """A factory of ``numvar.fuzzy(**kwargs)`` blocks for :func:`run`; ``strict=True`` is
    passed on only where :func:`numvar.fuzzy` accepts it (see :func:`supports_strict`)."""
    from ..instrument import fuzzy

    if kwargs.get("strict") and not supports_strict():
        kwargs = {k: v for k, v in kwargs.items() if k != "strict"}
    return lambda: fuzzy(**kwargs)


def supports_strict() -> bool:
    """Whether :func:`numvar.fuzzy` takes ``strict`` (raise at the first escaping op)."""
    from ..instrument import fuzzy

    return "strict" in inspect.signature(fuzzy).parameters


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
        return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
    return torch.equal(a, b)


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Keys of two :func:`run` results whose tensors differ in dtype, shape or any bit
    (NaN payloads and signed zeros included); missing keys count as different."""
    return sorted(k for k in a.keys() | b.keys()
                  if k not in a or k not in b or not _same_bits(a[k], b[k]))


def dtypes(res: dict[str, torch.Tensor]) -> dict[str, torch.dtype]:
    return {k: v.dtype for k, v in res.items()}


# ---------------------------------------------------------------------------- escapes
#: how the report names an op rounded once at flop granularity for want of a flop handler
NO_FLOP_HANDLER = "rounded once (no flop handler)"


def escapes(report) -> dict[str, int]:
    """The ops of a :class:`numvar.FuzzyReport` that escaped perturbation at the
    granularity asked, with their call counts: ops that ran natively (no handler, or a
    handler that failed), and at flop granularity ops rounded once for want of a flop
    handler (``"rounded once (no flop handler)"``). Empty means nothing escaped."""
    out = Counter(report.native)
    if report.granularity == "flop":
        for name, n in report.instrumented.items():
            if report.how.get(name, "").startswith("rounded once"):
                out[name] += n
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def format_escapes(esc: dict[str, int]) -> str:
    return ", ".join(f"{n} ×{c}" for n, c in esc.items()) or "none"


# ------------------------------------------------------------------ contraction count
@dataclass
class Contractions:
    """What the flop kernels computed in a block: ``terms`` of contractions (matmul,
    convolution: Σ batch·M·N·K, each a rounded product and a rounded add; per kernel
    dtype in ``terms_by_dtype``: binary16 formats run in the float32 kernel), the largest
    single call ``work_max`` (terms), the longest contraction ``k_max`` and the longest
    reduction or scan ``reduce_max``."""

    terms: int = 0
    terms_by_dtype: dict[str, int] = field(default_factory=dict)  # "float32", "float64"
    work_max: int = 0
    k_max: int = 0
    reduce_max: int = 0
    calls: int = 0


@contextlib.contextmanager
def count_contractions() -> Iterator[Contractions]:
    """Count, in a ``with`` block, the contraction terms the flop kernels compute, by
    wrapping the entry points of the flop-level contractions,
    ``numvar.instrument.flop._contract`` (every product, numba or Triton backend),
    ``flop._contract_groups`` (the group products of a convolution without its im2col
    matrix) and ``flop._contract_bias`` (a linear layer's product with its bias), and
    ``flop.reduce`` / ``flop.scan`` (reductions and scans). A measuring tool for
    benchmarks and tolerances: the wrappers only count."""
    from ..instrument import flop as FL

    stats = Contractions()
    contract, groups, reduce, scan = FL._contract, FL._contract_groups, FL.reduce, FL.scan
    with_bias = FL._contract_bias

    def count(work: int, k: int, kd: str) -> None:
        stats.terms += work
        stats.terms_by_dtype[kd] = stats.terms_by_dtype.get(kd, 0) + work
        stats.work_max = max(stats.work_max, work)
        stats.k_max = max(stats.k_max, k)
        stats.calls += 1

    def counted_contract(a, b, *args, **kwargs):
        count(max(a.shape[0], b.shape[0]) * a.shape[1] * b.shape[2] * a.shape[2], a.shape[2],
              str(kwargs.get("kd", args[-1] if args else "")).replace("torch.", ""))
        return contract(a, b, *args, **kwargs)

    def counted_with_bias(a, b, c, ctx):  # (M, K) @ (K, N)
        count(a.shape[0] * b.shape[1] * a.shape[1], a.shape[1], "float32")
        return with_bias(a, b, c, ctx)

    def counted_groups(x, w, ks, stride, padding, dilation, g, ls, *args, **kwargs):
        k = w[0].numel()  # (O, C/g, *ks): the products (O/g, K) @ (K, N·∏L) of each group
        count(w.shape[0] * x.shape[0] * math.prod(ls) * k, k, "float32")
        return groups(x, w, ks, stride, padding, dilation, g, ls, *args, **kwargs)

    def counted_reduce(x, dim, *args, **kwargs):
        dims = FL._dims(x, dim) if x.dim() else []
        stats.reduce_max = max(stats.reduce_max, math.prod(x.shape[d] for d in dims))
        return reduce(x, dim, *args, **kwargs)

    def counted_scan(x, dim, *args, **kwargs):
        if x.dim():
            stats.reduce_max = max(stats.reduce_max, x.shape[dim % x.dim()])
        return scan(x, dim, *args, **kwargs)

    FL._contract, FL._contract_groups = counted_contract, counted_groups
    FL._contract_bias = counted_with_bias
    FL.reduce, FL.scan = counted_reduce, counted_scan
    try:
        yield stats
    finally:
        FL._contract, FL._contract_groups, FL.reduce, FL.scan = contract, groups, reduce, scan
        FL._contract_bias = with_bias


# -------------------------------------------------------------------------- ieee check
def _rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖₂ / ‖ref‖₂ in float64 (complex as pairs); 0 when both are 0; inf on shape
    or finiteness mismatch."""
    if x.shape != ref.shape:
        return math.inf
    if x.is_complex():
        x = torch.view_as_real(x)
    if ref.is_complex():
        ref = torch.view_as_real(ref)
    x, ref = x.detach().double(), ref.detach().double()
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(x)):
        return math.inf
    d = torch.linalg.vector_norm((x - ref)[fin]).item()
    r = torch.linalg.vector_norm(ref[fin]).item()
    return d / r if r else (0.0 if d == 0 else math.inf)


@dataclass
class IeeeCheck:
    """``mode="ieee"`` (flop) against native, both against a float64 reference.

    Per result tensor: ``err_ieee`` = ‖ieee − ref‖/‖ref‖, ``err_native`` the same for
    native, ``tol`` the bound err_ieee must meet. ``worst``: the key with the largest
    err_ieee / tol; ``ok`` when every key meets its bound.

    Derivation of ``tol``. Native and ieee-flop evaluate the same graph of operations
    in the same format with round-to-nearest; they differ in the order of the sums inside
    contractions and reductions (numvar: one documented sequential order; MKL/oneDNN:
    blocked and vectorised orders). Under the probabilistic model of rounding errors
    (Higham & Mary 2019: independent, mean-zero errors), a length-K sum in any order has
    error ≤ λ·√K·u·Σ|terms| with high probability, and the most accurate order still
    rounds each output once; so the ratio of the errors of two orders, propagated through
    the same network (same amplification), is at most √K. With K = ``k_max``, the longest
    contraction or reduction the flop kernels computed in this run (counted, not guessed),
    and λ = 2: err_ieee ≤ 2·√K·max(err_native, u), where u is the format's unit roundoff
    (the floor for outputs native computes exactly). For a float64 model there is no
    wider reference: err_native is estimated as A·u₆₄ with the network's amplification
    A = max(err_native₃₂, u₃₂)/u₃₂ measured on its float32 copy against float64.

    Parameters after a training step (``param.*``) are compared, for ieee and for native
    alike, with the optimizer step taken in float64 from that run's own gradients
    (:func:`step_reference`); the gradients themselves are compared with the reference
    above. The step maps each gradient element to an update with no sum to reorder, and
    not with a bounded gain: AdamW's first step, lr·g/(|g| + ε), turns an absolute error
    δ of a gradient element with |g| ≪ ε into lr·δ/ε, 10⁵·δ at lr = 10⁻³, ε = 10⁻⁸. A
    gradient element that is a cancellation (|g| ~ 10⁻¹⁰) thus carries the backward
    pass's summation order into the parameters at a gain no √K bounds (measured: whisper,
    decoder q_proj, one element of 256 off by 7.5·10⁻⁶ against the reference of the
    float64 gradients, 1.2× the bound, where native's order landed 27× closer).
    """

    err_ieee: dict[str, float]
    err_native: dict[str, float]
    tol: dict[str, float]
    k_max: int
    escapes: dict[str, int] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        return max(self.err_ieee, key=lambda k: self.err_ieee[k] / self.tol[k])

    @property
    def ok(self) -> bool:
        return all(self.err_ieee[k] <= self.tol[k] for k in self.err_ieee)

    def summary(self) -> str:
        k = self.worst
        return (f"{self.err_ieee[k]:.1e} (native {self.err_native[k]:.1e}, tol "
                f"{self.tol[k]:.1e}, {k})")


def reference_run(built: Built, regime: str) -> dict[str, torch.Tensor]:
    """The entry computed natively in float64 on numvar's code path (a reference)."""
    from ..instrument.codepath import codepath

    return run(built.to(torch.float64), regime, codepath)


def step_reference(built: Built, regime: str, res: dict[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """The parameters after ``regime``'s optimizer step (a training regime of :func:`run`)
    taken in float64, on numvar's code path, from ``built``'s initial parameters and the
    gradients of the run ``res`` (its ``grad.<name>`` entries), as ``{"param.<name>":
    tensor}``; a parameter without a gradient keeps its value, as the optimizer leaves
    it."""
    from ..instrument.codepath import codepath

    model = built.to(torch.float64).model
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for n, p in named:
        g = res.get(f"grad.{n}")
        p.grad = None if g is None else g.detach().to(torch.float64)
    opt = _optimizer(regime, [p for _, p in named])
    with codepath():
        opt.step()
    return {f"param.{n}": p.detach() for n, p in named}


def ieee_check(built: Built, regime: str, **fuzzy_kwargs) -> IeeeCheck:
    """Run ``built`` natively (on numvar's code path, :mod:`numvar.instrument.codepath`),
    under ``fuzzy(mode="ieee", granularity="flop", **fuzzy_kwargs)`` and in float64;
    see :class:`IeeeCheck`."""
    from ..instrument.codepath import codepath

    native = run(built, regime, codepath)
    with count_contractions() as cc:
        holder = {}

        def block():
            fz = fuzzy_block(**{"mode": "ieee", "granularity": "flop", **fuzzy_kwargs})()
            holder["fz"] = fz
            return fz
        ieee = run(built, regime, block)
    u = UNIT_ROUNDOFF[built.dtype]
    # parameters after a step: against the float64 step from each run's own gradients
    # (IeeeCheck: the optimizer's elementwise map is no sum to reorder)
    training = regime not in FORWARD_REGIMES
    ref_ieee = step_reference(built, regime, ieee) if training else {}
    if built.dtype == torch.float64:
        ref = native
        f32 = built.to(torch.float32)
        n32 = run(f32, regime, codepath)
        amp = max(max(max(_rel_error(n32[k], ref[k]), 2.0 ** -24) for k in ref) / 2.0 ** -24, 1.0)
        err_native = {k: amp * u for k in ref}
    else:
        ref = reference_run(built, regime)
        ref_native = step_reference(built, regime, native) if training else {}
        err_native = {k: _rel_error(native[k], ref_native.get(k, ref[k])) for k in ref}
    k_max = max(cc.k_max, cc.reduce_max, 1)
    err_ieee = {k: _rel_error(ieee[k], ref_ieee.get(k, ref[k])) if k in ieee else math.inf
                for k in ref}
    tol = {k: 2.0 * math.sqrt(k_max) * max(err_native[k], u) for k in ref}
    return IeeeCheck(err_ieee, err_native, tol, k_max, escapes(holder["fz"].report()))


# ------------------------------------------------------------------------------- probe
def probe_precision(dtype: torch.dtype) -> int:
    """The probe's virtual precision for a model in ``dtype``: 8 bits, or 4 bits below
    the format's own when that is less (bfloat16: 4), so that a native result, which has
    at least 4 more bits, lies spread over ≥ 16 positions of the probe's ulp."""
    return min(PROBE_PRECISION, SIGNIFICAND_BITS[dtype] - 4)


#: significand bits (hidden bit included) per dtype
SIGNIFICAND_BITS = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}


@dataclass
class ModuleProbe:
    """One module call of the coverage probe. ``status``: ``moved`` (perturbed as
    required), ``exact`` (no arithmetic of its own, output bitwise native), ``exact
    result`` (arithmetic whose every result native computes exactly: nothing to round),
    ``not required`` (a container whose own ops are pointwise only), ``UNPERTURBED``
    (own arithmetic with inexact results, moved less than the threshold), ``CHANGED``
    (no arithmetic of its own, yet a different output). ``stat``: the movement (median or
    maximum relative change over ``n`` inexact elements)."""

    path: str
    kind: str  # "forward" or "backward"
    stat: float
    n: int
    arithmetic: list[str]
    status: str

    @property
    def failed(self) -> bool:
        return self.status in ("UNPERTURBED", "CHANGED")


@dataclass
class ProbeResult:
    modules: list[ModuleProbe]
    precision: int = PROBE_PRECISION

    @property
    def failures(self) -> list[ModuleProbe]:
        return [m for m in self.modules if m.failed]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        f = self.failures
        probed = sum(m.status == "moved" for m in self.modules)
        if not f:
            return f"ok ({probed} module calls moved)"
        names = ", ".join(sorted({f"{m.path or '<model>'}[{m.kind}]" for m in f}))
        return f"{len(f)} unperturbed: {names}"


def _tmap(fn, obj):
    """Apply ``fn`` to every tensor of a nested structure (tuple, list, dict, dataclass-like
    mappings such as transformers' ModelOutput), keeping the structure."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        vals = [_tmap(fn, v) for v in obj]
        return type(obj)(*vals) if hasattr(obj, "_fields") else type(obj)(vals)
    if isinstance(obj, dict):
        vals = {k: _tmap(fn, v) for k, v in obj.items()}
        try:
            return type(obj)(**vals)
        except TypeError:
            return vals
    return obj


def _tensors(obj) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _tmap(lambda t: out.append(t) or t, obj)
    return out


def _float_view(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.detach().double().flatten() if t.is_floating_point() else None


def _movement(nat, pert, ref, tau: float, median: bool) -> tuple[float, int]:
    """(statistic, n) of |pert − nat|/|nat| over the ``n`` elements that native rounded:
    finite, non-zero and different from the float64 computation ``ref`` (an element native
    computes exactly has nothing to round; ``ref`` None: a float64 model, every element).
    The median when ``median`` and n ≥ PROBE_MEDIAN_MIN, else the maximum. A shape or finiteness mismatch counts as moved."""
    rel = []
    for a, b, r in zip(nat, pert, ref if ref is not None else [None] * len(nat)):
        a, b, r = _float_view(a), _float_view(b), _float_view(r)
        if a is None:
            continue
        if b is None or a.shape != b.shape:
            return math.inf, a.numel()
        keep = torch.isfinite(a) & (a != 0)
        if r is not None and r.shape == a.shape:
            keep &= a != r
        rel.append(torch.nan_to_num(((b - a).abs() / a.abs())[keep], nan=math.inf))
    r = torch.cat(rel) if rel else torch.zeros(0, dtype=torch.float64)
    if r.numel() == 0:
        return 0.0, 0
    if median and r.numel() >= PROBE_MEDIAN_MIN:
        return float(r.median()), r.numel()
    return float(r.max()), r.numel()


def _arithmetic(report) -> list[str]:
    """Ops of a fuzzy report that may do float arithmetic: instrumented, run natively for
    want of a handler, or left native on request (``exclude``, ``modules``)."""
    return sorted(set(report.instrumented) | set(report.native) | set(report.excluded)
                  | set(report.outside_modules))


def _non_pointwise(names: list[str]) -> list[str]:
    out = []
    for name in names:
        ns, rest = name.split(".", 1)
        packet, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), packet, None), overload or "default", None)
        if op is None or torch.Tag.pointwise not in op.tags:
            out.append(name)
    return out


@contextlib.contextmanager
def _children_native(module: nn.Module) -> Iterator[None]:
    """Run ``module``'s direct children with every dispatch mode suspended (natively),
    so a fuzzy block around ``module`` perturbs only the module's own code."""
    from torch.utils._python_dispatch import _disable_current_modes

    patched = []
    for child in module.children():
        original = child.forward

        def native(*a, _f=original, **k):
            with _disable_current_modes():
                return _f(*a, **k)
        child.forward = native
        patched.append(child)
    try:
        yield
    finally:
        for child in patched:
            del child.forward


def _status(arith: list[str], required: bool, stat: float, n: int, tau: float) -> str:
    if required:
        if n == 0:
            return "exact result"
        return "moved" if stat >= tau else "UNPERTURBED"
    if arith:
        return "not required"
    return "exact" if stat == 0 else "CHANGED"


def _to64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64) if t.is_floating_point() else t.clone()


def probe(built: Built, regime: str, *, precision: int | None = None, seed: int = 0,
          **fuzzy_kwargs) -> ProbeResult:
    """Coverage probe: does SR at ``precision`` bits perturb every module of the model?

    A native run records, with forward pre-hooks on every module, each module call's
    inputs. Each call is then re-run on its own recorded inputs, natively, in float64 and
    under ``fuzzy(mode="sr", precision=precision)``, with the module's children run
    natively, so that only the module's own code is perturbed. Where the module has
    arithmetic of its own (a leaf module: any float op in the report, or any output
    element native rounded, which catches ops numvar wrongly takes for exact; a
    container: any op that is not pointwise, e.g. attention's matmuls, grid_sample, an
    FFT), its output must move by at
    least ``2^-precision / 8`` (:data:`PROBE_TAU` at 8 bits), measured as the median
    relative change over the elements native rounds (those that differ from the float64
    computation); a module without arithmetic must stay bitwise native. In the training
    regimes each leaf module with parameters is also differentiated on its own (a fixed
    random output gradient): the gradients must move likewise, by the same rule as a
    leaf's output (the maximum relative
    change of each gradient tensor that has inexact elements). ``precision`` defaults to
    :func:`probe_precision` of the model's dtype; ``fuzzy_kwargs`` go to every fuzzy
    block (e.g. ``exclude`` to see the probe fail). One :class:`ModuleProbe` per call.
    """
    from ..instrument import fuzzy
    from ..instrument.codepath import codepath

    precision = precision or probe_precision(built.dtype)
    tau = 2.0 ** -precision / 8
    model = copy.deepcopy(built.model)
    training = regime not in FORWARD_REGIMES
    model.train(training)
    paths = {id(m): p for p, m in model.named_modules()}
    calls: list[tuple[nn.Module, tuple, dict]] = []

    def clone(t):
        return t.detach().clone()

    def pre(mod, args, kwargs):
        calls.append((mod, _tmap(clone, args), _tmap(clone, kwargs)))

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in model.modules()]
    try:
        with codepath(), _grad_context(regime):
            model(*built.inputs)
    finally:
        for h in handles:
            h.remove()

    results = []
    for i, (mod, args, kwargs) in enumerate(calls):
        path = paths.get(id(mod), "?")
        leaf = next(mod.children(), None) is None
        mod64 = copy.deepcopy(mod).to(torch.float64)
        with codepath(), _grad_context(regime):
            ref = mod64(*_tmap(_to64, args), **_tmap(_to64, kwargs))
            with _children_native(mod):
                nat = mod(*_tmap(clone, args), **_tmap(clone, kwargs))
                with fuzzy(mode="sr", precision=precision, seed=seed + i, **fuzzy_kwargs) as fz:
                    pert = mod(*_tmap(clone, args), **_tmap(clone, kwargs))
        arith = _arithmetic(fz.report())
        ref = None if built.dtype == torch.float64 else _tensors(ref)
        stat, n = _movement(_tensors(nat), _tensors(pert), ref, tau, median=True)
        # a leaf must move when it reported arithmetic or when native rounded its output
        # (inexact elements: an op numvar took for exact, e.g. an accumulating scatter);
        # a container when its own code has a non-pointwise op
        required = bool(arith) or n > 0 if leaf else bool(_non_pointwise(arith))
        status = _status(arith, required, stat, n, tau)
        results.append(ModuleProbe(path, "forward", stat, n, arith, status))
        if training and leaf and any(p.requires_grad for p in mod.parameters()):
            results.append(_probe_backward(mod, mod64, path, args, kwargs, precision,
                                           seed + i, fuzzy_kwargs))
    return ProbeResult(results, precision)


def _probe_backward(mod, mod64, path, args, kwargs, precision, seed, fuzzy_kwargs
                    ) -> ModuleProbe:
    """Gradients of one leaf module (inputs and parameters) for a fixed random output
    gradient: native, float64, and under SR at ``precision``; see :func:`probe`."""
    from ..instrument import fuzzy
    from ..instrument.codepath import codepath

    def grads(m, dtype_of, perturb: bool):
        leaves = []

        def leafify(t):
            if t.is_floating_point():
                t = dtype_of(t).detach().clone().requires_grad_()
                leaves.append(t)
                return t.clone()  # not a leaf: in-place modules may write to it
            return t.clone()
        a, k = _tmap(leafify, args), _tmap(leafify, kwargs)
        params = [p for p in m.parameters() if p.requires_grad]
        with codepath():
            out = [t for t in _tensors(m(*a, **k)) if t.requires_grad]
            gen = _gen(7)
            vs = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(mod_dtype)
                  .to(t.dtype) for t in out]
            block = (fuzzy(mode="sr", precision=precision, seed=seed, **fuzzy_kwargs)
                     if perturb else contextlib.nullcontext())
            with block as fz:
                gs = torch.autograd.grad(out, leaves + params, vs, allow_unused=True)
        return [g if g is not None else torch.zeros(()) for g in gs], fz

    mod_dtype = next(mod.parameters()).dtype
    nat, _ = grads(mod, lambda t: t, False)
    ref, _ = grads(mod64, _to64, False)
    pert, fz = grads(mod, lambda t: t, True)
    arith = _arithmetic(fz.report())
    tau = 2.0 ** -precision / 8
    if mod_dtype == torch.float64:
        ref = [None] * len(nat)
    stats = [_movement([a], [b], None if r is None else [r], tau, median=False)
             for a, b, r in zip(nat, pert, ref)]
    stats = [(s, n) for s, n in stats if n]
    stat = min((s for s, _ in stats), default=0.0)
    n = sum(n for _, n in stats)
    status = _status(arith, bool(arith) or n > 0, stat, n, tau)
    return ModuleProbe(path, "backward", stat, n, arith, status)


# ----------------------------------------------------------------------------- threads
THREAD_MODELS = ("resnet_basic", "bert")


def thread_check(names=THREAD_MODELS, size: str = "test", regimes=("no_grad", "sgd"),
                 threads=(1, 2), min_work: int | None = 0) -> dict[str, dict]:
    """Run each entry under ``fuzzy(mode="sr", granularity="flop", seed=0)`` once per
    thread count (torch's and numba's set alike, restored after), in each of ``regimes``,
    and compare the results bit for bit.

    ``min_work`` replaces ``numvar.instrument.kernels.PARALLEL_MIN_WORK`` (the work below
    which a parallel kernel runs on one thread) for the duration: 0, the default, sends
    every kernel call of the tiny test models down the parallel path; None keeps it.
    Returns, per entry, ``differ`` (``regime:key`` of results whose bits differ between
    thread counts), ``work_max`` (the largest contraction call, in terms), ``min_work``
    (the threshold in effect) and ``threads`` (the (torch, numba) counts in effect)."""
    import numba

    from ..instrument import kernels as KN

    old = torch.get_num_threads(), numba.get_num_threads(), KN.PARALLEL_MIN_WORK
    out = {}
    try:
        if min_work is not None:
            KN.PARALLEL_MIN_WORK = min_work
        for name in names:
            built = build(name, size)
            differ, used, work = set(), [], 0
            for regime in regimes:
                results = []
                for t in threads:
                    torch.set_num_threads(t)
                    numba.set_num_threads(t)
                    used.append((torch.get_num_threads(), numba.get_num_threads()))
                    with count_contractions() as cc:
                        results.append(run(built, regime, fuzzy_block(mode="sr", seed=0)))
                    work = max(work, cc.work_max)
                differ |= {f"{regime}:{k}" for r in results[1:]
                           for k in bitwise_equal(results[0], r)}
            out[name] = {"differ": sorted(differ), "work_max": work,
                         "min_work": KN.PARALLEL_MIN_WORK, "threads": sorted(set(used))}
    finally:
        torch.set_num_threads(old[0])
        numba.set_num_threads(old[1])
        KN.PARALLEL_MIN_WORK = old[2]
    return out


# ------------------------------------------------------------------------------- table
def zoo_row(name: str, size: str = "test", regimes=REGIMES) -> dict[str, str]:
    """One row of the zoo table: escapes at flop SR (summed over ``regimes``; a crash is
    named), the worst ieee error against its tolerance, the probe's failures."""
    built = build(name, size)
    esc: Counter = Counter()
    errors, ieee, probes = [], [], []
    for regime in regimes:
        try:
            fz = fuzzy_block(mode="sr", granularity="flop", seed=0)()
            run(built, regime, lambda: fz)
            esc.update(escapes(fz.report()))
        except Exception as e:  # noqa: BLE001 - the table names every failure
            errors.append(f"{regime}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        try:
            chk = ieee_check(built, regime)
            ieee.append((max(chk.err_ieee[k] / chk.tol[k] for k in chk.err_ieee), regime, chk))
        except Exception as e:  # noqa: BLE001
            errors.append(f"ieee {regime}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        try:
            pr = probe(built, regime)
            probes.append(f"{regime}: {pr.summary()}" if not pr.ok else "")
        except Exception as e:  # noqa: BLE001
            errors.append(f"probe {regime}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
    worst = max(ieee, key=lambda t: t[0]) if ieee else None
    fails = [p for p in probes if p]
    return {
        "model": name,
        "escapes": format_escapes(dict(sorted(esc.items(), key=lambda kv: (-kv[1], kv[0])))),
        "ieee": (f"{worst[2].summary()} [{worst[1]}]" + (" FAIL" if worst[0] > 1 else " ok"))
        if worst else "—",
        "probe": "; ".join(fails) if fails else ("ok" if probes else "—"),
        "errors": "; ".join(errors) or "none",
    }


def table(names=None, size: str = "test", regimes=REGIMES, out=sys.stdout) -> list[dict]:
    """Print the zoo table as Markdown (one row per model, as it is computed)."""
    rows = []
    print("| model | ops escaping (flop SR, all regimes) | ieee error vs float64 (worst) | "
          "probe (precision 8) | crashes |", file=out)
    print("|---|---|---|---|---|", file=out, flush=True)
    for name in names or ZOO:
        row = zoo_row(name, size, regimes)
        rows.append(row)
        print(f"| {row['model']} | {row['escapes']} | {row['ieee']} | {row['probe']} | "
              f"{row['errors']} |", file=out, flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m numvar.workloads.zoo",
                                 description="numvar's model zoo: escapes, ieee error, probe")
    ap.add_argument("--table", action="store_true", help="print the zoo table (Markdown)")
    ap.add_argument("--models", nargs="*", default=None, help="entries (default: all)")
    ap.add_argument("--size", default="test", choices=SIZES)
    ap.add_argument("--regimes", nargs="*", default=list(REGIMES), choices=REGIMES)
    ap.add_argument("--list", action="store_true", help="list the entries")
    args = ap.parse_args(argv)
    if args.list or not args.table:
        for e in ZOO.values():
            print(f"{e.name:22s} {e.covers}")
        return
    import logging

    logging.getLogger("numvar").setLevel(logging.ERROR)
    table(args.models, args.size, args.regimes)


if __name__ == "__main__":
    main()
