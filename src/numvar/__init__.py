"""numvar: how much can you trust the numbers your PyTorch model produces?

Stochastic arithmetic (SR, UD, random rounding) inside any PyTorch model,
realizations and their statistics, bitwise determinism, worst-case bounds.

The top-level names are imported lazily, so ``import numvar`` stays cheap and
``numvar.capture`` costs nothing in a script that is not run by numvar.
"""

import importlib as _importlib

__version__ = "0.1.0"

from . import errors  # noqa: E402,F401

# public name -> (module, attribute)
_EXPORTS = {
    # stochastic arithmetic and instrumentation
    "fuzzy": ("numvar.instrument", "fuzzy"),
    "FuzzyConfig": ("numvar.instrument", "FuzzyConfig"),
    "FuzzyReport": ("numvar.instrument", "FuzzyReport"),
    "OP_KINDS": ("numvar.instrument", "OP_KINDS"),
    "Stream": ("numvar.rounding", "Stream"),
    "Format": ("numvar.rounding", "Format"),
    # realizations
    "sample": ("numvar.runner", "sample"),
    "capture": ("numvar.runner", "capture"),
    "load_run": ("numvar.runner", "load_run"),
    "Samples": ("numvar.runner", "Samples"),
    # analysis
    "analyze": ("numvar.analysis", "analyze"),
    "significant_digits": ("numvar.analysis", "significant_digits"),
    "render_html": ("numvar.analysis", "render_html"),
    # bitwise determinism
    "BitwiseEquivalenceMode": ("numvar.determinism", "BitwiseEquivalenceMode"),
    "HashMode": ("numvar.determinism", "HashMode"),
    "ObserverContext": ("numvar.determinism", "ObserverContext"),
    "observe": ("numvar.determinism", "observe"),
    "observe_grad": ("numvar.determinism", "observe_grad"),
    "observe_non_deterministic": ("numvar.determinism", "observe_non_deterministic"),
    "observe_non_deterministic_grad": ("numvar.determinism", "observe_non_deterministic_grad"),
    # worst-case bounds
    "network_bounds": ("numvar.bounds", "network_bounds"),
}

__all__ = ["__version__", "errors", *_EXPORTS]


def __getattr__(name: str) -> object:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'numvar' has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API only (no helper imports)."""
    return sorted(__all__)
