"""Worst-case rounding-error bounds of networks (fp32 and bf16-mixed), set against the
measured error and, from a run directory, the SR standard deviation.

Scalar budgets per layer: :mod:`numvar.bounds.budgets`; composition through a
``torch.fx``-traced network: :func:`network_bounds`.
"""

from .budgets import (
    PRECISIONS,
    U_BF16,
    U_FP32,
    U_FP64,
    AffineError,
    Precision,
    avgpool_budget,
    batchnorm_budget,
    br,
    gain_epsilon,
    get_precision,
    identical_layers,
    layer_budget,
    layer_gain,
    layer_magnitude,
    mixed_budget,
    mixed_gain,
    mixed_magnitude,
    relu_budget,
    residual_add_budget,
)
from .network import LayerBound, NetworkBounds, network_bounds

__all__ = [
    "PRECISIONS", "U_BF16", "U_FP32", "U_FP64", "AffineError", "Precision", "avgpool_budget",
    "batchnorm_budget", "br", "gain_epsilon", "get_precision", "identical_layers",
    "layer_budget", "layer_gain", "layer_magnitude", "mixed_budget", "mixed_gain",
    "mixed_magnitude", "relu_budget", "residual_add_budget", "LayerBound", "NetworkBounds",
    "network_bounds",
]
