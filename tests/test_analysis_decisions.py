"""Decisions (argmax flips, accuracy) and segmentations (Dice, disagreement, volumes)
on hand-made data whose answers are known exactly."""

import math
import statistics
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

from numvar.analysis import analyze, classify, disagreement_map, label_maps, segment
from numvar.analysis._util import mode_along0
from numvar.errors import AnalysisError
from numvar.runner.store import Samples


def samples_of(caps, ref=None, **kw):
    R = next(iter(caps.values())).shape[0]
    return Samples(captures=caps, reference=ref or {}, indices=list(range(R)),
                   seeds=list(range(R)), **kw)


def test_mode_along0_matches_slow_reference():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, size=(7, 500))
    best, count = mode_along0(a)
    for j in range(a.shape[1]):
        c = Counter(a[:, j].tolist())
        top = max(c.values())
        assert best[j] == min(v for v, n in c.items() if n == top) and count[j] == top


def test_scores_vary_decision_never_flips():
    R, N, C = 8, 30, 5
    g = torch.Generator().manual_seed(0)
    lab = torch.arange(N) % C
    base = torch.zeros(N, C)
    base[torch.arange(N), lab] = 5.0  # margin 5, noise 1e-3: the argmax cannot move
    x = base + 1e-3 * torch.randn(R, N, C, generator=g)
    s = samples_of({"logits": x, "labels": lab.repeat(R, 1)}, {"logits": base, "labels": lab})
    res = analyze(s)
    c = res["classification"]["logits"]
    assert c["flipped_samples"] == 0 and c["flip_rate"] == 0.0 and c["unstable_samples"] == 0
    assert c["agreement_with_ieee"] == 1.0 and c["flip_count_histogram"] == [N] + [0] * R
    assert c["scores_vary"] and c["samples_with_varying_scores"] == N
    assert c["stable_but_varying"] == N and c["decision_never_flips_while_scores_vary"]
    # score_std_mean is the mean of N·C = 150 iid sample stds s (R = 8) of σ = 1e-3 noise:
    # E[s] = c4·σ, sd(s) = σ·sqrt(1 - c4²), so the mean lies within 6·σ·sqrt((1-c4²)/150)
    # of c4·σ (normal tail 2e-9). float32 storage moves each value by <= ulp(5)/2 = 2^-22,
    # hence s by <= sqrt(R/(R-1))·2^-22; the JSON keeps 6 significant figures.
    sigma, m = 1e-3, N * C
    c4 = math.sqrt(2 / (R - 1)) * math.exp(math.lgamma(R / 2) - math.lgamma((R - 1) / 2))
    tol = 6 * sigma * math.sqrt((1 - c4 ** 2) / m) + math.sqrt(R / (R - 1)) * 2.0 ** -22 + 5e-9
    assert abs(c["score_std_mean"] - c4 * sigma) <= tol
    assert c["accuracy"]["per_realization"] == [1.0] * R and c["accuracy"]["std"] == 0.0
    assert c["accuracy"]["ieee"] == 1.0 and c["labels"] == "labels"
    assert c["margin"]["mean_min"] > 4.9 and c["margin"]["z_min"] > 100
    assert any("never flips while the scores vary" in n for n in res["notes"])
    # scores that do not vary at all: nothing to flag
    s2 = samples_of({"logits": base.repeat(R, 1, 1)}, {"logits": base})
    c2 = analyze(s2)["classification"]["logits"]
    assert not c2["scores_vary"] and not c2["decision_never_flips_while_scores_vary"]


def flip_case(ks, R, N_classes=3):
    """Sample i's decision differs from IEEE (class 0) in exactly ks[i] realizations."""
    N = len(ks)
    ref = torch.zeros(N, N_classes)
    ref[:, 0] = 1.0
    x = ref.repeat(R, 1, 1)
    for i, k in enumerate(ks):
        x[:k, i, 1] = 2.0  # realizations 0..k-1 choose class 1
        x[:, i, 2] += torch.linspace(-1e-3, 1e-3, R)  # scores vary everywhere
    return x, ref


def test_flips_in_exactly_k_of_R():
    R, ks = 10, [0, 1, 2, 3, 5, 10, 0]
    N = len(ks)
    x, ref = flip_case(ks, R)
    lab = torch.zeros(N, dtype=torch.int64)
    c = classify(x, ref, lab, name="logits")
    assert [f["k"] for f in c["flipped"]] == [k for k in ks if k]
    assert [f["index"] for f in c["flipped"]] == [i for i, k in enumerate(ks) if k]
    assert c["flipped"][1]["decisions"] == {"0": 8, "1": 2} and c["flipped"][1]["ieee"] == 0
    hist = [0] * (R + 1)
    for k in ks:
        hist[k] += 1
    assert c["flip_count_histogram"] == hist
    assert c["flipped_samples"] == 5 and c["flip_rate"] == round(5 / 7, 6)
    # k = R: every realization agrees with the others (stable) but not with IEEE
    assert c["unstable_samples"] == 4
    assert c["flips_per_realization"] == [sum(k > r for k in ks) for r in range(R)]
    agree = 1 - Fraction(sum(ks), R * N)
    assert abs(c["agreement_with_ieee"] - float(agree)) <= 5e-7
    acc = [Fraction(N - sum(k > r for k in ks), N) for r in range(R)]
    mean = sum(acc) / R
    std = math.sqrt(sum((a - mean) ** 2 for a in acc) / (R - 1))
    a = c["accuracy"]
    assert abs(a["mean"] - float(mean)) <= 5e-7 and abs(a["std"] - std) <= 5e-7
    assert a["min"] == pytest.approx(float(min(acc)), abs=5e-7) and a["ieee"] == 1.0
    assert not c["decision_never_flips_while_scores_vary"]
    # without a reference: against the majority decision of each sample
    cm = classify(x, None, lab)
    maj_k = [k if k <= R / 2 else R - k for k in ks]  # tie at 5 → smallest class (0)
    assert [f["k"] for f in cm["flipped"]] == [k for k in maj_k if k]
    assert cm["against"] == "majority" and cm["agreement_with_ieee"] is None


def test_classification_detection_and_single_sample():
    R = 4
    x = torch.tensor([[0.1, 0.9], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    s = samples_of({"out.probs": x, "other": torch.ones(R, 2)}, {"out.probs": torch.tensor([0.2, 0.8])})
    c = analyze(s)["classification"]
    assert list(c) == ["out.probs"] and c["out.probs"]["flip_count_histogram"] == [0, 1, 0, 0, 0]
    assert analyze(s, task="none")["classification"] == {}
    # one column: probability thresholded at 0.5
    one = classify(torch.tensor([[0.4], [0.6], [0.7]]), torch.tensor([0.7]), name="probs")
    assert one["flipped"][0]["k"] == 1
    with pytest.raises(AnalysisError, match="no capture"):
        analyze(samples_of({"y": torch.ones(R, 2)}), task="classification")


def test_classification_frames_and_mismatched_labels():
    # (R, N, T, C): every (sample, frame) is one decision; frame (1, 2) flips in 2 of 3
    ref = torch.zeros(2, 3, 4)
    ref[..., 0] = 1.0
    x = ref.repeat(3, 1, 1, 1)
    x[:2, 1, 2, 3] = 5.0
    c = classify(x, ref, name="logits")
    assert c["samples"] == 6 and [(f["index"], f["k"]) for f in c["flipped"]] == [(5, 2)]
    # labels that do not fit the scores: noted in auto mode, an error when named
    s = samples_of({"logits": x, "labels": torch.zeros(3, 5, dtype=torch.int64)}, {"logits": ref})
    res = analyze(s)
    assert res["classification"]["logits"]["accuracy"] is None
    assert res["classification"]["logits"]["labels"] is None
    assert any("labels 'labels' not used" in n for n in res["notes"])
    with pytest.raises(AnalysisError, match="labels hold 5 values for 6 samples"):
        analyze(s, labels="labels")


# ---- segmentation: 4x4 maps, label 1 top-left 2x2, label 2 bottom-right 2x2
def seg_case():
    ref = torch.zeros(4, 4, dtype=torch.int64)
    ref[:2, :2] = 1
    ref[2:, 2:] = 2
    maps = ref.repeat(4, 1, 1)
    maps[1, 0, 0] = 0  # label 1 loses a pixel: Dice = 2·3/(3+4) = 6/7
    maps[2, 0, 3] = 2  # label 2 gains a pixel: Dice = 2·4/(5+4) = 8/9
    return maps, ref


def test_segmentation_known_dice_disagreement_volumes():
    maps, ref = seg_case()
    s = segment(maps.numpy(), ref.numpy())
    d1 = [Fraction(1), Fraction(6, 7), Fraction(1), Fraction(1)]
    d2 = [Fraction(1), Fraction(1), Fraction(8, 9), Fraction(1)]
    L1, L2 = s["labels"]["1"], s["labels"]["2"]
    assert set(s["labels"]) == {"1", "2"}  # background 0 left out
    assert L1["dice_per_realization"] == [round(float(v), 6) for v in d1]
    assert abs(L1["dice_mean"] - float(sum(d1) / 4)) <= 5e-7 and L1["dice_min"] == round(6 / 7, 6)
    assert abs(L2["dice_mean"] - float(sum(d2) / 4)) <= 5e-7 and L2["dice_min"] == round(8 / 9, 6)
    assert s["dice_min"] == round(6 / 7, 6)
    assert abs(s["dice_mean"] - float((sum(d1) + sum(d2)) / 8)) <= 5e-7
    # volumes: label 1 [4,3,4,4], label 2 [4,4,5,4]
    assert L1["volume_mean"] == 3.75 and L1["volume_std"] == pytest.approx(statistics.stdev([4, 3, 4, 4]))
    assert L1["volume_cv"] == pytest.approx(0.5 / 3.75, rel=1e-5) and L1["volume_ieee"] == 4
    assert L2["volume_mean"] == 4.25 and L2["volume_std"] == pytest.approx(0.5)
    # disagreement: the two changed pixels disagree in 1 of 4 realizations
    expect = np.zeros((4, 4))
    expect[0, 0] = expect[0, 3] = 0.25
    np.testing.assert_array_equal(disagreement_map(maps.numpy()), expect)
    assert s["disagreement"] == {"voxels": 2, "share": 0.125, "max": 0.25, "mean": 0.03125}


def test_segmentation_from_scores_and_analyze():
    maps, ref = seg_case()
    # logits (R, N=1, C=3, H, W) whose argmax over the class axis is the label map
    onehot = torch.nn.functional.one_hot(maps, 3).permute(0, 3, 1, 2)[:, None].float()
    lm = label_maps(onehot, "logits")
    np.testing.assert_array_equal(lm[:, 0], maps.numpy())
    s = samples_of({"seg.logits": onehot + 0.01, "aseg": maps},
                   {"seg.logits": torch.nn.functional.one_hot(ref, 3).permute(2, 0, 1)[None].float(),
                    "aseg": ref})
    res = analyze(s, task="segmentation")
    assert set(res["segmentation"]) == {"seg.logits", "aseg"}
    a, b = res["segmentation"]["seg.logits"], res["segmentation"]["aseg"]
    assert a["labels"] == b["labels"] and a["disagreement"] == b["disagreement"]
    assert res["classification"] == {}
    # no reference: against the majority map (here the reference itself)
    s2 = segment(maps.numpy(), None)
    assert s2["against"] == "majority" and s2["labels"]["1"]["dice_min"] == round(6 / 7, 6)


def test_segment_matches_slow_reference():
    # the bincount/confusion-matrix path against per-label loops in exact arithmetic
    rng = np.random.default_rng(7)
    maps = rng.integers(0, 4, size=(5, 6, 7))
    ref = rng.integers(0, 5, size=(6, 7))  # label 4 only in the reference
    s = segment(maps, ref)
    for lab in range(1, 5):
        dice = []
        for r in range(5):
            a, b = maps[r] == lab, ref == lab
            den = int(a.sum() + b.sum())
            dice.append(Fraction(2 * int((a & b).sum()), den) if den else Fraction(1))
        L = s["labels"][str(lab)]
        assert L["dice_per_realization"] == [round(float(d), 6) for d in dice]
        assert abs(L["dice_mean"] - float(sum(dice) / 5)) <= 5e-7
        vols = [int((maps[r] == lab).sum()) for r in range(5)]
        assert L["volume_mean"] == pytest.approx(statistics.mean(vols), rel=1e-5)
        assert L["volume_std"] == pytest.approx(statistics.stdev(vols), rel=1e-5)
        assert L["volume_ieee"] == int((ref == lab).sum())
    dis = disagreement_map(maps)
    for i in range(6):
        for j in range(7):
            top = max(Counter(maps[:, i, j].tolist()).values())
            assert dis[i, j] == 1 - top / 5


def test_mismatched_reference_is_ignored_everywhere():
    """A stored reference whose shape does not fit its capture is noted and ignored by
    the digits, the decisions and the segmentation alike (never a numpy traceback)."""
    R = 4
    x, ref = flip_case([0, 2, 0, 4, 1], R)
    s = samples_of({"logits": x}, {"logits": ref[:4]})
    res = analyze(s)
    c = res["classification"]["logits"]
    assert c["against"] == "majority" and c["agreement_with_ieee"] is None
    assert res["captures"]["logits"]["against"] == "mean"
    assert any("logits: reference shape (4, 3) differs" in n for n in res["notes"])
    maps, mref = seg_case()
    seg = analyze(samples_of({"aseg": maps}, {"aseg": mref[:3]}), task="segmentation")
    assert seg["segmentation"]["aseg"]["against"] == "majority"
    assert any("aseg: reference shape (3, 4) differs" in n for n in seg["notes"])
