"""End to end: locate on real (tiny) networks, through instrument, runner and analysis."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import numvar.runner
from numvar.locate import locate
from numvar.locate.api import realization_bound

BIG = 2.0**14


class Cancel(nn.Module):
    """``(x + 2**14) - 2**14``: the identity in exact arithmetic, ill-conditioned in
    binary32. The add rounds x (|x| ~ 1) on the grid of 2**14, whose ulp is 2**-9, so
    each SR realization moves an element by up to 2**-9: about 15 of its 24 bits are
    lost; IEEE's round-to-nearest is deterministic. The subtraction is exact
    (Sterbenz), so the loss is this layer's own."""

    def forward(self, x):
        return (x + BIG) - BIG


class LeftCancel(nn.Module):
    """:class:`Cancel` on the left half of the last axis only; the right half is copied."""

    def forward(self, x):
        out = x.clone()
        out[..., :4] = (x[..., :4] + BIG) - BIG
        return out


def ill_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), Cancel(), nn.Linear(16, 16),
                         nn.Tanh(), nn.Linear(16, 4)).eval()


def integer_net():
    """Small integer weights and inputs: every intermediate is an integer far below
    2**24, so each op's exact result is a float32: SR never moves it."""
    g = torch.Generator().manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        for lin in (net[0], net[2]):
            lin.weight.copy_(torch.randint(-3, 4, lin.weight.shape, generator=g).float())
            lin.bias.copy_(torch.randint(-3, 4, lin.bias.shape, generator=g).float())
    return net.eval()


@pytest.fixture
def count_runs(monkeypatch):
    """Count realizations actually requested from the runner (and reference runs)."""
    seen = {"realizations": 0, "references": 0, "calls": 0}
    real = numvar.runner.sample

    def counting(fn, *args, n=10, reference=True, **kw):
        seen["calls"] += 1
        seen["realizations"] += n
        seen["references"] += bool(reference)
        return real(fn, *args, n=n, reference=reference, **kw)

    monkeypatch.setattr(numvar.runner, "sample", counting)
    return seen


def test_ill_conditioned_layer_ranked_first_and_isolated(count_runs):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    res = locate(ill_net(), x, n=6, granularity="op", seed=0)
    names = [c.name for c in res.candidates]
    assert names == ["0", "1", "2", "3", "4", "5"]
    assert res.ranked[0].name == "2" and res.candidate("2").cls == "Cancel"
    # Cancel alone loses well over half of the 24 bits. A well-conditioned layer moves
    # the output by about an ulp, which CNH at R = 6 reports as ~3 bits lost (its
    # confidence correction alone is 1/2*log2(5/chi2_{0.025,5}) + log2(1.96) = 2.3 bits)
    assert res.ranked[0].lost > 12
    assert all(r.lost < 6 for r in res.ranked[1:])
    assert res.crosses and res.dd is not None and res.dd.complete
    assert res.dd.minimal == ["2"]
    # propagation: Cancel loses in itself; downstream layers inherit it
    prop = {lr.name: lr for lr in res.layers}
    # (at Cancel's own output an element keeps all its bits when its 6 SR draws agree,
    # probability p^6 + (1-p)^6, 2/7 on average over p: the mean there is ~2/7*24 +
    # 5/7*8 ~ 12.6 digits, a loss of ~11.4; downstream every element mixes 16 of them)
    assert prop["2"].lost_in_layer > 9 and prop["2"].inherited < 2
    assert prop["3"].inherited > 10 and prop["3"].lost_in_layer < 6
    # cost: exactly n per evaluation, one reference, within the documented bound
    assert res.realizations == 6 * res.evaluations == count_runs["realizations"]
    assert res.reference_runs == count_runs["references"] == 1
    assert res.realizations <= res.bound == realization_bound(6, 6)
    assert res.to_dict()["cost"]["realizations"] == res.realizations


def test_by_op_kind_blames_pointwise():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    res = locate(ill_net(), x, n=4, by="op", granularity="op", necessity=False,
                 layers=False)
    assert [c.name for c in res.candidates] == ["matmul", "pointwise", "transcendental"]
    assert res.ranked[0].name == "pointwise"
    assert res.dd is not None and res.dd.minimal == ["pointwise"]
    assert res.realizations == 4 * res.evaluations <= res.bound


def test_exact_integer_network_reports_nothing(count_runs):
    x = torch.randint(-4, 5, (4, 6), generator=torch.Generator().manual_seed(2)).float()
    res = locate(integer_net(), x, n=4, granularity="op")
    assert [c.name for c in res.candidates] == ["0", "2"]     # ReLU is never perturbed
    assert res.digits_all == res.cap == 24.0
    assert not res.crosses and res.dd is None
    assert res.ranked == [] and [r.name for r in res.no_effect] == ["0", "2"]
    d = res.to_dict()
    assert d["crosses"] is False and d["ranking"] == [] and d["ddmin"] is None
    # an explicit threshold below the cap: still nothing crosses
    res2 = locate(integer_net(), x, n=4, granularity="op", threshold=20.0, layers=False)
    assert not res2.crosses and res2.dd is None and res2.ranked == []
    assert count_runs["realizations"] == res.realizations + res2.realizations


def test_cli_table_json_map(tmp_path, capsys):
    from numvar.cli import main

    f = tmp_path / "model.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "class LeftCancel(nn.Module):\n"
        "    def forward(self, x):\n"
        "        out = x.clone()\n"
        "        out[..., :4] = (x[..., :4] + 2.0**14) - 2.0**14\n"
        "        return out\n"
        "def build():\n"
        "    return nn.Sequential(nn.Identity(), LeftCancel())\n")
    out_json, out_png, out_html = tmp_path / "loc.json", tmp_path / "map.png", tmp_path / "l.html"
    # (the default --stat mean: the median element would not vary, half are copies)
    rc = main(["locate", f"{f}:build", "--input-shape", "2,6,8", "-n", "4",
               "--granularity", "op", "--json", str(out_json), "--map", str(out_png),
               "--html", str(out_html)])
    text = capsys.readouterr().out
    assert rc == 0
    row = next(line for line in text.splitlines() if "LeftCancel" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[1] == "1" and cells[2] == "1"                # rank 1, module path "1"
    d = json.loads(out_json.read_text())
    assert d["ranking"][0]["name"] == "1" and d["ddmin"]["set"] == ["1"]
    sp = d["spatial"]
    assert sp["map_shape"] == [6, 8] and sp["worst_pixel"][1] < 4
    # only the left half can vary; an element there keeps all its bits only when its 4
    # SR draws agree (probability p^4 + (1-p)^4, p the rounding probability, 1/5 on
    # average over uniform p): expect ~0.4 of the pixels, 0.5 at most
    assert 0.3 < sp["share_below_cap"] <= 0.5
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = out_html.read_text()
    assert '<section class="numvar-locate">' in page and "LeftCancel" in page
    assert "data:image/png;base64," in page
    assert main(["locate", f"{f}:build", "-n", "4"]) == 2      # no input given
    assert main(["locate", f"{f}:build", "--input-shape", "2,6,8", "--class-dim", "1"]) == 2


class Seg(nn.Module):
    """Two-class logits (B, 2, H, W): class 0 scores 0, class 1 scores LeftCancel(x)."""

    def __init__(self):
        super().__init__()
        self.cancel = LeftCancel()

    def forward(self, x):
        y = self.cancel(x)
        return torch.stack([torch.zeros_like(y), y], dim=1)


def test_spatial_view_of_a_segmentation():
    # |x| ~ 2**-9, the ulp of 2**14: SR moves small scores across 0 (label flips) on the
    # left half only; IEEE rounds them deterministically
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(3)) * 2.0**-9
    res = locate(Seg().eval(), x, n=6, granularity="op", spatial=True, class_dim=1,
                 layers=False, necessity=False)
    assert [c.name for c in res.candidates] == ["cancel"]
    m = res.spatial
    assert m.digits.shape == (6, 8) and m.flips.shape == (6, 8)
    assert (m.digits[:, 4:] == res.cap).all() and (m.flips[:, 4:] == 0).all()
    assert m.digits[:, :4].min() < res.cap / 2 and m.flips[:, :4].max() > 0
    assert res.to_dict()["spatial"]["class_dim"] == 1
    assert "data:image/png;base64," in res.html()


def test_dask_executor_gives_the_local_result():
    """Realizations through the runner's Dask executor (an in-process client here, the
    cheapest cluster): the same seeds give the same digits as the local executor."""
    from distributed import Client

    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    kw = dict(n=2, granularity="op", necessity=False, ddmin=False, layers=False)
    local = locate(model, x, **kw)
    with Client(processes=False, n_workers=1, threads_per_worker=1,
                dashboard_address=None) as client:
        remote = locate(model, x, executor="dask", scheduler=client, **kw)
    assert remote.history == local.history and len(local.history) == 3
    assert remote.realizations == local.realizations == 6 <= remote.bound
