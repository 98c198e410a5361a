"""Locate the source of numerical instability: which modules and op kinds cost digits.

``locate(model, x)`` perturbs one module (or op kind) at a time, everything else IEEE,
and ranks them by the significant digits lost at the output; it also measures each
one's necessity (everything perturbed but it), runs delta debugging (ddmin) for a
minimal set breaking a digits threshold, separates precision lost in each layer from
precision inherited, and maps where an image output varies. The algorithms
(:mod:`numvar.locate.core`) take any ``evaluate(subset) -> Measurement``.
"""

from .api import LocateResult, locate, realization_bound
from .core import (
    DDResult,
    Evaluator,
    LayerRow,
    Measurement,
    Row,
    ddmin,
    ddmin_bound,
    default_threshold,
    propagation,
    rank,
    run_ddmin,
    sensitivity,
)
from .discover import Candidate, discover
from .report import html_page, html_section, renderables
from .saved import load_locate, locate_sections, read_png
from .spatial import SpatialMap, render_png, spatial_map

__all__ = [
    "Candidate", "DDResult", "Evaluator", "LayerRow", "LocateResult", "Measurement", "Row",
    "SpatialMap", "ddmin", "ddmin_bound", "default_threshold", "discover", "html_page",
    "html_section", "load_locate", "locate", "locate_sections", "propagation", "rank", "read_png", "realization_bound", "render_png",
    "renderables", "run_ddmin", "sensitivity", "spatial_map",
]
