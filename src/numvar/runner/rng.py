"""The program's random state at the start of every realization.

Realizations must run the same program on the same data, so that only the arithmetic
differs. Besides the code and the inputs, a script's program state includes the global
random generators it may draw from without seeding them (``torch.randn`` in an
unseeded script, ``random.shuffle``, ``np.random.rand``) and Python's string-hash seed
(the iteration order of sets). ``numvar run`` fixes all four once per run, records them
in the manifest (``config["rng"]``) and restores them in every process that runs the
script, right before its first line: the reference and each realization, whether
forked by the zygote, started fresh (``NUMVAR_ZYGOTE=0``), rerun by ``--resume`` or
run on a Dask worker.

- torch: seeded with the seed a fresh interpreter starts with (so a script behaves as
  under plain ``python``);
- Python's :mod:`random` and numpy's legacy global generator (``np.random.*``): seeded
  with ``program_seed`` (a fresh interpreter would draw from the OS; we don't);
- ``PYTHONHASHSEED``: ``hash_seed`` (set in each process's environment; the zygote is
  started with it).

Each state is also recorded as a SHA-256 digest; realizations report the digests of the
states they started from and the runner checks them against the manifest.
``numpy.random.default_rng()`` without a seed draws from the OS and cannot be fixed from
outside: seed it in the script.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

#: torch's default CPU seed in a fresh interpreter (``torch.initial_seed()``)
TORCH_DEFAULT_SEED = 67280421310721
#: seed of Python's and numpy's global generators in every realization
DEFAULT_PROGRAM_SEED = 0
DEFAULT_HASH_SEED = "0"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _python_digest(state: Any) -> str:
    return _sha(repr(state).encode())


def _numpy_digest(state: Any) -> str:
    kind, keys, pos, has_gauss, gauss = state[:5]
    return _sha(f"{kind}|{pos}|{has_gauss}|{gauss!r}|".encode() + keys.tobytes())


def _torch_digest(state: Any) -> str:
    return _sha(bytes(state.numpy().tobytes()))


def spec(program_seed: int = DEFAULT_PROGRAM_SEED, torch_seed: int = TORCH_DEFAULT_SEED,
         hash_seed: str = DEFAULT_HASH_SEED) -> dict[str, Any]:
    """The manifest's ``config["rng"]``: seeds plus the digests of the states they give."""
    import random

    import numpy as np
    import torch

    return {
        "python": {"seed": program_seed,
                   "sha256": _python_digest(random.Random(program_seed).getstate())},
        "numpy": {"seed": program_seed % 2**32,
                  "sha256": _numpy_digest(np.random.RandomState(program_seed % 2**32).get_state())},
        "torch": {"seed": torch_seed,
                  "sha256": _torch_digest(torch.Generator().manual_seed(torch_seed).get_state())},
        "hash_seed": str(hash_seed),
    }


def restore(rng: dict[str, Any]) -> dict[str, str]:
    """Set this process's global generators as ``rng`` (a :func:`spec`) says; return the
    digests of the states now in effect (compare them with the spec's)."""
    import random

    random.seed(rng["python"]["seed"])
    np = sys.modules.get("numpy")
    if np is None:
        import numpy as np
    np.random.seed(rng["numpy"]["seed"])
    import torch

    torch.manual_seed(rng["torch"]["seed"])  # every device's generator
    return current_digests()


def current_digests() -> dict[str, str]:
    """Digests of the current global states (python, numpy, torch)."""
    import random

    import numpy as np
    import torch

    return {"python": _python_digest(random.getstate()),
            "numpy": _numpy_digest(np.random.get_state()),
            "torch": _torch_digest(torch.get_rng_state())}


def mismatch(rng: dict[str, Any], digests: dict[str, str] | None) -> str | None:
    """Which generator started from another state than the manifest's, or None."""
    if not digests:
        return "the realization did not report its random state"
    bad = [k for k in ("python", "numpy", "torch") if digests.get(k) != rng[k]["sha256"]]
    if bad:
        return ("started from another random state than the manifest records "
                f"({', '.join(bad)})")
    return None


class ProcessState:
    """Save and restore this process's global generators (python, numpy, torch CPU).

    ``numvar.sample`` restores the state it found before each realization, so that
    every realization of a function draws the same random numbers (dropout masks,
    sampled inputs), and puts it back when it is done."""

    def __init__(self) -> None:
        import random

        import numpy as np
        import torch

        self.python = random.getstate()
        self.numpy = np.random.get_state()
        self.torch = torch.get_rng_state()

    def restore(self) -> None:
        import random

        import numpy as np
        import torch

        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
