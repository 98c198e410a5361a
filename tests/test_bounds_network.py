"""Bounds composed through networks: soundness against float64 (with float64's own error
accounted), the composition rules, refusals, the formalisation's MLP, SR std from runs."""

import json

import pytest
import torch
import torch.nn as nn

from numvar.bounds import budgets as B
from numvar.bounds import network_bounds
from numvar.errors import BoundsError

REL = 1e-12   # float64 evaluation error of the bounds themselves (<= ~n·2^-53, n < 10^4)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return torch.relu(out)


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 6, 3)
        self.pool = nn.MaxPool2d(2)
        self.block = Block(6)
        self.avg = nn.AvgPool2d(2, padding=1, count_include_pad=False)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.stem(x)))
        x = self.block(x)
        x = self.gap(self.avg(x))
        x = x.view(x.size(0), -1)
        return self.fc(self.drop(x))


def resnetish(seed=0):
    torch.manual_seed(seed)
    m = ResNetish()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.3, 2.0)
            with torch.no_grad():
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    return m


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_residual_cnn_sound_against_float64(precision):
    model = resnetish()
    x = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    r = network_bounds(model, x, precision=precision, input_bound=1.0, keep_tensors=True)
    r64 = network_bounds(model, x, precision="fp64", input_bound=1.0, keep_tensors=True)
    kinds = [row.kind for row in r.layers]
    assert kinds == ["conv2d", "relu", "maxpool", "conv2d", "batchnorm", "relu", "conv2d",
                     "batchnorm", "add", "relu", "avgpool", "avgpool", "linear"]
    assert [row.name for row in r.layers] == [row.name for row in r64.layers]
    assert r.layers[0].name == "stem" and r.layers[3].name == "block.conv1"
    for row, row64 in zip(r.layers, r64.layers):
        fp, ref, dd = row.tensors["fp"].double(), row.tensors["ref"], row.tensors["dd"]
        # |computed - exact| <= dd and |float64 - exact| <= dd64, hence:
        assert ((fp - ref).abs() <= dd + row64.tensors["dd"]).all(), row.name
        assert row.measured <= row.data_dependent <= row.apriori * (1 + REL), row.name
        assert row64.measured == 0.0
    assert all(row.measured > 0 for row in r.layers if row.kind in ("conv2d", "linear"))
    assert r.ratio_data_dependent > 1 and r.ratio_apriori >= r.ratio_data_dependent
    if precision == "fp32":   # the walk reproduces the model's own fp32 computation
        with torch.no_grad():
            assert torch.equal(r.tensors["fp"], model.eval()(x))


def test_composition_chain_matches_formulas():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(),
                          nn.Linear(8, 3))
    x = torch.rand(5, 20)
    for prec in ("fp32", "bf16-mixed"):
        r = network_bounds(model, x, precision=prec, input_bound=1.0)
        A, E, G = 1.0, 0.0, 1.0
        inputs_A = []
        for lin in (model[0], model[2], model[4]):
            inputs_A.append(A)
            m, w = lin.in_features, float(lin.weight.detach().abs().max())
            beta = float(lin.bias.detach().abs().max())
            if prec == "fp32":
                E, A, G = (B.layer_budget(m, w, A, E, beta), B.layer_magnitude(m, w, A, beta),
                           G * B.layer_gain(m, w))
            else:
                E, A, G = (B.mixed_budget(m, w, A, E, beta), B.mixed_magnitude(m, w, A, beta),
                           G * B.mixed_gain(m, w))
        assert r.output_apriori == pytest.approx(E, rel=REL)
        assert r.network_gain == pytest.approx(G, rel=REL)
        linear_rows = [row for row in r.layers if row.kind == "linear"]
        assert [row.A for row in linear_rows] == pytest.approx(inputs_A, rel=REL)
        # affine in the input error, with slope the network gain
        r1 = network_bounds(model, x, precision=prec, input_bound=1.0, input_error=1e-3)
        assert (r1.output_apriori - r.output_apriori) / 1e-3 == pytest.approx(G, rel=1e-9)


def test_identical_layers_gain_is_power():
    lin = nn.Linear(8, 8)
    model = nn.Sequential(*[lin] * 5)     # the same layer five times
    r = network_bounds(model, torch.rand(2, 8), input_bound=1.0)
    w = float(lin.weight.detach().abs().max())
    g = B.layer_gain(8, w)
    assert r.network_gain == pytest.approx(g ** 5, rel=REL)
    # closed form with fixed magnitude agrees with the explicit iteration
    off = B.layer_offset(8, w, 1.0)
    E = 0.0
    for _ in range(5):
        E = g * E + off
    assert B.identical_layers(g, off, 5) == pytest.approx(E, rel=REL)


class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(6, 4)
        self.pool = nn.AvgPool1d(2)
        self.bn = nn.BatchNorm1d(1)

    def forward(self, x):
        y = self.a(x) + self.b(x)
        y = self.pool(y.unsqueeze(1))
        return self.bn(y)


def test_add_avgpool_batchnorm_compose():
    torch.manual_seed(4)
    m = TwoBranch()
    m.bn.running_mean.fill_(0.3)
    m.bn.running_var.fill_(0.7)
    with torch.no_grad():
        m.bn.weight.fill_(1.3)
        m.bn.bias.fill_(-0.2)
    x = torch.rand(3, 6)
    r = network_bounds(m, x, input_bound=1.0, keep_tensors=True)
    assert [row.kind for row in r.layers] == ["linear", "linear", "add", "avgpool",
                                              "batchnorm"]
    ra, rb, radd, rpool, rbn = r.layers
    assert radd.apriori == pytest.approx(B.residual_add_budget(
        _mag(m.a), ra.apriori, _mag(m.b), rb.apriori), rel=REL)
    assert rpool.A == pytest.approx(_mag(m.a) + _mag(m.b), rel=REL)
    assert rpool.apriori == pytest.approx(B.avgpool_budget(2, rpool.A, radd.apriori), rel=REL)
    a = 1.3 / (0.7 + m.bn.eps) ** 0.5
    assert rbn.apriori == pytest.approx(B.batchnorm_budget(
        a, 0.3 * a, -0.2, rpool.A, rpool.apriori), rel=1e-6)   # fp32 parameters
    for row in r.layers:
        assert row.measured <= row.data_dependent <= row.apriori * (1 + REL)


def _mag(lin):
    w, b = lin.weight.detach(), lin.bias.detach()
    return B.layer_magnitude(6, float(w.abs().max()), 1.0, float(b.abs().max()))


def test_refuses_unsupported_layers_naming_them():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.GELU()
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return torch.sigmoid(self.norm(self.act(self.fc(x))))

    with pytest.raises(BoundsError) as ei:
        network_bounds(Bad(), torch.rand(2, 4))
    msg = str(ei.value)
    assert "act (GELU)" in msg and "norm (LayerNorm)" in msg and "sigmoid" in msg
    assert "fc" not in msg.split("Supported")[0]

    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(BoundsError, match="cannot trace"):
        network_bounds(Branchy(), torch.rand(2))


def test_input_checks_and_mode_restored():
    m = resnetish()
    m.train()
    x = torch.rand(1, 1, 12, 12) * 2
    with pytest.raises(BoundsError, match="below max"):
        network_bounds(m, x, input_bound=1.0)
    r = network_bounds(m, x)
    assert r.input_bound == pytest.approx(float(x.abs().max()))
    assert m.training
    with pytest.raises(BoundsError, match="float32"):
        network_bounds(nn.Linear(3, 3).double(), torch.rand(1, 3))
    bn = nn.BatchNorm1d(3, track_running_stats=False)
    with pytest.raises(BoundsError, match="running statistics"):
        network_bounds(nn.Sequential(bn), torch.rand(4, 3))


def mlp_784_512_512_10():
    """The formalisation's MLP: He-scaled weights clipped to |W| <= 0.6, one weight per
    layer at 0.6 (as trained networks have), small biases."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                          nn.ReLU(), nn.Linear(512, 10))
    with torch.no_grad():
        for lin in (model[1], model[3], model[5]):
            std = (2.0 / lin.in_features) ** 0.5
            lin.weight.copy_((torch.randn(lin.weight.shape, generator=g) * std).clamp(-0.6, 0.6))
            lin.weight[0, 0] = 0.6
            lin.bias.copy_((torch.rand(lin.bias.shape, generator=g) - 0.5) * 0.1)
    return model


def test_mlp_784_512_512_10_bound_vs_measured():
    model = mlp_784_512_512_10()
    x = torch.rand(128, 1, 28, 28, generator=torch.Generator().manual_seed(1))   # in [0, 1]
    r = network_bounds(model, x, precision="fp32", input_bound=1.0)
    print(f"\n784-512-512-10 MLP, |W| <= 0.6, inputs in [0,1]: a-priori fp32 bound per logit "
          f"{r.output_apriori:.4g}, data-dependent {r.output_data_dependent:.3g}, measured "
          f"drift {r.output_measured:.3g} (formalisation: <= 5100 vs <= 1.6e-5)")
    assert all(row.w == pytest.approx(0.6) for row in r.layers if row.kind == "linear")
    assert 1e3 <= r.output_apriori < 1e4           # "in the thousands"
    assert 0 < r.output_measured < 1e-4            # "~1e-5"
    assert r.output_measured <= r.output_data_dependent < r.output_apriori
    assert r.ratio_apriori > 1e7


def _write_run(path, per_real, reference):
    from numvar.runner.store import RunStore

    store = RunStore.create(path, config={"mode": "sr"}, seeds=list(range(len(per_real))))
    store.save_reference(reference)
    for i, t in enumerate(per_real):
        store.save_realization(i, t)


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(self.act(x)))


def test_sr_std_from_run_directory(tmp_path):
    g = torch.Generator().manual_seed(0)
    R = 4
    caps = {"layers/act#1": torch.rand(R, 2, 4, generator=g),       # 1-based k works too
            "layers/fc#1": torch.rand(R, 2, 4, generator=g) * 3,
            "layers/act#2": torch.rand(R, 2, 4, generator=g) * 5,
            "output": torch.rand(R, 2, 4, generator=g) * 7}
    per_real = [{k: v[i] for k, v in caps.items()} for i in range(R)]
    _write_run(tmp_path / "run", per_real, {k: v[0] for k, v in caps.items()})
    r = network_bounds(Shared(), torch.rand(2, 4), run=tmp_path / "run")
    want = {k: float(v.double().std(0).max()) for k, v in caps.items()}
    assert [row.name for row in r.layers] == ["act", "fc", "act"]
    assert [row.sr_std for row in r.layers] == pytest.approx(
        [want["layers/act#1"], want["layers/fc#1"], want["layers/act#2"]], rel=1e-12)
    assert r.output_sr_std == pytest.approx(want["output"], rel=1e-12)
    assert r.to_dict()["final"]["sr_std"] == pytest.approx(want["output"], rel=1e-12)


def test_layer_capture_names():
    from numvar.bounds.runs import layer_captures

    caps = dict.fromkeys(["layers/a.b#2", "layers/a.b#10", "layers/c", "layers/a.b#1",
                          "output", "modules/000.Linear"])
    assert layer_captures(caps) == {"a.b": ["layers/a.b#1", "layers/a.b#2", "layers/a.b#10"],
                                    "c": ["layers/c"]}


def test_plot_and_json(tmp_path):
    r = network_bounds(resnetish(), torch.rand(2, 1, 12, 12), input_bound=1.0)
    r.plot(tmp_path / "curves.png")
    data = (tmp_path / "curves.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert set(d) == {"precision", "input_shape", "input_bound", "input_error",
                      "network_gain", "layers", "final"}
    assert set(d["layers"][0]) == {"index", "name", "kind", "fan_in", "w", "A", "gain",
                                   "apriori", "data_dependent", "measured", "sr_std", "shape"}
    assert d["layers"][0]["shape"] == [2, 6, 10, 10]
    assert d["final"]["ratio_apriori"] == pytest.approx(r.ratio_apriori)


class TVBasicBlock(nn.Module):
    """torchvision's BasicBlock shape: in-place ReLU, ``out += identity``, downsample."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                         nn.BatchNorm2d(cout)) if stride != 1 or cin != cout
                           else None)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(TVBasicBlock(8, 8, 1), TVBasicBlock(8, 16, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def test_torchvision_style_resnet():
    torch.manual_seed(5)
    model = TinyResNet()
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.3, 0.3)
            mod.running_var.uniform_(0.5, 1.5)
    x = torch.rand(2, 3, 10, 10)
    r = network_bounds(model, x, input_bound=1.0, keep_tensors=True)
    r64 = network_bounds(model, x, precision="fp64", input_bound=1.0, keep_tensors=True)
    names = [row.name for row in r.layers]
    assert "layer1.1.downsample.0" in names and names.count("layer1.0.relu") == 2
    for row, row64 in zip(r.layers, r64.layers):
        fp, ref = row.tensors["fp"].double(), row.tensors["ref"]
        assert ((fp - ref).abs() <= row.tensors["dd"] + row64.tensors["dd"]).all(), row.name
        assert row.data_dependent <= row.apriori * (1 + REL)
    with torch.no_grad():
        assert torch.equal(r.tensors["fp"], model.eval()(x))   # in-place ReLU did no harm


class Halves(nn.Module):
    def forward(self, x):
        return x[:, :64] + x[:, 64:]


@pytest.mark.parametrize("layer,shape", [
    (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (4, 3, 17, 17)),
    (nn.AvgPool2d(2, divisor_override=3), (4, 3, 16, 16)),         # s = 4/3 > 1
    (nn.AdaptiveAvgPool2d((3, 2)), (4, 3, 17, 11)),                 # uneven windows
    (nn.AvgPool1d(3, ceil_mode=True), (4, 3, 50)),
    (Halves(), (256, 128)),
])
def test_pool_and_add_alone_sound_and_not_vacuous(layer, shape):
    """One average pool or add on an exact input (E = 0): every element within its
    per-element bound of float64 (float64's own bound added), the a-priori bound above
    all of them, and real rounding errors present, so a budget without its rounding term
    (only the inherited error, here 0) fails. The add reaches most of its budget u·|x+y|
    (round to nearest: up to u/(1+u))."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    r = network_bounds(layer, x, keep_tensors=True)
    r64 = network_bounds(layer, x, precision="fp64", keep_tensors=True)
    err = (r.tensors["fp"].double() - r.tensors["ref"]).abs()
    assert (err <= r.tensors["dd"] + r64.tensors["dd"]).all()
    assert r.output_data_dependent <= r.output_apriori * (1 + REL)
    assert float(err.max()) > 0
    ratio = float((err / r.tensors["dd"]).max())
    print(f"{type(layer).__name__}: max error / bound {ratio:.3f}")
    if isinstance(layer, Halves):
        assert ratio > 0.9
