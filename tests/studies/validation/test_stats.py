"""Agreement statistics of the validation study."""

import math

import matplotlib
import numpy as np
import pytest
import torch

from captum_iglens import IGLensResult
from captum_iglens.studies.validation import stats

matplotlib.use("Agg")

FP32_TOL = 1e-6


# ------------------------------------------------------------------ statistics


def test_spearman_hand_computed():
    # No ties: 1 − 6·Σd² / (n(n² − 1)) = 1 − 6·2/60.
    assert stats.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 · 5).
    assert stats.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        3 / math.sqrt(10)
    )
    # Invariant under monotone maps.
    assert stats.spearman([0.1, 5, 2], [1, 100, 7]) == pytest.approx(1.0)


def test_spearman_undefined_for_constant_vectors():
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(stats.spearman([1, 2, 3], [0, 0, 0]))
    with pytest.raises(ValueError, match="one value per layer"):
        stats.spearman([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        stats.spearman([1, np.nan], [1, 2])


def test_top_k_hit_with_ties():
    drop = np.array([0.0, 0.9, 0.1, 0.2])
    assert stats.top_k_hit([0, 5, 1, 2], drop, 1) == 1.0
    assert stats.top_k_hit([5, 0, 1, 2], drop, 1) == 0.0
    assert stats.top_k_hit([5, 0, 1, 2], drop, 3) == 0.0
    assert stats.top_k_hit([5, 1, 0, 2], drop, 3) == 1.0
    # A constant score earns the chance rate: k / n.
    assert stats.top_k_hit([0, 0, 0, 0], drop, 1) == 0.25
    assert stats.top_k_hit([0, 0, 0, 0], drop, 3) == 0.75
    # Two layers tie for the top score, one of them the peak: half a hit.
    assert stats.top_k_hit([3, 3, 1, 0], drop, 1) == 0.5
    assert stats.top_k_hit([3, 3, 1, 0], drop, 3) == 1.0
    # Tied ablation peaks (layers 0 and 1): averaged over them.
    tied = np.array([5.0, 5.0, 0.0, 0.0])
    assert stats.top_k_hit([1, 0, 2, 3], tied, 1) == 0.0
    assert stats.top_k_hit([1, 0, 2, 3], tied, 3) == 0.5
    with pytest.raises(ValueError, match="k:"):
        stats.top_k_hit([1, 2], [1, 2], 0)


def test_peak_and_onset_distances():
    assert stats.peak_distance([0, 1, 5, 2], [4, 0, 0, 0]) == 2.0
    # Tied score maxima at 0 and 2, drop peak at 3: mean(|0 − 3|, |2 − 3|).
    assert stats.peak_distance([3, 1, 3, 0], [0, 0, 0, 1]) == 2.0
    # |score| cumulative: .1 .4 .8 1.0 → half the mass at layer 2.
    score = np.array([0.1, -0.3, 0.4, 0.2])
    assert stats.onset_index(score) == 2
    assert stats.onset_index(score, 0.1) == 0
    assert stats.onset_index(score, 1.0) == 3
    assert stats.onset_index(np.zeros(3)) == -1
    assert stats.onset_distance(score, [1, 0, 0, 0]) == 2.0
    assert math.isnan(stats.onset_distance(np.zeros(4), [1, 0, 0, 0]))


def test_onset_rule_matches_the_result_onset():
    torch.manual_seed(0)
    attributions = torch.randn(3, 4, 7)
    attributions[0, 1] = 0
    result = IGLensResult(
        attributions=attributions,
        levels=torch.full((3, 4, 7), 0.5),
        base_prob=torch.zeros(3, 4),
        model_prob=torch.zeros(3, 4),
        delta=attributions.sum(-1),
        targets=torch.zeros(3, 4, dtype=torch.long),
        positions=torch.arange(4),
        mask=torch.ones(3, 4, dtype=torch.bool),
        layer_names=[str(i) for i in range(7)],
        method="prediction_aware",
        n_steps=1,
    )
    for frac in (0.25, 0.5, 0.9):
        expected = result.onset(frac)
        ours = [
            [stats.onset_index(a.numpy(), frac) for a in row] for row in attributions
        ]
        assert ours == expected.tolist()


def test_nonmonotone_depth():
    assert stats.nonmonotone_depth([0.0, 0.2, 0.5, 0.9]) == 0.0
    assert stats.nonmonotone_depth([0.9, 0.5, 0.1]) == 0.0
    # Rises by 0.6 to 0.7, then falls by 0.4 to 0.3: depth min(0.6, 0.4).
    assert stats.nonmonotone_depth([0.1, 0.7, 0.3, 0.9]) == pytest.approx(0.4)
    assert stats.nonmonotone_depth([0.0, 0.3, 0.25, 0.8]) == pytest.approx(0.05)


def test_bootstrap_mean():
    constant = stats.bootstrap_mean(np.full(5, 0.3), 50)
    assert constant == dict(
        mean=pytest.approx(0.3),
        lo=pytest.approx(0.3),
        hi=pytest.approx(0.3),
        n=5,
        n_undefined=0,
    )
    values = np.array([np.nan, 0.0, 1.0, np.nan, 1.0, 0.0])
    out = stats.bootstrap_mean(values, 400, seed=3)
    assert (out["n"], out["n_undefined"], out["mean"]) == (4, 2, 0.5)
    assert 0.0 <= out["lo"] < 0.5 < out["hi"] <= 1.0
    assert stats.bootstrap_mean(values, 400, seed=3) == out
    empty = stats.bootstrap_mean(np.array([np.nan]), 10)
    assert empty["n"] == 0 and math.isnan(empty["mean"])
    with pytest.raises(ValueError, match="n_bootstrap"):
        stats.bootstrap_mean(values, 0)
    with pytest.raises(ValueError, match="level"):
        stats.bootstrap_mean(values, 10, level=1.0)
    # One defined value: every resample is that value (scipy needs two rows).
    single = stats.bootstrap_mean(np.array([0.7, np.nan]), 10)
    assert (single["mean"], single["lo"], single["hi"]) == (0.7, 0.7, 0.7)


def test_bootstrap_interval_is_bca_not_percentile():
    # A skewed sample: BCa shifts the interval relative to the percentile one.
    # The percentile interval of 2000 resamples drawn here is what the
    # hand-written bootstrap returned.
    values = np.array([0.0] * 15 + [0.1, 0.2, 0.5, 3.0, 9.0])
    out = stats.bootstrap_mean(values, 2000, seed=5)
    rng = np.random.default_rng(5)
    means = values[rng.integers(0, values.size, (2000, values.size))].mean(axis=1)
    lo_pct, hi_pct = np.percentile(means, [2.5, 97.5])
    assert out["lo"] <= out["mean"] <= out["hi"]
    # Right-skewed: BCa moves both ends up, away from the percentile ends.
    assert out["lo"] > lo_pct + 1e-3 and out["hi"] > hi_pct + 1e-3


def test_median_of_tied_integers_has_a_percentile_interval():
    """BCa is undefined when no resample falls below the statistic (most onset
    differences equal the median): the percentile interval of the same
    resamples is given, not NaN."""
    # |onset - causal onset| of DLA on SmolLM2 (noise, 172 tokens): value, count.
    counts = {0: 37, 1: 30, 2: 20, 3: 24, 4: 28, 5: 5, 6: 2, 7: 5, 8: 4, 9: 5}
    counts |= {10: 2, 11: 4, 13: 2, 14: 1, 16: 1, 17: 1, 19: 1}
    values = np.repeat(np.array(list(counts), float), list(counts.values()))
    out = stats.bootstrap_statistic((values,), np.median, 1000, seed=0)
    assert out["mean"] == 2.0
    assert math.isfinite(out["lo"]) and math.isfinite(out["hi"])
    assert out["lo"] <= 2.0 <= out["hi"]


def test_summarize_leaves_out_tokens_a_method_did_not_run_on():
    values = {"a": {"top1": np.array([1.0, 0.0, np.nan, 1.0])}}
    groups = {"all": np.ones(4, bool), "first": np.array([1, 1, 0, 0], bool)}
    computed = {"a": np.array([1, 1, 1, 0], bool)}
    out = stats.summarize(values, groups, computed, 20)
    assert (
        out["all"]["a"]["top1"]["n"] == 2
        and out["all"]["a"]["top1"]["n_undefined"] == 1
    )
    assert out["first"]["a"]["top1"]["mean"] == 0.5
