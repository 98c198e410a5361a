"""numvar.instrument: every aten op of a PyTorch model through numvar's rounding.

``with numvar.instrument.fuzzy(mode="sr", granularity="flop", seed=0) as fz: ...`` then
``fz.report()``. See :mod:`numvar.instrument.mode` for what is perturbed and how.
"""

from .config import ENV_VARS, GRANULARITIES, MODES, FuzzyConfig
from .mode import Fuzzy, FuzzyMode, FuzzyReport, fuzzy
from .ops import OP_KINDS
from .codepath import reference_path

__all__ = ["fuzzy", "Fuzzy", "FuzzyMode", "FuzzyReport", "FuzzyConfig", "OP_KINDS", "MODES",
           "GRANULARITIES", "ENV_VARS", "reference_path", "ops_table"]


def ops_table() -> list[dict[str, str]]:
    """Every aten op numvar knows and how it is handled at each granularity, and why
    (:func:`numvar.instrument.optable.ops_table`; ``numvar ops`` prints it)."""
    from .optable import ops_table as table  # imported late: ``python -m`` runs that module

    return table()
