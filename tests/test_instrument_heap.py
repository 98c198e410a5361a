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


# Large blocks (above glibc's largest mmap threshold, 32 MB): a 48 MB float64 tensor
# (12 288 pages) allocated, written and freed, 10 times, in a fresh process after a fuzzy
# block's entry. Mapped on its own, every cycle faults all its pages in afresh; from the
# heap (numvar's default, heap.LARGE_BLOCKS_FROM_HEAP), none once the heap has settled:
# torch allocates with 64-byte alignment, and in one process of three the freed block
# was not reused at once (the heap grew by a block, four times in the first five cycles;
# its free runs then merged): ten cycles first, then ten counted (12 of 12 processes
# measured 0 faults a cycle).
_LARGE = """
import resource, sys, torch, numvar
from numvar.instrument import heap
heap.LARGE_BLOCKS_FROM_HEAP = sys.argv[1] == "1"
with numvar.fuzzy(mode="sr", seed=0):
    torch.ones(2) + 1
def cycle():
    x = torch.ones(6 << 20, dtype=torch.float64)  # (torch's allocator, as numvar's ops;
    del x                                         # numpy asks large arrays for huge pages)
for _ in range(10):
    cycle()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(heap.keep_freed_memory(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 10)
"""


def _run(env_value, script=_SCRIPT, *argv):
    env = {k: v for k, v in os.environ.items() if k != heap.ENV}
    if env_value is not None:
        env[heap.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True,
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


@pytest.mark.skipif(heap._glibc() is None, reason="malloc settings are glibc's")
def test_large_freed_blocks_are_not_faulted_back_in():
    kept, faults = _run(None, _LARGE, "1")
    assert kept and faults <= 50
    # mapped on their own (the setting before), and malloc as it was: every cycle faults
    # the 12 288 pages in again (the test can fail)
    kept, faults = _run(None, _LARGE, "0")
    assert kept and faults >= 10_000
    kept, faults = _run("0", _LARGE, "1")
    assert not kept and faults >= 10_000
