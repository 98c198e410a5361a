"""In a notebook: analysis results render as HTML, and numvar.sample shows progress."""

from __future__ import annotations

import sys
import types

import torch

from numvar.runner import sampling


def test_no_progress_bar_outside_a_kernel():
    assert sampling.notebook_progress() is None


def test_progress_bar_in_a_jupyter_kernel(monkeypatch):
    class ZMQInteractiveShell:  # the class name IPython's kernel shell has
        pass

    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: ZMQInteractiveShell()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    seen = []
    progress = sampling.notebook_progress()
    assert callable(progress)
    # numvar.sample uses it when no callback is given
    monkeypatch.setattr(sampling, "notebook_progress",
                        lambda: lambda ev, p: (seen.append(ev), progress(ev, p)))
    s = sampling.sample(lambda x: x * 1.5, torch.ones(3), n=2, seed=0)
    assert s.n == 2 and seen == ["total", "done", "done", "done"]


def test_analysis_results_render_as_html():
    from numvar.analysis import analyze, compare

    s = sampling.sample(lambda x: (x * 1.1).sum(), torch.rand(50), n=3, seed=0)
    res = analyze(s)
    page = res._repr_html_()
    assert page.startswith("<iframe srcdoc=") and "numvar report" in page
    assert compare(res, res)._repr_html_().startswith("<iframe srcdoc=")
