"""numvar on a CUDA GPU: the Triton flop kernels and whole models, as ratios against
native PyTorch on the same GPU in the same run.

* SR matmul (``numvar.instrument.triton_kernels.contract``, binary32, every product and
  add stochastically rounded) at 1024³ and 4096³: rounded terms per second (M·N·K / time)
  and the slowdown against cuBLAS fp32 with TF32 off.
* Forward passes under ``numvar.fuzzy(mode="sr", granularity="flop")`` against native:
  a ResNet-18-size CNN (batch 8, 3×224×224, built in code) and a BERT-base-size encoder
  (12 layers, d=768, 12 heads, batch 8, 128 tokens, ``nn.TransformerEncoder``).
* One realization of the brain U-Net workload (``numvar.workloads.brain``: the trained
  model and the test slices when nilearn is installed, else the same architecture with
  random weights on random slices of the same size; the output says which).

Times are the best of ``--repeats`` runs after one warm-up (compilation), synchronised.

    python benchmarks/bench_gpu.py [--repeats 3] [--skip-4096] [--models/--no-models]

Needs a CUDA device and triton (``pip install 'numvar[gpu]'``); without a GPU it exits
with status 2 and says so.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _need_gpu() -> None:
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device (torch.cuda.is_available() is False); this "
              "benchmark needs a GPU and measured nothing.", file=sys.stderr)
        sys.exit(2)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench_gpu: triton is not installed (pip install 'numvar[gpu]'); nothing "
              "measured.", file=sys.stderr)
        sys.exit(2)


def best_time(fn, repeats: int) -> float:
    """Best wall time of ``fn()`` over ``repeats`` runs after one warm-up, synchronised."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------ matmul
def bench_matmul(n: int, repeats: int) -> dict:
    from numvar.instrument import triton_kernels as TK
    from numvar.rounding.kernels import MODE_SR

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1, n, n, device="cuda", generator=g)
    b = torch.randn(1, n, n, device="cuda", generator=g)
    native = best_time(lambda: torch.mm(a[0], b[0]), repeats)
    sr = best_time(lambda: TK.contract(a, b, 12345, MODE_SR, 24), repeats)
    return {"n": n, "native_s": native, "sr_s": sr, "terms_per_s": n ** 3 / sr,
            "slowdown": sr / native}


# ------------------------------------------------------------------------ models
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016), built here (torchvision is not a dependency)."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def bert_base_size() -> nn.Module:
    layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
                                       batch_first=True)
    return nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)


def bench_model(name: str, model: nn.Module, x: torch.Tensor, repeats: int) -> dict:
    from numvar.instrument import fuzzy

    model = model.cuda().eval()
    x = x.cuda()

    def native():
        with torch.no_grad():
            model(x)

    def flop_sr():
        with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=1):
            model(x)

    tn = best_time(native, repeats)
    ts = best_time(flop_sr, repeats)
    return {"model": name, "native_s": tn, "flop_sr_s": ts, "slowdown": ts / tn}


def brain_realization(repeats: int) -> dict:
    from numvar.instrument import fuzzy
    from numvar.workloads import brain

    try:
        data = brain.load_data("test")
        model = brain.load_or_train().model
        source = f"trained U-Net, {data.inputs.shape[0]} test slices"
        x = data.inputs
    except Exception as exc:  # nilearn (data) missing: same architecture, random inputs
        torch.manual_seed(0)
        model = brain.build_model()
        x = torch.randn(20, 1, 112, 96)
        source = f"random U-Net on random slices ({type(exc).__name__}: {exc})"
    model = model.cuda().eval()
    x = x.cuda()

    def native():
        brain.infer(model, x)

    def realization():
        with fuzzy(mode="sr", granularity="flop", seed=0):
            brain.infer(model, x)

    tn = best_time(native, repeats)
    ts = best_time(realization, repeats)
    return {"model": "brain U-Net", "source": source, "native_s": tn, "flop_sr_s": ts,
            "slowdown": ts / tn}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-4096", action="store_true", help="only the 1024³ matmul")
    ap.add_argument("--no-models", action="store_true", help="only the matmuls")
    args = ap.parse_args(argv)
    _need_gpu()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("\nSR matmul (binary32, every product and add rounded) vs cuBLAS fp32, TF32 off")
    print(f"{'n':>6} {'cuBLAS s':>10} {'SR s':>10} {'G terms/s':>10} {'slowdown':>9}")
    for n in (1024,) if args.skip_4096 else (1024, 4096):
        r = bench_matmul(n, args.repeats)
        print(f"{n:>6} {r['native_s']:>10.5f} {r['sr_s']:>10.5f} "
              f"{r['terms_per_s'] / 1e9:>10.1f} {r['slowdown']:>8.1f}x")
    if not args.no_models:
        print("\nforward, flop granularity, SR, vs native (fp32, TF32 off)")
        g = torch.Generator().manual_seed(0)
        rows = [
            bench_model("ResNet-18 b8 224²", ResNet18(),
                        torch.randn(8, 3, 224, 224, generator=g), args.repeats),
            bench_model("BERT-base-size b8 L128", bert_base_size(),
                        torch.randn(8, 128, 768, generator=g), args.repeats),
            brain_realization(args.repeats),
        ]
        print(f"{'model':<24} {'native s':>10} {'flop SR s':>10} {'slowdown':>9}")
        for r in rows:
            print(f"{r['model']:<24} {r['native_s']:>10.4f} {r['flop_sr_s']:>10.4f} "
                  f"{r['slowdown']:>8.1f}x")
            if "source" in r:
                print(f"  ({r['source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
