"""The architectures of the model zoo (:mod:`numvar.workloads.zoo`), built in code.

No downloads and no torchvision: every block type is written here in a few lines, the
way torchvision / timm write them (residual blocks with batch norm, inverted residuals
with squeeze-excitation, dense blocks, a U-Net, a ViT), plus small models around the
functional ops numvar must perturb (FFT, grid_sample, linear solve, EmbeddingBag, norms).
The ``transformers`` models are built in :mod:`numvar.workloads.zoo` from tiny configs.

Every module here calls each of its sub-modules at most once per forward (no shared
activation instances), so that forward hooks see one call per module and the coverage
probe of the zoo can run each module on its own recorded inputs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------- residual CNNs
def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """Convolution (no bias) followed by batch norm, "same" padding."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """ResNet-18/34 block: 3×3 conv-BN-ReLU, 3×3 conv-BN, identity or 1×1 projection."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv_bn(cin, width, 3, stride)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = conv_bn(width, width, 3)
        self.shortcut = (conv_bn(cin, width, 1, stride) if stride != 1 or cin != width
                         else nn.Identity())
        self.relu2 = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.conv2(self.relu1(self.conv1(x)))
        return self.relu2(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet-50 block: 1×1 reduce, 3×3 (stride), 1×1 expand ×4, with batch norm."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.reduce = conv_bn(cin, width, 1)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv = conv_bn(width, width, 3, stride)
        self.relu2 = nn.ReLU(inplace=True)
        self.expand = conv_bn(width, cout, 1)
        self.shortcut = (conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout
                         else nn.Identity())
        self.relu3 = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.expand(self.relu2(self.conv(self.relu1(self.reduce(x)))))
        return self.relu3(out + self.shortcut(x))


class ResNet(nn.Module):
    """A ResNet: stem, stages of ``block`` (first block of each later stage strided),
    global average pooling, linear classifier. ``stem=(kernel, stride, maxpool)``."""

    def __init__(self, block, layers, widths, classes: int = 10, stem=(3, 1, False)) -> None:
        super().__init__()
        k, s, pool = stem
        self.stem = nn.Sequential(conv_bn(3, widths[0], k, s), nn.ReLU(inplace=True),
                                  *([nn.MaxPool2d(3, 2, 1)] if pool else []))
        blocks, cin = [], widths[0]
        for i, (n, w) in enumerate(zip(layers, widths)):
            for j in range(n):
                blocks.append(block(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


# -------------------------------------------------- depthwise-separable + squeeze-excitation
class SqueezeExcite(nn.Module):
    """Squeeze-excitation: global pool, 1×1 reduce, ReLU/SiLU, 1×1 expand, gate, rescale."""

    def __init__(self, c: int, reduced: int, act: type[nn.Module], gate: type[nn.Module]) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, reduced, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(reduced, c, 1)
        self.gate = gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and EfficientNet (MBConv) block: 1×1 expand, k×k depthwise,
    squeeze-excitation, 1×1 linear projection, residual when shapes allow."""

    def __init__(self, cin: int, expanded: int, cout: int, k: int, stride: int,
                 act: type[nn.Module], gate: type[nn.Module], se_act: type[nn.Module]) -> None:
        super().__init__()
        self.expand = (nn.Sequential(conv_bn(cin, expanded, 1), act())
                       if expanded != cin else nn.Identity())
        self.depthwise = nn.Sequential(conv_bn(expanded, expanded, k, stride, groups=expanded),
                                       act())
        self.se = SqueezeExcite(expanded, max(4, expanded // 4), se_act, gate)
        self.project = conv_bn(expanded, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.project(self.se(self.depthwise(self.expand(x))))
        return x + out if self.residual else out


class MobileNet(nn.Module):
    """A MobileNetV3 / EfficientNet-style network of :class:`InvertedResidual` blocks.

    ``blocks``: (expanded, cout, kernel, stride) per block. MobileNetV3 uses Hardswish
    and a Hardsigmoid gate with a ReLU inside SE; EfficientNet SiLU, Sigmoid, SiLU."""

    def __init__(self, stem: int, blocks, head: int, act, gate, se_act, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, stem, 3, 2), act())
        layers, cin = [], stem
        for expanded, cout, k, s in blocks:
            layers.append(InvertedResidual(cin, expanded, cout, k, s, act, gate, se_act))
            cin = cout
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Sequential(conv_bn(cin, head, 1), act())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(head, classes)

    def forward(self, x):
        return self.fc(self.pool(self.head(self.blocks(self.stem(x)))).flatten(1))


# ------------------------------------------------------------------------- dense block
class DenseLayer(nn.Module):
    """DenseNet-BC layer: BN-ReLU-1×1 (4·growth), BN-ReLU-3×3 (growth), concatenated."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x):
        new = self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))
        return torch.cat([x, new], 1)


class DenseNet(nn.Module):
    """Stem, dense blocks of :class:`DenseLayer` joined by transitions (BN-ReLU-1×1-avgpool),
    final BN-ReLU, global pooling, classifier."""

    def __init__(self, stem: int, growth: int, layers, classes: int = 10) -> None:
        super().__init__()
        mods, c = [nn.Conv2d(3, stem, 3, padding=1, bias=False)], stem
        for i, n in enumerate(layers):
            for _ in range(n):
                mods.append(DenseLayer(c, growth))
                c += growth
            if i < len(layers) - 1:
                mods += [nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                         nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        mods += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*mods)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(self.features(x))


# ------------------------------------------------------------------------------ U-Net
def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Two-level U-Net: the deep level goes up by a stride-2 ConvTranspose2d, the shallow
    one by bilinear upsampling (nn.Upsample) and a 3×3 convolution; skip connections by
    concatenation; a 1×1 convolution to ``classes`` logits per pixel."""

    def __init__(self, cin: int, w: int, classes: int = 3) -> None:
        super().__init__()
        self.enc1, self.enc2 = double_conv(cin, w), double_conv(w, 2 * w)
        self.pool1, self.pool2 = nn.MaxPool2d(2), nn.MaxPool2d(2)
        self.bottom = double_conv(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.dec2 = double_conv(4 * w, 2 * w)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.up1_conv = nn.Conv2d(2 * w, w, 3, padding=1)
        self.dec1 = double_conv(2 * w, w)
        self.out = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool1(e1))
        b = self.bottom(self.pool2(e2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], 1))
        d1 = self.dec1(torch.cat([self.up1_conv(self.up1(d2)), e1], 1))
        return self.out(d1)


# ----------------------------------------------------------------------------------- ViT
class Attention(nn.Module):
    """Multi-head self-attention with ``F.scaled_dot_product_attention`` (timm's ViT)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class ViTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), x + MLP(LN(x)) with GELU."""

    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Vision transformer: patch embedding (stride-p convolution), class token, learned
    position embedding, pre-norm blocks, LayerNorm and a linear head on the class token."""

    def __init__(self, image: int, patch: int, d: int, heads: int, layers: int,
                 classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(d, heads, 4 * d) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        return self.head(self.norm(self.blocks(t))[:, 0])


# --------------------------------------------------------------------- recurrent nets
class Recurrent(nn.Module):
    """``nn.LSTM`` or ``nn.GRU`` (batch first) and a linear head on every time step."""

    def __init__(self, cell: str, features: int, hidden: int, layers: int,
                 classes: int = 4) -> None:
        super().__init__()
        self.rnn = getattr(nn, cell)(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


# ---------------------------------------------------------------------- transformer
class Encoder(nn.Module):
    """Token embedding, ``nn.TransformerEncoder`` with a key padding mask (nested tensors
    allowed: the fused fast path is what a user gets outside numvar), a linear head and
    a mean over the non-padded tokens."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, classes: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens, pad):
        h = self.head(self.enc(self.emb(tokens), src_key_padding_mask=pad))
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return (h * keep).sum(1) / keep.sum(1)


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` over a sequence with a key padding mask; the attention
    output plus the head-averaged attention weights applied to a value projection."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.value = nn.Linear(d, d)

    def forward(self, x, pad):
        out, weights = self.mha(x, x, x, key_padding_mask=pad)
        return out + weights @ self.value(x)


# ------------------------------------------------------------------- functional ops
class Gather(nn.Module):
    """Rows of a parameter table by advanced indexing, ``table[idx]``: its backward
    accumulates (``index_put_(accumulate=True)``) where indices repeat."""

    def __init__(self, rows: int, d: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(rows, d))

    def forward(self, idx):
        return self.table[idx]


class Bags(nn.Module):
    """Two ``nn.EmbeddingBag`` s over the same bags (mean; sum with per-sample weights)
    and the per-bag mean of a :class:`Gather` of the same indices, concatenated, and a
    linear head. Repeated indices make the backward accumulate."""

    def __init__(self, vocab: int, d: int, classes: int = 4) -> None:
        super().__init__()
        self.mean_bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.sum_bag = nn.EmbeddingBag(vocab, d, mode="sum")
        self.gather = Gather(vocab, d)
        self.head = nn.Linear(3 * d, classes)

    def forward(self, idx, offsets, weights):
        a = self.mean_bag(idx, offsets)
        b = self.sum_bag(idx, offsets, per_sample_weights=weights)
        c = self.gather(idx).view(a.shape[0], -1, a.shape[1]).mean(1)
        return self.head(torch.cat([a, b, c], 1))


class SpectralFilter(nn.Module):
    """A learned frequency response: ``irfft(rfft(x) · H)``, H = polar(gain, phase)
    per channel and frequency (a complex multiply between two FFTs)."""

    def __init__(self, channels: int, length: int) -> None:
        super().__init__()
        f = length // 2 + 1
        self.length = length
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(channels, f))
        self.phase = nn.Parameter(0.1 * torch.randn(channels, f))

    def forward(self, x):
        h = torch.polar(self.gain, self.phase)
        return torch.fft.irfft(torch.fft.rfft(x) * h, n=self.length)


class FFTNet(nn.Module):
    """1-D convolution, :class:`SpectralFilter`, linear head over time."""

    def __init__(self, channels: int, length: int, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, channels, 5, padding=2)
        self.filter = SpectralFilter(channels, length)
        self.head = nn.Linear(channels * length, classes)

    def forward(self, x):
        return self.head(self.filter(self.conv(x)).flatten(1))


class SpatialTransformer(nn.Module):
    """Spatial transformer network: a localisation net predicts an affine map (starting
    at the identity), ``F.affine_grid`` + bilinear ``F.grid_sample`` resample the image,
    then a small classifier."""

    def __init__(self, c: int, w: int, classes: int = 10) -> None:
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(c, w, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * w, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.1)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
        self.classify = nn.Sequential(nn.Conv2d(c, w, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                      nn.Linear(4 * w, classes))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return self.classify(F.grid_sample(x, grid, mode="bilinear", align_corners=False))


class Solve(nn.Module):
    """Solves A y = x for a learned symmetric positive definite A = W Wᵀ/n + I, then a
    linear head: a linear-algebra layer (``torch.linalg.solve``) inside a network."""

    def __init__(self, n: int, classes: int = 4) -> None:
        super().__init__()
        self.n = n
        self.w = nn.Parameter(torch.randn(n, n))
        self.head = nn.Linear(n, classes)

    def forward(self, x):
        a = self.w @ self.w.T / self.n + torch.eye(self.n, dtype=x.dtype)
        return self.head(torch.linalg.solve(a, x.T).T)


class Norms(nn.Module):
    """Every normalisation layer in a row: BatchNorm2d, GroupNorm, InstanceNorm2d,
    LayerNorm, RMSNorm, with a cumulative sum (``torch.cumsum``) before the head."""

    def __init__(self, c: int, hw: int, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.gn = nn.GroupNorm(2, c)
        self.inorm = nn.InstanceNorm2d(c, affine=True)
        self.ln = nn.LayerNorm(c * hw * hw)
        self.rms = nn.RMSNorm(c * hw * hw)
        self.head = nn.Linear(c * hw * hw, classes)

    def forward(self, x):
        h = self.inorm(self.gn(self.bn(self.conv(x)))).flatten(1)
        return self.head(torch.cumsum(self.rms(self.ln(h)), 1))


class SineMLP(nn.Module):
    """A tanh MLP predicting the next sample of a sine wave from a window (the float64
    model of scientific code, trained with LBFGS in practice)."""

    def __init__(self, window: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(window, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


class HFModel(nn.Module):
    """A ``transformers`` model called with keyword inputs; returns ``last_hidden_state``
    (a plain tensor, so the zoo treats every entry alike)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *inputs):
        return self.model(**dict(zip(self.keys, inputs))).last_hidden_state
