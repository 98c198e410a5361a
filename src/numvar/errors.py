"""The one exception hierarchy of numvar.

Every error numvar raises on purpose derives from :class:`NumvarError`, so that
callers (and the CLI) can tell numvar's own diagnostics from bugs.
"""

from __future__ import annotations


class NumvarError(Exception):
    """Base class of every error numvar raises on purpose."""


class ConfigError(NumvarError, ValueError):
    """A bad option, argument or environment variable (the message names it)."""


class RoundingError(NumvarError, ValueError):
    """Bad input to the rounding core (dtype, precision, shapes)."""


class FormatError(RoundingError):
    """A floating-point format that cannot be built, stored or honoured (the message
    says which bound it breaks)."""


class InstrumentError(NumvarError):
    """The instrumentation cannot handle a model or an op as asked."""


class UninstrumentedOpError(InstrumentError):
    """Under ``strict=True``: an op would run natively or below the requested granularity.

    ``op`` is the aten op name (``aten.linear.default``), ``module`` the module path it
    ran in (``""`` outside any module; ``"backward of X"`` in autograd), ``reason`` why
    numvar cannot instrument it as asked.
    """

    def __init__(self, message: str, op: str = "", module: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.op = op
        self.module = module
        self.reason = reason


class StoreError(NumvarError):
    """A run directory or reference file is missing, corrupt or inconsistent."""


class CaptureError(NumvarError):
    """A captured value is unusable: collision, non-numeric, shape/dtype mismatch."""


class RunError(NumvarError):
    """One or more realizations failed (the message lists which)."""


class AnalysisError(NumvarError):
    """The requested analysis does not fit the stored data."""


class NondeterminismError(NumvarError):
    """Two executions of the same op differ bitwise; ``.record`` holds the mismatch."""

    def __init__(self, message: str, record: object | None = None) -> None:
        super().__init__(message)
        self.record = record


class BoundsError(NumvarError):
    """A network contains layers the bound analysis cannot handle (named in the message)."""
