"""A dense layer's product and bias at flop granularity in one compiled call.

``aten.addmm(c, a, b)`` with a bias row ``c`` (N,) and α = β = 1 (a linear layer:
``bias + x @ weight.t()``) is, at flop granularity, the product's contraction
(``flop.mm``: one stream key) and then ``Ctx.add(c, product)`` (``flop.scale_add``: the
next key, element ``i·N + j`` of the (M, N) result, binary32's tiles of
:func:`numvar.instrument.pointwise.round_into`). Where the narrow product kernel
computes the product (``kernels.plan32``), :func:`linear32` rounds the bias add of each
row in the same task, right after the row is written (in cache, on numba's threads, no
second pass over the result and no ``Ctx.add`` call): the same keys, indices and
arithmetic, so the same bits. Otherwise :func:`addmm32` runs the product's own kernel
and ``Ctx.add`` as before. Measured (AMD Zen 4, one thread): BERT-tiny's bias adds
through ``Ctx.add``, 25 µs for 128 × 128 and 65 µs for 128 × 512, ran on the calling
thread alone, 10–15 µs of each in the call around the kernel (docs/speed.md, "A linear
layer's weight read as it lies and its bias in its product's call"). ``kernels``
cannot call the pointwise tiles itself (``pointwise`` imports it), hence this module.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from numvar.rounding import kernels as K

from . import kernels as KN
from . import pointwise as PW

#: a linear layer's bias added in its product's compiled call where the narrow kernel
#: computes the product (False: the product, then ``Ctx.add``: the slow reference)
FUSED_BIAS = True


@njit(parallel=True, cache=True, error_model="numpy")
def linear32(a, b, b64, clean, out, key, mode, bias, bkey):  # pragma: no cover - compiled
    """``out = RND(bias + RND(a @ b))``: ``kernels._contract_narrow32``'s product (its
    arguments, ``key``) with each row's bias add rounded in the task that wrote the row,
    as ``Ctx.add(bias, product)`` rounds it (``bkey``, element ``(bo·M + i)·N + j`` of
    the C-order result; ``bias`` (N,) binary32)."""
    BO, M, N = out.shape
    nblk, joined = KN.narrow_split(M)
    ukey = np.uint64(key)
    ubkey = np.uint64(bkey)
    flat = out.reshape(BO * M * N)
    add = np.int64(K.OP_ADD)
    for task in prange(BO * nblk):
        bo, r0, r1 = KN.narrow32_task(a, b, b64, clean, out, ukey, mode, task, nblk, joined)
        product = np.empty(N, np.float32)  # (round_into's output must not alias an input)
        for i in range(r0, r1):
            l0 = (bo * M + i) * N
            row = flat[l0:l0 + N]
            PW.copy_into(product, row)
            PW.round_into(add, bias, product, row, ubkey, l0, mode)


def serves(c, a, b, alpha, beta, ctx) -> bool:
    """:func:`addmm32` computes ``addmm(c, a, b, beta, alpha)``: α = β = 1, binary32 CPU
    operands at 24 bits on the numba backend (no other target format), a (M, K) and b
    (K, N) with M, N, K ≥ 1, ``c`` a contiguous (N,) row, sr, ieee, ud or random,
    contraction ``"separate"``, and a product that ``kernels.contract`` would not give
    its few-outputs kernel (``kernels.few_path``)."""
    if not (FUSED_BIAS and alpha == 1 and beta == 1 and isinstance(c, torch.Tensor)
            and c.dtype is torch.float32 and a.dtype is torch.float32
            and b.dtype is torch.float32 and c.is_cpu and a.is_cpu and b.is_cpu
            and a.dim() == 2 and b.dim() == 2 and c.dim() == 1 and c.is_contiguous()
            and ctx._t32 and ctx._numba and ctx.code <= K.MODE_RANDOM
            and ctx.contraction == "separate"):
        return False
    M, Kd = a.shape
    N = b.shape[1]
    return (c.shape[0] == N and M >= 1 and N >= 1 and Kd >= 1
            and not KN.few_path(M, N, Kd, 1, ctx.code, 24, False))


def addmm32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ctx) -> torch.Tensor:
    """``RND(c + RND(a @ b))`` for the operands :func:`serves` accepts, as ``flop.mm``
    then ``Ctx.add(c, product)`` compute it: the product's key, then the add's, drawn in
    that order; in one compiled call (:func:`linear32`) where the narrow kernel computes
    the product, else its kernel and then ``Ctx.add``."""
    M, Kd = a.shape
    N = b.shape[1]
    code = ctx.code
    an = a.detach().contiguous().numpy().reshape(1, M, Kd)
    bn = b.detach().numpy().reshape(1, Kd, N)  # (a transposed view as it lies)
    key = ctx.stream.next_key()
    out = np.empty((1, M, N), np.float32)
    plan = KN.plan32(an, bn, out.shape, code, 24, False)
    if not plan.narrow:
        KN.run32(an, plan, out, key, code, 24, False)
        return ctx.add(c, torch.from_numpy(out[0]))
    KN.launch(out.size * Kd, linear32, an, plan.b, plan.b64, plan.clean, out, np.uint64(key),
              code, c.detach().numpy(), np.uint64(ctx.stream.next_key()))
    return torch.from_numpy(out[0])
