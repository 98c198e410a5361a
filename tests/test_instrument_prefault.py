"""numvar.instrument.prefault: a fuzzy block's entry runs torch's float64 ``gelu`` once on
values that switch every branch of its vectorised ``erf`` on, so that the pages of the
constants read by masked loads are present before numvar re-runs ``gelu`` in float64;
NUMVAR_PREFAULT=0 leaves them as they are.

The page check reads ``/proc/self/pagemap`` (the present bit of each page of
``libtorch_cpu.so``) in a fresh process that ran the warm-up and nothing else of numvar's:
after it, torch's float64 ``gelu`` of values spread over every magnitude must fault no
page of that library in. In a fresh process without it, on AVX-512 hosts, the same values
fault in the 64 KB around the constant that ordinary values never load (measured: 16
pages, AMD Zen 4, torch 2.13.0), so the check can fail. (A whole fuzzy entry is not the
place to check it: the ops a first block runs may read that page themselves.)"""

import os
import subprocess
import sys

import pytest
import torch
from _bitwise import same

from numvar.instrument import prefault

_SCRIPT = """
import os, struct, sys, torch, numvar
from numvar.instrument import prefault

def present():
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()
            if len(p) > 5 and p[-1].endswith("/libtorch_cpu.so"):
                a, b = (int(v, 16) for v in p[0].split("-"))
                spans.append((a, b))
    pages = set()
    with open("/proc/self/pagemap", "rb") as pm:
        for a, b in spans:
            pm.seek(a // 4096 * 8)
            data = pm.read((b - a) // 4096 * 8)
            pages.update(a // 4096 + i for i, (e,) in enumerate(struct.iter_unpack("<Q", data))
                         if e >> 63)
    return pages

torch.set_num_threads(1)
how = sys.argv[1]
if how.startswith("fork"):  # the warm-up in this process, the check in a forked child
    assert prefault.fault_in_gelu_constants()
    child = os.fork()
    if child:
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
if how.endswith("warm"):
    assert prefault.fault_in_gelu_constants()
g = torch.Generator().manual_seed(0)
x = torch.randn(65536, generator=g, dtype=torch.float64)
# every magnitude from subnormal to 1e308, both signs, and the special values (all
# built before the first snapshot: building them runs other ops' code)
mag = torch.empty(4096, dtype=torch.float64).uniform_(-320, 308, generator=g)
spread = torch.sign(torch.randn(4096, generator=g, dtype=torch.float64)) * 10.0 ** mag
spread = torch.cat([spread, torch.tensor([0.0, -0.0, float("inf"), -float("inf"),
                                          float("nan"), 1e-20, -1e-20, 5.0] * 8,
                                         dtype=torch.float64)])
for _ in range(3):
    torch.nn.functional.gelu(x)
before = present()
for _ in range(2):
    torch.nn.functional.gelu(spread)
print(len(present() - before), flush=True)
os._exit(0)
"""


def _new_pages(how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != prefault.ENV}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, how], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="reads Linux pagemap")
def test_float64_gelu_faults_no_page_in_after_the_warm_up():
    assert _new_pages("warm") == 0
    left = _new_pages("bare")  # the pages as torch leaves them
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert left > 0  # masked loads left the constant's page absent: the check can fail


@pytest.mark.skipif(not (os.path.exists("/proc/self/pagemap") and hasattr(os, "fork")),
                    reason="reads Linux pagemap in a forked process")
def test_a_forked_process_runs_the_warm_up_again():
    """A realization forked by the runner's zygote: a fork does not copy the page-table
    entries of a file mapping, so the parent's warm-up does not hold in the child."""
    assert _new_pages("fork-warm") == 0
    left = _new_pages("fork-bare")  # the child without its own warm-up
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert left > 0


def test_a_fuzzy_entry_runs_the_warm_up(monkeypatch):
    import numvar

    calls = []
    monkeypatch.setattr(prefault, "fault_in_gelu_constants", lambda: calls.append(1))
    with numvar.fuzzy(mode="sr", seed=0):
        pass
    assert calls == [1]


def test_warm_up_runs_once_and_changes_nothing(monkeypatch):
    w = prefault.warm_input()
    assert w.dtype is torch.float64 and w.numel() % prefault.LANES == 0
    rows = w.view(-1, prefault.LANES)
    alike = (rows == rows[:, :1]) | (rows.isnan() & rows[:, :1].isnan())
    assert bool(alike.all())  # each value fills whole vectors: every lane of a branch on
    assert {float(v) for v in rows[:, 0] if not v.isnan()} >= {0.0, 1e-20, -1e-20, 1.0, -1.0}

    monkeypatch.setattr(prefault, "_done_in", None)  # (as in a process that has not run it)
    ran, gelu = [], torch.nn.functional.gelu
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda x: ran.append(x) or gelu(x))
    rng = torch.get_rng_state()
    assert prefault.fault_in_gelu_constants() is True
    assert prefault.fault_in_gelu_constants() is True
    assert len(ran) == 1 and same(ran[0], w)  # once per process, then a no-op
    assert torch.equal(torch.get_rng_state(), rng)  # no random state drawn
    monkeypatch.setattr(prefault, "_done_in", -1)  # (a parent's: this process forked)
    assert prefault.fault_in_gelu_constants() is True and len(ran) == 2


def test_prefault_is_left_out_when_asked(monkeypatch):
    monkeypatch.setattr(prefault, "_done_in", None)
    monkeypatch.setenv(prefault.ENV, "0")
    assert prefault.fault_in_gelu_constants() is False
    assert prefault._done_in is None
