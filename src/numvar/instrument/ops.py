"""Classification of aten ops: what numvar perturbs, how, and what it never touches.

Names are written ``namespace.packet`` (``aten.mm``); globs given by users match either
that or the full overload name (``aten.mm.default``), see :func:`op_matches`.
"""

from __future__ import annotations

import fnmatch
from functools import lru_cache

# --------------------------------------------------------------------------- kinds
#: Op kinds: kind -> tuple of aten-name globs. Usable as ``include=OP_KINDS["matmul"]``
#: or, by kind name, ``include=("matmul",)``.
OP_KINDS: dict[str, tuple[str, ...]] = {
    "conv": ("aten.convolution", "aten.convolution_backward", "aten._convolution"),
    "matmul": (
        "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten.addbmm", "aten.mv",
        "aten.addmv", "aten.dot", "aten.vdot", "aten._addmm_activation",
    ),
    "softmax": (
        "aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
        "aten._log_softmax_backward_data", "aten._safe_softmax", "aten.logsumexp",
    ),
    "norm": (
        "aten.native_layer_norm", "aten.native_layer_norm_backward", "aten.native_batch_norm",
        "aten.native_batch_norm_backward", "aten._native_batch_norm_legit*",
        "aten.native_group_norm", "aten.native_group_norm_backward", "aten.linalg_vector_norm",
        "aten.norm",
    ),
    "pointwise": (
        "aten.add", "aten.add_", "aten.sub", "aten.sub_", "aten.rsub", "aten.mul", "aten.mul_",
        "aten.div", "aten.div_", "aten.true_divide", "aten.sqrt", "aten.sqrt_", "aten.reciprocal",
        "aten.square", "aten.addcmul", "aten.addcmul_", "aten.addcdiv", "aten.addcdiv_",
        "aten.lerp", "aten.lerp_", "aten.native_dropout", "aten.native_dropout_backward",
        "aten.tanh_backward", "aten.sigmoid_backward", "aten.leaky_relu*", "aten.hardswish*",
        "aten._foreach_*", "prims.div", "prims.mul", "prims.add", "prims.sub", "prims.sqrt",
    ),
    "transcendental": (
        "aten.exp", "aten.exp_", "aten.exp2", "aten.expm1", "aten.log", "aten.log_", "aten.log2",
        "aten.log10", "aten.log1p", "aten.sin", "aten.cos", "aten.tan", "aten.asin", "aten.acos",
        "aten.atan", "aten.atan2", "aten.sinh", "aten.cosh", "aten.tanh", "aten.tanh_",
        "aten.asinh", "aten.acosh", "aten.atanh", "aten.sigmoid", "aten.sigmoid_", "aten.erf",
        "aten.erfc", "aten.erfinv", "aten.gelu", "aten.gelu_backward", "aten.silu",
        "aten.silu_backward", "aten.softplus", "aten.softplus_backward", "aten.elu",
        "aten.elu_backward", "aten.mish", "aten.mish_backward", "aten.logit", "aten.rsqrt",
        "aten.rsqrt_", "aten.pow", "aten.pow_", "aten.xlogy", "aten.hypot", "aten.logaddexp",
        "aten.logaddexp2", "aten.lgamma", "aten.digamma", "aten.sinc", "aten.log_sigmoid_forward",
        "aten.log_sigmoid_backward", "aten.special_*", "prims.exp", "prims.log",
    ),
    "reduction": (
        "aten.sum", "aten.mean", "aten.prod", "aten.cumsum", "aten.cumprod", "aten.var",
        "aten.std", "aten.var_mean", "aten.std_mean", "aten.nansum", "aten.nll_loss_forward",
        "aten.nll_loss_backward", "aten.nll_loss2d_forward", "aten.nll_loss2d_backward",
        "aten.mse_loss", "aten.mse_loss_backward", "aten.binary_cross_entropy*",
        "aten.smooth_l1_loss", "aten.huber_loss", "prims.sum", "prims.var", "prims.prod",
        "aten._adaptive_avg_pool2d", "aten.embedding_dense_backward",
    ),
    # accumulating index ops (numvar.instrument.scatter): sources added (multiplied) into
    # their destinations in increasing source index order
    "scatter": (
        "aten.index_put", "aten.index_put_", "aten._index_put_impl*", "aten._unsafe_index_put",
        "aten.scatter", "aten.scatter_", "aten.scatter_add*", "aten.scatter_reduce*",
        "aten.index_add*", "aten.index_reduce*", "aten.put", "aten.put_",
    ),
}

# ---------------------------------------------------------------- never perturbed
#: Exact ops: data movement, views, copies, indexing, comparisons, random draws, and
#: float operations whose result is exact (max, min, abs, neg, relu, clamp, ...).
EXACT_OPS: frozenset[str] = frozenset(
    "aten." + n
    for n in """
    view _unsafe_view reshape _reshape_alias as_strided as_strided_ t transpose transpose_ permute
    expand expand_as squeeze squeeze_ unsqueeze unsqueeze_ slice select split split_with_sizes
    unbind chunk narrow flatten unflatten movedim alias detach detach_ lift_fresh lift_fresh_copy
    diagonal unfold view_as_real view_as_complex _unsafe_split split_copy slice_copy select_copy
    clone copy_ copy _to_copy to contiguous _copy_from _copy_from_and_resize empty empty_like
    empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like
    new_zeros new_ones new_full scalar_tensor fill fill_ zero_ zero arange linspace eye tril triu
    cat stack index index_select gather masked_fill masked_fill_ masked_scatter
    masked_select where index_copy index_copy_ flip roll
    repeat tile constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d
    replication_pad1d replication_pad2d replication_pad3d embedding take _local_scalar_dense
    item resize_ set_ nonzero sort topk argsort kthvalue max min amax amin maximum minimum fmax
    fmin clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ clip hardtanh hardtanh_
    hardtanh_backward abs abs_ neg neg_ sign sgn relu relu_ threshold threshold_
    threshold_backward floor ceil trunc round frac eq ne lt le gt ge eq_ ne_ lt_ le_ gt_ ge_
    logical_not logical_and logical_or logical_xor bitwise_not bitwise_and bitwise_or
    bitwise_xor isnan isinf isfinite isneginf isposinf signbit argmax argmin
    max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices max_pool2d max_pool1d
    max_pool3d max_unpool2d max_unpool3d any all count_nonzero bernoulli bernoulli_ rand rand_like
    randn randn_like randint randint_like uniform_ normal_ normal exponential_ random_ randperm
    multinomial unique _unique2 unique_consecutive _assert_async _assert_scalar
    _functional_assert_async sym_size sym_stride sym_numel sym_storage_offset is_same_size
    _has_compatible_shallow_copy_type conj resolve_conj resolve_neg _conj _neg_view positive real
    imag _pin_memory record_stream to_dense set_ _version copysign nan_to_num nan_to_num_
    hardshrink softshrink heaviside _to_dense
    channel_shuffle pixel_shuffle pixel_unshuffle native_channel_shuffle im2col
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
    _upsample_nearest_exact2d _upsample_nearest_exact3d fill_diagonal_ diag_embed diag
    block_diag tensor_split hsplit vsplit dsplit swapaxes swapdims mT mH adjoint rot90
    select_backward slice_backward slice_scatter select_scatter diagonal_backward
    diagonal_scatter as_strided_scatter _unsafe_index _unsafe_masked_index
    new_zeros_like stack_ _reshape_copy view_copy expand_copy
    permute_copy transpose_copy t_copy unsqueeze_copy squeeze_copy alias_copy
    max_unpool1d index_fill index_fill_ masked_scatter_ gather_backward
    unsafe_split unsafe_chunk unsafe_split_with_sizes narrow_copy split_with_sizes_copy
    unbind_copy conj_physical conj_physical_ _conj_physical

    """.split()
) | frozenset(
    "prims." + n
    for n in """
    broadcast_in_dim convert_element_type view_of squeeze collapse_view reshape transpose
    split_dim expand_dims slice slice_in_dim as_strided clone copy_to copy_strided empty_strided
    full full_like iota where maximum minimum abs neg eq ne lt le gt ge amax amin
    """.split()
)

#: Pointwise arithmetic that numvar rounds with the rounding core's exact error terms.
ARITHMETIC_OPS = frozenset(
    "aten." + n
    for n in "add sub rsub mul div true_divide sqrt reciprocal square addcmul addcdiv lerp".split()
) | frozenset("prims." + n for n in "add sub mul div sqrt".split())

#: Transcendental (and other non-basic pointwise) functions: at ``flop`` granularity, one
#: rounding of the result computed in float64.
TRANSCENDENTAL_OPS = frozenset(
    p for p in OP_KINDS["transcendental"] if "*" not in p
)

#: Ops decomposed at ``flop`` granularity (torch._decomp), the mode re-entered so that
#: every sub-op is rounded. Explicit, never the whole table: decompositions that draw
#: random numbers (dropout) or that are quadratic (cumsum) are left out on purpose.
DECOMPOSED_OPS: tuple[str, ...] = (
    "aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
    "aten._log_softmax_backward_data", "aten._safe_softmax", "aten.logsumexp",
    "aten.native_layer_norm", "aten.native_layer_norm_backward", "aten.native_batch_norm",
    "aten.native_batch_norm_backward", "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_no_training", "aten._native_batch_norm_legit_functional",
    "aten.native_group_norm", "aten.native_group_norm_backward", "aten.var", "aten.std",
    "aten.var_mean", "aten.std_mean", "aten.linalg_vector_norm", "aten.norm", "aten.mse_loss",
    "aten.mse_loss_backward", "aten.nll_loss_forward", "aten.nll_loss_backward",
    "aten.nll_loss2d_forward", "aten.nll_loss2d_backward", "aten.binary_cross_entropy",
    "aten.binary_cross_entropy_backward", "aten.binary_cross_entropy_with_logits",
    "aten.smooth_l1_loss", "aten.smooth_l1_loss_backward", "aten.huber_loss",
    "aten.huber_loss_backward", "aten.mv", "aten.dot", "aten.vdot", "aten.addmv", "aten.rsub",
    "aten.tanh_backward", "aten.sigmoid_backward", "aten.leaky_relu", "aten.leaky_relu_backward",
    "aten.hardswish", "aten.hardswish_backward", "aten.hardsigmoid", "aten.hardsigmoid_backward",
    "aten.native_dropout_backward", "aten._adaptive_avg_pool2d", "aten.upsample_bilinear2d",
    "aten.max_pool2d_with_indices_backward", "aten.nansum", "aten.glu",
    "aten.glu_backward",
    # resampling and reparametrisation (torch._decomp): coordinates, weights and the
    # weighted sums of gathered values as pointwise ops and reductions
    "aten.grid_sampler_2d", "aten._weight_norm_interface", "aten.upsample_bicubic2d",
    "aten.upsample_trilinear3d", "aten.upsample_linear1d",
    "aten.affine_grid_generator",  # base grid (linspace) times θᵀ: a batched matmul
    # numvar's own (numvar.instrument.decompositions)
    "aten.addbmm", "aten.logcumsumexp", "aten._weight_norm_interface_backward",
    "aten.upsample_linear1d_backward", "aten.upsample_bilinear2d_backward",
    "aten.upsample_trilinear3d_backward", "aten.upsample_bicubic2d_backward",
    "aten.upsample_nearest1d_backward", "aten.upsample_nearest2d_backward",
    "aten.upsample_nearest3d_backward", "aten._upsample_nearest_exact1d_backward",
    "aten._upsample_nearest_exact2d_backward", "aten._upsample_nearest_exact3d_backward",
    "aten.reflection_pad1d_backward", "aten.reflection_pad2d_backward",
    "aten.reflection_pad3d_backward", "aten.replication_pad1d_backward",
    "aten.replication_pad2d_backward", "aten.replication_pad3d_backward",
    "aten._cdist_forward", "aten._cdist_backward", "aten._euclidean_dist",
    "aten._pdist_forward", "aten._pdist_backward",
    "aten.grid_sampler_2d_backward", "aten._ctc_loss", "aten._ctc_loss_backward",
)


def packet_name(func) -> str:
    """``aten.mm`` for ``aten.mm.default``."""
    ns, _, name = func._schema.name.partition("::")
    return f"{ns}.{name}"


def full_name(func) -> str:
    """``aten.mm.default``."""
    return str(func)


def expand_kinds(globs: tuple[str, ...]) -> tuple[str, ...]:
    """Replace op-kind names (``matmul``) by their globs."""
    out: list[str] = []
    for g in globs:
        out.extend(OP_KINDS[g] if g in OP_KINDS else (g,))
    return tuple(out)


@lru_cache(maxsize=4096)
def _match_one(pattern: str, packet: str, full: str) -> bool:
    return fnmatch.fnmatchcase(packet, pattern) or fnmatch.fnmatchcase(full, pattern)


def op_matches(func, globs: tuple[str, ...]) -> bool:
    """True if any glob matches the op's packet name or full overload name."""
    p, f = packet_name(func), full_name(func)
    return any(_match_one(g, p, f) for g in globs)
