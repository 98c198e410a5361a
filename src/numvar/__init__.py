"""numvar: how much can you trust the numbers your PyTorch model produces?

Stochastic arithmetic (SR, UD, random rounding) inside any PyTorch model,
realizations and their statistics, bitwise determinism, worst-case bounds.
"""

__version__ = "0.1.0"

from . import errors  # noqa: E402,F401
