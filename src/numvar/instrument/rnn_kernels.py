"""Recurrent layers (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``) with their time steps in
compiled calls, at op and flop granularity (binary32).

Inside a fuzzy block PyTorch runs a recurrent layer as its cell arithmetic (mkldnn off,
:mod:`numvar.instrument.codepath`): per time step a hidden projection (``addmm``, or
``mm`` without biases) and, for a GRU, ten elementwise ops on (batch, hidden) tensors,
each dispatched to the mode, each with its handler, its output tensor and its kernel
call: some 30 µs of Python for a few hundred elements of arithmetic (docs/speed.md,
"A lower bound for per-op Python dispatch"). This module computes the same ops, with
the same stream keys in the same order and the same element indices, in three numba
calls per step around torch's own float64 ``sigmoid``/``tanh`` (the values the mode
rounds once, so no libm difference can enter) and the hidden projection: torch's float64
``addmm`` rounded once at op granularity (the mode's float64 re-run), at flop
``kernels.contract`` and the bias add, as ``flop.mm`` and ``flop.scale_add`` compute it
(:class:`_Projection`). The ops of one step, by cell (keys after the projection's):

==========  ==================================================================
cell        ops (element ``b·H + h`` of each (B, H) result; the LSTM's gate sum
            is one (B, 4H) op)
==========  ==================================================================
GRU         ``r = σ(hr + ir)``, ``z = σ(hz + iz)`` (``add_``, ``sigmoid_`` each),
            ``hn·r`` (``mul_``), ``in + hn·r`` (``add``), ``n = tanh`` (``tanh_``),
            ``h − n`` (``sub``), ``·z`` (``mul_``), ``+ n`` (``add_``)
LSTM        ``g = hg + ig`` (``add_``, (B, 4H)), ``σ(i)``, ``σ(f)``, ``tanh(g)``,
            ``σ(o)`` (in place), ``f·c``, ``i·g`` (``mul``), ``c' = f·c + i·g``
            (``add_``), ``tanh(c')``, ``h' = o·tanh(c')`` (``mul``)
RNN_TANH    ``hh + ih`` (``add_``), ``tanh``
RNN_RELU    ``hh + ih`` (``add_``), ``relu`` (exact: not rounded)
==========  ==================================================================

Layers, directions, the input projections (``addmm``, or ``mm`` and a bias ``add_`` for
an input that is not contiguous, as ``at::linear`` does) and the stacking of outputs
follow ``aten/src/ATen/native/RNN.cpp``. The mode (:meth:`FuzzyMode._recurrent
<numvar.instrument.mode.FuzzyMode>`) takes this path for a signature only after it ran
the layer op by op once and this path reproduced that call bit for bit from the same
stream position (same outputs, strides and number of keys); any other call (training
with autograd, dropout between layers, projections, other dtypes, virtual precisions or
formats, op and module filters) runs op by op. ``USE_KERNEL = False`` keeps every layer
op by op (the reference the tests compare with).

Packed sequences run each step on the rows of the sequences still running
(:func:`_packed_direction`). Single steps (``nn.GRUCell``, ``nn.LSTMCell``,
``nn.RNNCell``: ``torch._VF.gru_cell`` & co, a decoder's loop) run the same step after
their input projection, which RNN.cpp's cells compute after the hidden one for an LSTM
and a plain RNN, before it for a GRU.

The layers are reached through ``torch._VF`` (``lstm``, ``gru``, ``rnn_tanh``,
``rnn_relu`` and their ``_cell`` functions), which ``torch.nn`` calls by attribute:
:class:`patched` sets those attributes for the duration of the fuzzy blocks that are
open (counted, so threads with blocks of their own share it) and the wrapper hands a
call to the fuzzy block of the calling thread, or to PyTorch when there is none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from . import kernels as KN
from . import pointwise as PW
from .flop import flop_backend

#: take the compiled steps (False: every layer op by op, the slow reference)
USE_KERNEL = True

#: torch._VF functions served: name -> gates per cell
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
#: stream keys of one step after its hidden projection
CELL_KEYS = {"lstm": 10, "gru": 10, "rnn_tanh": 2, "rnn_relu": 1}
#: torch._VF single-step functions (``nn.GRUCell`` & co) served: name -> cell
CELLS = {f"{name}_cell": name for name in GATES}

_F32, _F64 = torch.float32, torch.float64
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # no subclasses with behaviour of their own
_ADD, _SUB, _MUL = K.OP_ADD, K.OP_SUB, K.OP_MUL
_aten = torch.ops.aten


# ----------------------------------------------------------------------------- kernels
@njit(inline="always")
def folds_flat(B, H, sa, sb):
    """Whether ``pointwise.plan`` folds a (B, H) op of operands with row strides ``sa``,
    ``sb`` (unit column stride) into (1, 1, B·H) rather than (1, B, H)."""
    return B == 1 or (sa == H and sb == H)


@njit(inline="always", error_model="numpy")
def _binary(op, a, ao, sa, b, bo, sb, o, B, H, key, mode):
    """``o[b·H + h] = RND(a[ao + b·sa + h] op b[bo + b·sb + h])``, a (B, H) result of
    operands with row strides ``sa``, ``sb``, through ``pointwise._binary_ser`` (what
    ``Ctx.add`` & co call) with the fold ``pointwise.plan`` gives those layouts: (1, 1,
    B·H) for contiguous rows (or one row), else (1, B, H). The fold sets the tiles, and
    the tiles which elements take the vectorised loop and which its scalar remainder;
    the two may order a commutative op's operands differently, which shows when both
    are NaNs of opposite signs: so the same tiles, the same bits, NaN signs included
    (the op code and indices as run-time int64, as there: a literal op code compiles
    another specialisation of ``pointwise._tile``, measured to give the other sign)."""
    one, zero = np.int64(1), np.int64(0)
    if folds_flat(B, H, sa, sb):
        n = B * H
        PW._binary_ser(np.int64(op), a[ao:ao + n], (zero, zero, one), b[bo:bo + n],
                       (zero, zero, one), o, one, one, n, key, mode)
    else:
        PW._binary_ser(np.int64(op), a[ao:ao + (B - 1) * sa + H], (zero, sa, one),
                       b[bo:bo + (B - 1) * sb + H], (zero, sb, one), o, one, B, H, key, mode)


@njit(inline="always", error_model="numpy")
def _round(h, o, key, mode):
    """``o = RND(h)`` (element j, ``bits64(key, j)``): ``pointwise._round_ser``, what
    ``pointwise.round32`` runs (same tiles)."""
    PW._round_ser(h, o, key, mode)


@njit(cache=True, error_model="numpy")
def bias_rows(b, mm, key, mode, out):  # pragma: no cover - compiled
    """``out = RND(b + mm)`` for the (B, N) flat product ``mm`` and the bias ``b`` (N,)
    broadcast over its rows (element ``r·N + j``): ``flop.scale_add``'s bias, with the
    fold ``pointwise.plan`` gives it ((1, B, N), or (1, 1, N) for one row)."""
    one, zero = np.int64(1), np.int64(0)
    N = b.size
    B = mm.size // N
    if B == 1:
        PW._binary_ser(np.int64(_ADD), b, (zero, zero, one), mm, (zero, zero, one), out,
                       one, one, N, key, mode)
    else:
        PW._binary_ser(np.int64(_ADD), b, (zero, zero, one), mm, (zero, N, one), out, one,
                       B, N, key, mode)


@njit(cache=True, error_model="numpy")
def gru_gates(hg, ig, keys, B, H, mode, rz, x64):  # pragma: no cover - compiled
    """GRU step, part 1, from the (B, 3H) projections ``hg`` (hidden) and ``ig`` (input):
    ``rz[:BH] = RND(hr + ir)`` (keys[0]), ``rz[BH:] = RND(hz + iz)`` (keys[2]); ``x64``
    = rz as float64, the inputs of torch's float64 sigmoids."""
    n, G = B * H, 3 * H
    _binary(_ADD, hg, 0, G, ig, 0, G, rz[:n], B, H, keys[0], mode)
    _binary(_ADD, hg, H, G, ig, H, G, rz[n:], B, H, keys[2], mode)
    for j in range(2 * n):
        x64[j] = rz[j]


@njit(cache=True, error_model="numpy")
def gru_new(s64, hg, ig, keys, B, H, mode, rz, hn, npre, x64):  # pragma: no cover
    """GRU step, part 2: ``r = RND(σ)`` (keys[1]) and ``z = RND(σ)`` (keys[3]) from
    torch's float64 sigmoids ``s64``, written back into ``hg``'s r and z chunks (as
    ``sigmoid_`` does) and ``rz``; ``hn = RND(hn·r)`` (keys[4]); ``npre = RND(in + hn)``
    (keys[5]); ``x64[:BH]`` = npre as float64, the input of torch's float64 tanh."""
    n, G = B * H, 3 * H
    _round(s64[:n], rz[:n], keys[1], mode)
    _round(s64[n:2 * n], rz[n:], keys[3], mode)
    for r in range(B):
        for c in range(H):
            hg[r * G + c] = rz[r * H + c]
            hg[r * G + H + c] = rz[n + r * H + c]
    _binary(_MUL, hg, 2 * H, G, hg, 0, G, hn, B, H, keys[4], mode)
    _binary(_ADD, ig, 2 * H, G, hn, 0, H, npre, B, H, keys[5], mode)
    for j in range(n):
        x64[j] = npre[j]


@njit(cache=True, error_model="numpy")
def gru_hidden(s64, h, hg, keys, B, H, mode, n32, d, e, out):  # pragma: no cover
    """GRU step, part 3: ``n = RND(tanh)`` (keys[6]) from torch's float64 tanh ``s64``;
    ``d = RND(h − n)`` (keys[7]); ``e = RND(d·z)`` (keys[8], z in ``hg``'s z chunk);
    ``out = RND(e + n)`` (keys[9]), the new hidden state (B, H)."""
    n = B * H
    _round(s64[:n], n32, keys[6], mode)
    _binary(_SUB, h, 0, H, n32, 0, H, d, B, H, keys[7], mode)
    _binary(_MUL, d, 0, H, hg, H, 3 * H, e, B, H, keys[8], mode)
    _binary(_ADD, e, 0, H, n32, 0, H, out, B, H, keys[9], mode)


@njit(cache=True, error_model="numpy")
def lstm_gates(hg, ig, key, B, H, mode, g, x64):  # pragma: no cover - compiled
    """LSTM step, part 1: ``g = RND(hg + ig)`` over the (B, 4H) gates (``key``, element
    ``b·4H + j``); ``x64`` (4, B, H) = the chunks i, f, g, o of g as float64, the inputs
    of torch's float64 sigmoid / tanh."""
    _binary(_ADD, hg, 0, 4 * H, ig, 0, 4 * H, g, B, 4 * H, key, mode)
    n = B * H
    for q in range(4):
        for r in range(B):
            for c in range(H):
                x64[q * n + r * H + c] = g[r * 4 * H + q * H + c]


@njit(cache=True, error_model="numpy")
def lstm_cell(s64, c, keys, B, H, mode, g, a, fc, ig, cout, x64):  # pragma: no cover
    """LSTM step, part 2: the activations ``RND(s64[q])`` (keys[1..4]: σ(i), σ(f),
    tanh(g), σ(o)) into ``a`` and back into the gate chunks of ``g`` (as the in-place
    activations do); ``fc = RND(f·c)`` (keys[5]); ``ig = RND(i·g)`` (keys[6]);
    ``cout = RND(fc + ig)`` (keys[7]), the new cell state; ``x64[:BH]`` = cout as
    float64, the input of torch's float64 tanh."""
    n, G = B * H, 4 * H
    for q in range(4):
        _round(s64[q * n:(q + 1) * n], a[q * n:(q + 1) * n], keys[1 + q], mode)
        for r in range(B):
            for j in range(H):
                g[r * G + q * H + j] = a[q * n + r * H + j]
    _binary(_MUL, g, H, G, c, 0, H, fc, B, H, keys[5], mode)
    _binary(_MUL, g, 0, G, g, 2 * H, G, ig, B, H, keys[6], mode)
    _binary(_ADD, fc, 0, H, ig, 0, H, cout, B, H, keys[7], mode)
    for j in range(n):
        x64[j] = cout[j]


@njit(cache=True, error_model="numpy")
def lstm_hidden(s64, g, keys, B, H, mode, tc, out):  # pragma: no cover - compiled
    """LSTM step, part 3: ``tc = RND(tanh(c'))`` (keys[8]) from torch's float64 tanh;
    ``out = RND(o·tc)`` (keys[9], o in ``g``'s last chunk), the new hidden state."""
    _round(s64[:B * H], tc, keys[8], mode)
    _binary(_MUL, g, 3 * H, 4 * H, tc, 0, H, out, B, H, keys[9], mode)


@njit(cache=True, error_model="numpy")
def rnn_pre(hg, ig, key, mode, pre, x64):  # pragma: no cover - compiled
    """RNN step, part 1: ``pre = RND(hh + ih)`` (``key``; contiguous (B, H) operands);
    ``x64`` = pre as float64."""
    n = pre.size
    _binary(_ADD, hg, 0, n, ig, 0, n, pre, 1, n, key, mode)
    for j in range(n):
        x64[j] = pre[j]


# ------------------------------------------------------------------------------ layers
@dataclass(frozen=True)
class Layer:
    """The arguments of one ``torch._VF`` recurrent call (the unpacked overload)."""

    name: str
    x: torch.Tensor
    h0: torch.Tensor  # (layers × directions, B, H)
    c0: torch.Tensor | None  # the LSTM's cell state, same shape
    params: tuple[torch.Tensor, ...]
    has_biases: bool
    num_layers: int
    bidirectional: bool
    batch_first: bool


@dataclass(frozen=True)
class Packed:
    """The arguments of one ``torch._VF`` recurrent call on a packed sequence."""

    name: str
    data: torch.Tensor  # (N, F): the steps' rows, one after the other
    batch_sizes: tuple[int, ...]  # rows of each step, non-increasing
    h0: torch.Tensor  # (layers × directions, batch_sizes[0], H)
    c0: torch.Tensor | None
    params: tuple[torch.Tensor, ...]
    has_biases: bool
    num_layers: int
    bidirectional: bool


@dataclass(frozen=True)
class Cell:
    """The arguments of one ``torch._VF`` single-step call (``gru_cell`` & co)."""

    name: str  # the cell: "gru", "lstm", "rnn_tanh", "rnn_relu"
    x: torch.Tensor  # (B, F)
    h: torch.Tensor  # (B, H)
    c: torch.Tensor | None
    w_ih: torch.Tensor
    w_hh: torch.Tensor
    b_ih: torch.Tensor | None
    b_hh: torch.Tensor | None


def _plain32(t) -> bool:
    return type(t) in _PLAIN and t.dtype is _F32 and t.device.type == "cpu"


def _states(cell: str, hx):
    """(h, c) of an LSTM's ``hx`` pair, (h, None) of another cell's; (None, None) when
    the LSTM's is not a pair."""
    if cell != "lstm":
        return hx, None
    if isinstance(hx, (list, tuple)) and len(hx) == 2:
        return hx[0], hx[1]
    return None, None


def _needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def parse_cell(name: str, args: tuple) -> Cell | None:
    """The call as a :class:`Cell` (binary32 CPU tensors, a batched input, contiguous
    states, nothing needing gradients), else None."""
    if name not in CELLS or not 4 <= len(args) <= 6:
        return None
    cell = CELLS[name]
    x, hx, w_ih, w_hh, b_ih, b_hh = (*args, None, None)[:6]
    h, c = _states(cell, hx)
    if h is None or (b_ih is None) != (b_hh is None):
        return None
    tensors = [t for t in (x, h, c, w_ih, w_hh, b_ih, b_hh) if t is not None]
    if not all(_plain32(t) for t in tensors) or x.dim() != 2 or h.dim() != 2:
        return None
    B, F = x.shape
    H = h.shape[1]
    G = GATES[cell]
    if (B < 1 or H < 1 or h.shape[0] != B or w_ih.shape != (G * H, F)
            or w_hh.shape != (G * H, H) or _needs_grad(tensors)):
        return None
    if b_ih is not None and (b_ih.shape != (G * H,) or b_hh.shape != (G * H,)):
        return None
    if not h.is_contiguous() or (c is not None and (c.shape != h.shape
                                                    or not c.is_contiguous())):
        return None
    return Cell(cell, x, h, c, w_ih, w_hh, b_ih, b_hh)


def parse(name: str, args: tuple) -> Layer | Packed | Cell | None:
    """The call as a :class:`Layer` (or :class:`Packed` for a packed sequence) when this
    module computes it (binary32 CPU tensors, contiguous initial states, nothing needing
    gradients, no dropout between layers, no projection), or as a :class:`Cell`
    (:func:`parse_cell`), else None."""
    if name in CELLS:
        return parse_cell(name, args)
    if name not in GATES or len(args) != 9:
        return None
    if isinstance(args[3], (list, tuple)):  # (data, batch_sizes, hx, params, ...)
        return _parse_packed(name, args)
    x, hx, params, has_biases, L, dropout, train, bidir, batch_first = args
    if not (isinstance(params, (list, tuple)) and type(has_biases) is bool
            and type(bidir) is bool and type(batch_first) is bool and type(L) is int
            and _plain32(x) and x.dim() == 3):
        return None
    T, B, feats = (x.shape[1], x.shape[0], x.shape[2]) if batch_first else x.shape
    if not _layers_ok(name, x, hx, params, has_biases, L, dropout, train, bidir, 3, T, B,
                      feats):
        return None
    h0, c0 = _states(name, hx)
    return Layer(name, x, h0, c0, tuple(params), has_biases, L, bidir, batch_first)


def _parse_packed(name: str, args: tuple) -> Packed | None:
    data, sizes, hx, params, has_biases, L, dropout, train, bidir = args
    if not (isinstance(params, (list, tuple)) and type(has_biases) is bool
            and type(bidir) is bool and type(L) is int and type(sizes) is torch.Tensor
            and sizes.dtype is torch.int64 and sizes.dim() == 1 and sizes.device.type == "cpu"
            and _plain32(data) and data.dim() == 2):
        return None
    bs = tuple(sizes.tolist())
    if not bs or any(b < 1 for b in bs) or any(a < b for a, b in zip(bs, bs[1:])):
        return None
    if sum(bs) != data.shape[0] or not _layers_ok(name, data, hx, params, has_biases, L,
                                                   dropout, train, bidir, 2, len(bs), bs[0],
                                                   data.shape[1]):
        return None
    h0, c0 = _states(name, hx)
    return Packed(name, data, bs, h0, c0, tuple(params), has_biases, L, bidir)


def _layers_ok(name, x, hx, params, has_biases, L, dropout, train, bidir, xdim, T, B,
               feats) -> bool:
    """The checks of :func:`parse` shared by padded and packed inputs."""
    h0, c0 = _states(name, hx)
    if h0 is None:
        return False
    D = 2 if bidir else 1
    G = GATES[name]
    per = 4 if has_biases else 2
    tensors = (x, h0, *params) + ((c0,) if c0 is not None else ())
    if not all(_plain32(t) for t in tensors) or x.dim() != xdim or L < 1:
        return False
    if _needs_grad(tensors) or (dropout and train and L > 1):
        return False
    H = h0.shape[-1]
    if T < 1 or B < 1 or H < 1 or h0.shape != (L * D, B, H) or len(params) != L * D * per:
        return False
    if c0 is not None and c0.shape != h0.shape:
        return False
    if not h0.is_contiguous() or (c0 is not None and not c0.is_contiguous()):
        return False  # (the steps' elementwise folds assume contiguous states)
    for ld in range(L * D):
        w_ih, w_hh = params[ld * per:ld * per + 2]
        fin = feats if ld < D else D * H
        if w_ih.shape != (G * H, fin) or w_hh.shape != (G * H, H):
            return False
        if has_biases and any(b.shape != (G * H,) for b in params[ld * per + 2:ld * per + 4]):
            return False
    return True


def serves(ctx) -> bool:
    """Whether the fuzzy block's rounding is the one these kernels compute: binary32 at
    24 bits in its own format, through the numba kernels (also flop's contractions)."""
    return (ctx.format is None and ctx._t32 and ctx._numba
            and flop_backend(torch.device("cpu")) == "numba")


Apply = Callable[..., torch.Tensor]


def _linear(apply: Apply, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
    """``at::linear`` of a (T, B, F) input through the mode's handlers: ``addmm`` on the
    (T·B, F) view for a contiguous input with a bias, else ``mm`` (on a contiguous copy)
    and the bias added afterwards (``add_``); of a (B, F) input, ``addmm`` (``mm``
    without a bias)."""
    wt = w.t()
    if x.dim() == 2:  # (a cell's input)
        return apply(_aten.mm.default, x, wt) if b is None else apply(_aten.addmm.default,
                                                                        b, x, wt)
    T, B, F = x.shape
    if b is not None and x.is_contiguous():
        return apply(_aten.addmm.default, b, x.view(T * B, F), wt).view(T, B, -1)
    y = apply(_aten.mm.default, x.reshape(T * B, F), wt)
    if b is not None:
        y = apply(_aten.add.Tensor, y, b)
    return y.view(T, B, -1)


class _Projection:
    """The hidden projection ``addmm(b_hh, h, w_hhᵀ)`` (``mm`` without biases) of every
    step, with the stream keys the mode's handler would draw (:attr:`nkeys`), as that
    handler computes it: at op granularity torch's float64 product rounded once (the
    mode's float64 re-run; the float64 weights converted once per layer), at flop
    ``kernels.contract`` on (1, B, H) @ (1, H, G·H) (``flop.mm``; ``w_hhᵀ`` made
    contiguous once per layer) and then the bias added (``flop.scale_add``: ``b + mm``)."""

    def __init__(self, ctx, w_hh: torch.Tensor, b_hh: torch.Tensor | None):
        self.code = ctx.code
        self.op = ctx.granularity == "op"
        self.contraction = ctx.contraction
        wt = w_hh.t()
        if self.op:
            self.wt64 = wt.to(_F64)
            self.b64 = None if b_hh is None else b_hh.to(_F64)
            self.nkeys = 1
        else:
            self.wt = wt.detach().contiguous().numpy()[None]
            self.b = None if b_hh is None else _flat(b_hh)
            self.nkeys = 1 if b_hh is None else 2

    def __call__(self, h: torch.Tensor, keys: np.ndarray) -> np.ndarray:
        """The (B, G·H) projection of ``h`` (B, H) (or of a cell's input (B, F)), flat."""
        if self.op:
            h64 = h.double()
            p = torch.mm(h64, self.wt64) if self.b64 is None else torch.addmm(
                self.b64, h64, self.wt64)
            out = np.empty(p.numel(), np.float32)
            PW.round32(p.view(-1).numpy(), out, keys[0], self.code)
            return out
        mm = KN.contract(_flat(h).reshape(1, h.shape[0], h.shape[1]), self.wt, keys[0],
                         self.code, 24, self.contraction).reshape(-1)
        if self.b is None:
            return mm
        out = np.empty_like(mm)
        bias_rows(self.b, mm, keys[1], self.code, out)
        return out


def _flat(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(-1).numpy()


class _Steps:
    """The steps of one cell (``name``) on states of up to (B, H): the hidden projection
    (:class:`_Projection`), buffers kept across steps and :meth:`step`."""

    def __init__(self, ctx, name: str, B: int, H: int, w_hh, b_hh):
        self.name, self.B, self.H, self.code = name, B, H, ctx.code
        self.project = _Projection(ctx, w_hh, b_hh)
        self.nkeys = CELL_KEYS[name]
        self._x64 = torch.empty(4 * B * H, dtype=_F64)
        self._s64 = torch.empty(4 * B * H, dtype=_F64)
        self._views: dict[int, tuple] = {}
        self.work = np.empty(12 * B * H, np.float32)

    def _buffers(self, B: int) -> tuple:
        """The float64 buffers as (4, B, H) tensors and flat arrays, for B rows (a packed
        sequence's steps have fewer rows as its sequences end)."""
        v = self._views.get(B)
        if v is None:
            m = 4 * B * self.H
            x64t, s64t = self._x64[:m].view(4, B, self.H), self._s64[:m].view(4, B, self.H)
            v = self._views[B] = (x64t, s64t, x64t.view(-1).numpy(), s64t.view(-1).numpy())
        return v

    def step(self, hg: np.ndarray, ig: np.ndarray, h: torch.Tensor, c: np.ndarray | None,
             keys: np.ndarray, out: np.ndarray, B: int | None = None) -> np.ndarray | None:
        """One step of ``B`` rows (default: all) from the projections ``hg`` (hidden,
        rounded) and ``ig`` (input), flat (B, G·H): the new hidden state into ``out`` (flat
        (B, H)); returns the new cell state of an LSTM (a new array), else None.
        ``keys``: the cell's :data:`CELL_KEYS`."""
        B = self.B if B is None else B
        H, code, work = self.H, self.code, self.work
        x64t, s64t, x64, s64 = self._buffers(B)
        n = B * H
        if self.name == "gru":
            rz, hn, npre = work[:2 * n], work[2 * n:3 * n], work[3 * n:4 * n]
            gru_gates(hg, ig, keys, B, H, code, rz, x64)
            torch.sigmoid(x64t[0], out=s64t[0])
            torch.sigmoid(x64t[1], out=s64t[1])
            gru_new(s64, hg, ig, keys, B, H, code, rz, hn, npre, x64)
            torch.tanh(x64t[0], out=s64t[0])
            gru_hidden(s64, _flat(h), hg, keys, B, H, code, npre, hn, work[4 * n:5 * n], out)
            return None
        if self.name == "lstm":
            g, a = work[:4 * n], work[4 * n:8 * n]
            lstm_gates(hg, ig, keys[0], B, H, code, g, x64)
            torch.sigmoid(x64t[0], out=s64t[0])
            torch.sigmoid(x64t[1], out=s64t[1])
            torch.tanh(x64t[2], out=s64t[2])
            torch.sigmoid(x64t[3], out=s64t[3])
            cnew = np.empty(n, np.float32)
            lstm_cell(s64, c, keys, B, H, code, g, a, work[8 * n:9 * n], work[9 * n:10 * n],
                      cnew, x64)
            torch.tanh(x64t[0], out=s64t[0])
            lstm_hidden(s64, g, keys, B, H, code, work[10 * n:11 * n], out)
            return cnew
        pre = work[:n]
        rnn_pre(hg, ig, keys[0], code, pre, x64)
        if self.name == "rnn_tanh":
            torch.tanh(x64t[0], out=s64t[0])
            PW.round32(s64[:n], out, keys[1], code)
        else:
            out[:] = torch.relu(torch.from_numpy(pre)).numpy()
        return None


def _direction(ctx, name: str, ig: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor | None,
               w_hh, b_hh, reverse: bool):
    """One direction of one layer over the T steps of its input projections ``ig``
    (T, B, G·H): the outputs (T, B, H) and the last hidden (and cell) state. The keys of
    all steps are drawn at once (nothing else draws in between)."""
    T, B, _ = ig.shape
    H = h0.shape[-1]
    steps = _Steps(ctx, name, B, H, w_hh, b_hh)
    P = steps.project.nkeys
    per = P + steps.nkeys
    allkeys = ctx.stream.keys(T * per)
    ign = ig.contiguous().view(T, -1).numpy()
    out = torch.empty((T, B, H), dtype=_F32)
    outn = out.view(T, -1).numpy()
    h = h0
    c = None if c0 is None else _flat(c0)
    for i in range(T):
        t = T - 1 - i if reverse else i
        k = allkeys[i * per:(i + 1) * per]
        c = steps.step(steps.project(h, k[:P]), ign[t], h, c, k[P:], outn[t])
        h = out[t]
    return out, h, None if c is None else torch.from_numpy(c).view(B, H)


def _packed_direction(ctx, name: str, ig: torch.Tensor, sizes: tuple[int, ...],
                      h0: torch.Tensor, c0: torch.Tensor | None, w_hh, b_hh, reverse: bool):
    """One direction of one layer over a packed sequence (RNN.cpp's ``PackedLayer`` /
    ``ReversedPackedLayer``): step t runs the first ``sizes[t]`` rows of the state, the
    rows of sequences that ended (or, in reverse, have not begun) keep theirs, which
    gives the same final state as RNN.cpp's slices and concatenations of it. Returns the
    outputs (N, H), the final hidden (and cell) state (B, H)."""
    T, H = len(sizes), h0.shape[-1]
    steps = _Steps(ctx, name, sizes[0], H, w_hh, b_hh)
    P = steps.project.nkeys
    per = P + steps.nkeys
    allkeys = ctx.stream.keys(T * per)
    G = ig.shape[1]
    ign = ig.contiguous().view(-1).numpy()
    out = torch.empty((ig.shape[0], H), dtype=_F32)
    outn = out.view(-1).numpy()
    state = h0.clone()
    cn = None if c0 is None else _flat(c0).copy()
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
    for i in range(T):
        t = T - 1 - i if reverse else i
        B, r0 = sizes[t], starts[t]
        k = allkeys[i * per:(i + 1) * per]
        h = state[:B]
        c = steps.step(steps.project(h, k[:P]), ign[r0 * G:(r0 + B) * G], h,
                       None if cn is None else cn[:B * H], k[P:],
                       outn[r0 * H:(r0 + B) * H], B)
        state[:B] = out[r0:r0 + B]
        if c is not None:
            cn[:B * H] = c
    return out, state, None if cn is None else torch.from_numpy(cn).view(-1, H)


def _layers(apply: Apply, spec: Layer | Packed, inp: torch.Tensor, direction, dim: int):
    """The layers and directions of ``spec`` from its input ``inp``: each direction's
    input projection (:func:`_linear`) and ``direction(ig, h0, c0, w_hh, b_hh,
    reverse)`` (its outputs and last states), the directions' outputs joined along
    ``dim``. Returns the last layer's outputs and the stacked last states (RNN.cpp's
    order: layer by layer, forward then backward)."""
    D = 2 if spec.bidirectional else 1
    per = 4 if spec.has_biases else 2
    hs = spec.h0.unbind(0)
    cs = spec.c0.unbind(0) if spec.c0 is not None else None
    last_h, last_c = [], []
    for i in range(spec.num_layers):
        outs = []
        for d in range(D):
            ld = i * D + d
            w = spec.params[ld * per:(ld + 1) * per]
            b_ih, b_hh = (w[2], w[3]) if spec.has_biases else (None, None)
            y, h, c = direction(_linear(apply, inp, w[0], b_ih), hs[ld],
                                None if cs is None else cs[ld], w[1], b_hh, d == 1)
            outs.append(y)
            last_h.append(h)
            last_c.append(c)
        inp = outs[0] if D == 1 else torch.cat(outs, dim)
    states = (torch.stack(last_h),) + ((torch.stack(last_c),) if spec.name == "lstm" else ())
    return inp, states


def _run_cell(ctx, cell: Cell):
    """One step of ``gru_cell`` & co. Its input projection is ``at::linear`` of a (B, F)
    input, ``addmm(b_ih, x, w_ihᵀ)`` (``mm`` without biases): the same form as the hidden
    projection (:class:`_Projection`). RNN.cpp's cells project the input first for a GRU,
    the hidden state first for an LSTM and a plain RNN (``linear_hh(h).add_(
    linear_ih(x))``): the keys, all drawn at once, are taken in that order."""
    B, H = cell.h.shape
    steps = _Steps(ctx, cell.name, B, H, cell.w_hh, cell.b_hh)
    inputs = _Projection(ctx, cell.w_ih, cell.b_ih)
    Pi, Ph = inputs.nkeys, steps.project.nkeys
    keys = ctx.stream.keys(Pi + Ph + steps.nkeys)
    if cell.name == "gru":
        ig = inputs(cell.x, keys[:Pi])
        hg = steps.project(cell.h, keys[Pi:Pi + Ph])
    else:
        hg = steps.project(cell.h, keys[:Ph])
        ig = inputs(cell.x, keys[Ph:Ph + Pi])
    out = torch.empty((B, H), dtype=_F32)
    c = steps.step(hg, ig, cell.h, None if cell.c is None else _flat(cell.c),
                   keys[Pi + Ph:], out.view(-1).numpy())
    return out if c is None else (out, torch.from_numpy(c).view(B, H))


def run(ctx, apply: Apply, layer: Layer | Packed | Cell):
    """The ``torch._VF`` call's result, computed step by step in compiled calls with the
    keys and element indices of the op-by-op path (``apply(func, *args)`` runs one aten
    op through the mode's handler, uncounted). Runs with the mode off the stack."""
    if isinstance(layer, Cell):
        return _run_cell(ctx, layer)
    name = layer.name
    if isinstance(layer, Packed):  # (the steps' rows, one after the other: (N, F))
        out, states = _layers(apply, layer, layer.data, lambda ig, *a: _packed_direction(
            ctx, name, ig, layer.batch_sizes, *a), 1)
        return (out, *states)
    x = layer.x.transpose(0, 1) if layer.batch_first else layer.x
    out, states = _layers(apply, layer, x, lambda *a: _direction(ctx, name, *a), 2)
    return (out.transpose(0, 1) if layer.batch_first else out, *states)


def same(a, b) -> bool:
    """Whether two results are the same bits with the same shapes and strides."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride()
                and torch.equal(a.contiguous().view(torch.int32),
                                b.contiguous().view(torch.int32)))
    return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
            and all(same(u, v) for u, v in zip(a, b)))


# ------------------------------------------------------------------- torch._VF routing
_lock = threading.Lock()
_open = 0
_route: Callable | None = None


def _wrapper(name: str, orig):
    def call(*args, **kwargs):
        route = _route
        if route is not None and USE_KERNEL and not kwargs:
            out = route(name, orig, args)
            if out is not NotImplemented:
                return out
        return orig(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__wrapped__ = orig
    return call


_wrappers: dict[str, Callable] = {}  # name -> its routing wrapper, made once


class patched:  # noqa: N801 - used as a function: ``with patched(route): ...``
    """``torch._VF.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` and their ``_cell`` functions
    routed through ``route(name, torch_function, args)`` (its result, or NotImplemented:
    PyTorch runs the call) while any fuzzy block is open; restored when the last one
    closes. (A class, its wrappers made once per process: a fuzzy block enters it on
    every forward.)"""

    __slots__ = ("route",)

    def __init__(self, route: Callable) -> None:
        self.route = route

    def __enter__(self) -> None:
        global _open, _route
        with _lock:
            if _open == 0:
                _route = self.route
                if not _wrappers:
                    for name in (*GATES, *CELLS):
                        _wrappers[name] = _wrapper(
                            name, getattr(torch._C._VariableFunctions, name))
                vf = torch._VF.__dict__
                for name, call in _wrappers.items():
                    vf[name] = call
            _open += 1

    def __exit__(self, *exc) -> None:
        global _open, _route
        with _lock:
            _open -= 1
            if _open == 0:
                vf = torch._VF.__dict__
                for name in _wrappers:
                    vf.pop(name, None)
                _route = None
