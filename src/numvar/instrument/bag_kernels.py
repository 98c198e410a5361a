"""numba kernel of ``nn.EmbeddingBag``'s sum and mean at flop granularity (binary32 at
24 bits, CPU): the tensor path of ``handlers._embedding_bag`` in one compiled call.

The tensor path gathers the bag rows (``weight[idx]``, an n × d copy), multiplies them by
the per-sample weights (``Ctx.mul``, one stream key), accumulates them into their bags
(``scatter.scatter_accumulate``: int64 positions, a touched mask, one key) and divides
the non-empty bags by their counts (``Ctx.div`` on the compacted rows, one key).
:func:`bag32` walks the kept indices once, reading the table in place, with the same
keys, the same element indices and the same order:

- product of index k's row, column j: ``RND(weight[idx[k], j] · w[k])`` with
  ``bits64(key_mul, k·d + j)`` (the broadcast product's C-order element);
- sum: a bag's first row copied, each later one added, ``RND(out[b, j] + x)`` with
  ``bits64(key_add, k·d + j)`` (the scatter's source element, k increasing);
- mean: the c-th non-empty bag (in bag order) divided by its count,
  ``RND(out[b, j] / count)`` with ``bits64(key_div, c·d + j)``.

Each row goes through ``pointwise.round_into`` (the tile kernel ``Ctx.add``/``mul``/``div``
run on binary32, its scalar fallback where it declines), the same arithmetic as
the tensor path's ``pointwise.binary32`` and the scatter's ``add_f32``. The tensor path
stays the reference (:data:`USE_KERNEL` = False);
``tests/test_instrument_bag_kernels.py`` compares the two bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from ._core import Ctx
from . import pointwise as PW

#: take :func:`bag32` where it applies (False: the tensor path, the reference)
USE_KERNEL = True


#: rows of one bag taken per rounding call by :func:`bag32` (a longer run of a bag is
#: split: the sums are sequential, so the same values); its row buffers hold this many
BAG_ROWS = 64


@njit(cache=True, error_model="numpy")
def bag32(weight, idx, bag, w, key_mul, key_add, key_div, mode, mean, out,
          run):  # pragma: no cover - compiled
    """Bags of rows of ``weight`` (V, d) float32 C-contiguous into ``out`` (B, d) float32
    zeros: index k (``idx[k]`` a valid row, ``bag[k]`` in [0, B)) times ``w[k]`` when
    ``w`` is not empty, summed per bag in k order, divided by the count when ``mean``;
    keys and order of the module docstring.

    The indices are taken in runs of up to ``run`` consecutive k of one bag
    (``nn.EmbeddingBag``'s bags are such runs): a run's rows are gathered, their products
    rounded in one call (their indices k·d + j are consecutive) and added to the bag's
    sum in one call of ``pointwise.accumulate_rows32``. Row by row, the two calls per
    index cost more than the row's 64 roundings (docs/speed.md)."""
    n = idx.size
    d = weight.shape[1]
    nb = out.shape[0]
    has_w = w.size > 0
    ukm = np.uint64(key_mul)
    uka = np.uint64(key_add)
    ukd = np.uint64(key_div)
    rows = np.empty(run * d, np.float32)
    scale = np.empty(run * d, np.float32)
    prod = np.empty(run * d, np.float32)
    count = np.zeros(nb, np.int64)
    k0 = 0
    while k0 < n:
        b = bag[k0]
        k1 = k0 + 1
        while k1 < n and bag[k1] == b and k1 - k0 < run:
            k1 += 1
        m = (k1 - k0) * d
        for r in range(k1 - k0):
            PW.copy_into(rows[r * d:(r + 1) * d], weight[idx[k0 + r]])
        x = rows[:m]
        if has_w:
            for r in range(k1 - k0):
                PW.fill(scale[r * d:(r + 1) * d], w[k0 + r])
            PW.round_into(K.OP_MUL, rows[:m], scale[:m], prod[:m], ukm, k0 * d, mode)
            x = prod[:m]
        first = 0
        if count[b] == 0:
            PW.copy_into(out[b], x[:d])
            first = 1
        if k1 - k0 > first:
            PW.accumulate_rows32(x[first * d:].reshape((k1 - k0 - first, d)), out[b], uka,
                                 (k0 + first) * d, mode)
        count[b] += k1 - k0
        k0 = k1
    if mean:
        c = 0
        for b in range(nb):
            if count[b] > 0:
                PW.fill(scale[:d], np.float32(count[b]))
                PW.round_into(K.OP_DIV, out[b], scale[:d], prod[:d], ukd, c * d, mode)
                PW.copy_into(out[b], prod[:d])
                c += 1


def accepts(ctx: Ctx, weight: torch.Tensor, psw: torch.Tensor | None) -> bool:
    """:func:`bag32` applies: binary32 CPU table at 24 bits, numba allowed, no format."""
    return (USE_KERNEL and weight.dtype is torch.float32 and ctx._t32 and ctx._numba
            and weight.is_cpu and ctx.target(torch.float32) is None
            and (psw is None or psw.is_cpu))


def embedding_bag32(ctx: Ctx, weight: torch.Tensor, idx: torch.Tensor, bag: torch.Tensor,
                    nbags: int, psw: torch.Tensor | None, mean: bool) -> torch.Tensor:
    """The (nbags, d) float32 sums (means) of the kept indices ``idx`` (int64, CPU) into
    ``bag`` (int64, in [0, nbags)), times the kept per-sample weights ``psw``; draws the
    keys the tensor path draws, in its order (product, accumulation, division)."""
    key_mul = ctx.stream.next_key() if psw is not None else 0
    key_add = ctx.stream.next_key()
    key_div = ctx.stream.next_key() if mean else 0
    out = torch.zeros(nbags, weight.shape[1], dtype=torch.float32)
    w = (psw.detach().reshape(-1).to(torch.float32).contiguous().numpy() if psw is not None
         else np.empty(0, np.float32))
    bag32(weight.detach().contiguous().numpy(), idx.contiguous().numpy(),
          bag.contiguous().numpy(), w, np.uint64(key_mul), np.uint64(key_add),
          np.uint64(key_div), ctx.code, mean, out.numpy(), BAG_ROWS)
    return out
