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
# (12 288 pages) allocated, written and freed, 10 times, inside a fuzzy block in a fresh
# process. Mapped on its own, every cycle faults all its pages in afresh; from the heap
# (numvar's default while a block is active, heap.LARGE_BLOCKS_FROM_HEAP), none once the
# heap has settled: torch allocates with 64-byte alignment, and in one process of three
# the freed block was not reused at once (the heap grew by a block, four times in the
# first five cycles; its free runs then merged): ten cycles first, then ten counted (12
# of 12 processes measured 0 faults a cycle). After the block, a 256 MB tensor (larger
# than any free run the heap holds: a 96 MB one still fitted in what the block had freed;
# 65 536 pages) is mapped on its own again: every cycle faults it in.
_LARGE = """
import resource, sys, torch, numvar
from numvar.instrument import heap
heap.LARGE_BLOCKS_FROM_HEAP = sys.argv[1] == "1"
def faults(n, elements):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        x = torch.ones(elements, dtype=torch.float64)  # (torch's allocator, as numvar's
        del x                                          # ops; numpy asks for huge pages)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / n
with numvar.fuzzy(mode="sr", seed=0):
    faults(10, 6 << 20)
    inside = faults(10, 6 << 20)
outside = faults(3, 32 << 20)
print(heap.keep_freed_memory(), inside, outside)
"""


def _run(env_value, script=_SCRIPT, *argv):
    env = {k: v for k, v in os.environ.items() if k != heap.ENV}
    if env_value is not None:
        env[heap.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return (out[0] == "True", *map(float, out[1:]))


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
def test_large_freed_blocks_are_not_faulted_back_in_inside_blocks():
    kept, inside, outside = _run(None, _LARGE, "1")
    assert kept and inside <= 50
    assert outside >= 60_000  # mapped again after the block (the test can fail)
    # mapped on their own (the setting before): every cycle faults the 12 288 pages in
    # again (the test can fail). (NUMVAR_KEEP_FREED_MEMORY=0 maps them too: no settings
    # applied, no heap handle, block_entered does nothing; the next test.)
    kept, inside, _ = _run(None, _LARGE, "0")
    assert kept and inside >= 10_000


def test_large_blocks_from_the_heap_while_any_block_is_active(monkeypatch):
    """The first active fuzzy block sets glibc's count of mapped blocks to 0, the last to
    exit gives it back (MALLOC_MMAP_MAX_ where set), blocks on other threads counted;
    nothing where the settings were not applied or LARGE_BLOCKS_FROM_HEAP is off."""
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(heap, "_libc", Libc())
    monkeypatch.setattr(heap, "_active", 0)
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    heap.block_entered()
    heap.block_entered()  # (a second thread's block)
    heap.block_exited()
    assert calls == [(heap._M_MMAP_MAX, 0)]
    heap.block_exited()
    assert calls == [(heap._M_MMAP_MAX, 0), (heap._M_MMAP_MAX, 65536)]
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "7")
    heap.block_entered()
    heap.block_exited()
    assert calls[-1] == (heap._M_MMAP_MAX, 7)
    calls.clear()
    monkeypatch.setattr(heap, "LARGE_BLOCKS_FROM_HEAP", False)
    heap.block_entered()
    heap.block_exited()
    monkeypatch.setattr(heap, "LARGE_BLOCKS_FROM_HEAP", True)
    monkeypatch.setattr(heap, "_libc", None)
    heap.block_entered()
    heap.block_exited()
    assert calls == []


def test_fuzzy_blocks_enter_and_exit_the_heap_setting(monkeypatch):
    """numvar.fuzzy's entry counts itself active for the heap, its exit (also on an
    error inside the block) not."""
    import numvar

    seen = []
    monkeypatch.setattr(heap, "block_entered", lambda: seen.append("in"))
    monkeypatch.setattr(heap, "block_exited", lambda: seen.append("out"))
    with numvar.fuzzy(mode="sr", seed=0):
        assert seen == ["in"]
    assert seen == ["in", "out"]
    with pytest.raises(RuntimeError, match="inside"), numvar.fuzzy(mode="sr", seed=0):
        raise RuntimeError("an error inside the block")
    assert seen == ["in", "out", "in", "out"]
