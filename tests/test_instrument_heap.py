"""numvar.instrument.heap: a fuzzy block's entry sets glibc's malloc to keep freed memory,
so that buffers freed together are not returned to the system and faulted back in at
the next allocation; NUMVAR_KEEP_FREED_MEMORY=0 leaves malloc alone."""

import os
import subprocess
import sys

import pytest

from numvar.instrument import heap

# A layer's pattern in miniature, in a fresh process after a fuzzy block's entry: four
# 1 MB buffers allocated, then freed together, 20 times. Under glibc's defaults the first
# free raises the mmap threshold to 1 MB (and the trim threshold to 2 MB), so the 4 MB
# freed at the top of the heap are trimmed every time and faulted back in: 992 minor
# faults per cycle measured (4 MB is 1 024 pages). Kept, none.
_SCRIPT = """
import resource, numpy as np, torch, numvar
from numvar.instrument import heap
with numvar.fuzzy(mode="sr", seed=0):
    torch.ones(2) + 1
def cycle():
    xs = [np.ones(1 << 17) for _ in range(4)]
    del xs
for _ in range(5):
    cycle()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    cycle()
print(heap.keep_freed_memory(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 20)
"""


def _run(env_value):
    env = {k: v for k, v in os.environ.items() if k != heap.ENV}
    if env_value is not None:
        env[heap.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(heap._glibc() is None, reason="malloc settings are glibc's")
def test_freed_buffers_are_not_faulted_back_in():
    kept, faults = _run(None)
    assert kept and faults <= 20
    kept, faults = _run("0")  # malloc as it was: the pattern faults (the test can fail)
    assert not kept and faults >= 500


@pytest.mark.skipif(heap._glibc() is None, reason="malloc settings are glibc's")
def test_keep_freed_memory_is_set_once():
    first = heap.keep_freed_memory()
    assert first is (os.environ.get(heap.ENV, "1").strip() != "0")
    assert heap.keep_freed_memory() is first  # the answer of the first call, not a retry
