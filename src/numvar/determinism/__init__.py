"""numvar.determinism: is a run reproducible bit for bit, and where does it stop being so?

- :class:`BitwiseEquivalenceMode` runs every aten op twice and compares bitwise.
- :class:`HashMode` hashes every op's outputs in call order (strong, order-sensitive).
- :class:`ObserverContext` / :func:`observe` & co. record named values in a reference
  run and verify later runs against it, substituting known non-deterministic values.
- :func:`record_script` / :func:`check_script` run a whole script under HashMode
  (``numvar determinism record|check``).
"""

from ._stack import Frame
from ._tensors import TensorDiff, diff_tensors, hash_tensor, hash_value
from .bitwise import BitwiseEquivalenceMode, Mismatch
from .hashmode import HashMode, OpDivergence, OpRecord, compare_sequences
from .observer import (
    Observation,
    ObservationMismatch,
    Observer,
    ObserverContext,
    ObserverRun,
    current_observer,
    disable_hash_mode,
    enable_hash_mode,
    load_observer_run,
    observe,
    observe_grad,
    observe_non_deterministic,
    observe_non_deterministic_grad,
)
from .script import CheckResult, RecordResult, check_script, record_script

__all__ = [
    "BitwiseEquivalenceMode", "Mismatch", "HashMode", "OpRecord", "OpDivergence",
    "compare_sequences", "hash_tensor", "hash_value", "diff_tensors", "TensorDiff", "Frame",
    "ObserverContext", "Observer", "Observation", "ObservationMismatch", "ObserverRun",
    "load_observer_run", "current_observer", "observe", "observe_grad",
    "observe_non_deterministic", "observe_non_deterministic_grad", "enable_hash_mode",
    "disable_hash_mode", "record_script", "check_script", "RecordResult", "CheckResult",
]
