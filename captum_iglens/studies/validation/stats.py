r"""
Agreement statistics between a per-layer score and per-layer ablation drops, for
one token at a time, and their bootstrap aggregation over tokens.

Ranks, Spearman correlations and bootstrap intervals come from
:mod:`scipy.stats` (``spearmanr``, ``bootstrap`` with bias-corrected and
accelerated, BCa, intervals); what is written here is what scipy does not have:
the argument checks, the agreement metrics of a per-layer score, and the handling
of undefined values and degenerate resamples. Ties are handled explicitly: ranks
are averaged, and "the argmax layer" of a vector with tied maxima is taken
uniformly at random among them, so every rate and distance is its expectation over
that choice (a constant score earns exactly the chance rate).
"""

import warnings
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch
from scipy import stats as scipy_stats

from captum_iglens.onset import DEFAULT_ONSET_RULE, onset_layers


def _vector(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-D array, got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: expected finite values, got {array.tolist()}")
    return array


def _pair(score: np.ndarray, drop: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    score, drop = _vector(score, "score"), _vector(drop, "drop")
    if score.shape != drop.shape:
        raise ValueError(
            f"score, drop: expected one value per layer each, got {score.size} and "
            f"{drop.size}"
        )
    return score, drop


def spearman(score: np.ndarray, drop: np.ndarray) -> float:
    r"""
    Spearman's rank correlation (:func:`scipy.stats.spearmanr`, average ranks
    for ties) of two checked per-layer vectors.

    Args:

        score (np.ndarray): ``k`` per-layer scores.
        drop (np.ndarray): ``k`` per-layer ablation drops.

    Returns:
        *float* in ``[-1, 1]``, or NaN when either vector is constant (the
        correlation is undefined there; scipy's warning is not raised).
    """
    score, drop = _pair(score, drop)
    if score.size < 2 or np.ptp(score) == 0 or np.ptp(drop) == 0:
        return float("nan")
    return float(scipy_stats.spearmanr(score, drop).statistic)


def _maxima(values: np.ndarray) -> np.ndarray:
    return np.flatnonzero(values == values.max())


def top_k_hit(score: np.ndarray, drop: np.ndarray, k: int) -> float:
    r"""
    Whether the layer where ablation hurts most is among the ``k`` layers with
    the highest score. With ``k = 1``: whether the score's argmax layer is the
    ablation's argmax layer.

    Ties are broken uniformly at random, and the expected hit is returned: for a
    peak layer ``m`` with ``g`` layers scored strictly higher and ``e`` layers
    (``m`` included) scored equally, ``m`` is in the top ``k`` with probability
    ``clip((k - g) / e, 0, 1)``; this is averaged over the tied peak layers.

    Args:

        score (np.ndarray): ``k`` per-layer scores (higher: more important).
        drop (np.ndarray): Per-layer ablation drops (higher: hurts more).
        k (int): How many top-scored layers count as a hit, ``>= 1``.

    Returns:
        *float* in ``[0, 1]``.
    """
    score, drop = _pair(score, drop)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k!r}")
    hits = []
    for m in _maxima(drop):
        higher = int((score > score[m]).sum())
        equal = int((score == score[m]).sum())
        hits.append(min(max((k - higher) / equal, 0.0), 1.0))
    return float(np.mean(hits))


def peak_distance(score: np.ndarray, drop: np.ndarray) -> float:
    r"""
    ``|argmax score − argmax drop|`` in layers, averaged over tied maxima of
    either vector.

    Args:

        score (np.ndarray): ``k`` per-layer scores.
        drop (np.ndarray): ``k`` per-layer ablation drops.

    Returns:
        *float*, ``>= 0``.
    """
    score, drop = _pair(score, drop)
    return float(np.abs(_maxima(score)[:, None] - _maxima(drop)[None, :]).mean())


def onset_index(
    score: np.ndarray, frac: float = 0.5, rule: str = DEFAULT_ONSET_RULE
) -> int:
    r"""
    The onset rule ``rule`` of :meth:`captum_iglens.IGLensResult.onset` on any
    per-layer score (:func:`captum_iglens.onset.onset_layers`): by default the
    earliest layer at which the cumulative ``|score|`` reaches ``frac`` of the
    total ``|score|``.

    Args:

        score (np.ndarray): ``k`` per-layer scores.
        frac (float, optional): Fraction of the mass of the cumulative rules,
                    in ``(0, 1]``. Default: 0.5.
        rule (str, optional): ``"abs"``, ``"positive"`` or ``"argmax"``.
                    Default: :data:`~captum_iglens.onset.DEFAULT_ONSET_RULE`.

    Returns:
        *int*: a layer index, or ``-1`` when the rule finds none (the score is
        zero everywhere; under ``"positive"``, nowhere positive).
    """
    score = _vector(score, "score")
    return int(onset_layers(torch.from_numpy(score), frac, rule))


def onset_distance(
    score: np.ndarray,
    drop: np.ndarray,
    frac: float = 0.5,
    rule: str = DEFAULT_ONSET_RULE,
) -> float:
    r"""
    ``|onset(score) − argmax drop|`` in layers (see :func:`onset_index`, whose
    ``frac`` and ``rule`` it takes), averaged over tied maxima of ``drop``.

    Returns:
        *float*, ``>= 0``; NaN when the score has no onset.
    """
    score, drop = _pair(score, drop)
    onset = onset_index(score, frac, rule)
    if onset < 0:
        return float("nan")
    return float(np.abs(onset - _maxima(drop)).mean())


def nonmonotone_depth(trajectory: np.ndarray) -> float:
    r"""
    How far a trajectory rises and then falls: the largest ``min(rise, fall)``
    over its points ``j``, where ``rise = τ_j − min_{i ≤ j} τ_i`` and
    ``fall = τ_j − min_{l ≥ j} τ_l``. Zero for a monotone trajectory.

    Args:

        trajectory (np.ndarray): The values in path order, e.g. the logit-lens
                    levels ``f(h_0), f(h_{L_1}), ..., f(h_final)``.

    Returns:
        *float*, ``>= 0``.
    """
    values = _vector(trajectory, "trajectory")
    rise = values - np.minimum.accumulate(values)
    fall = values - np.minimum.accumulate(values[::-1])[::-1]
    return float(np.minimum(rise, fall).max())


def bootstrap_mean(
    values: np.ndarray, n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95
) -> Dict[str, float]:
    r"""
    The mean of per-token values and its BCa bootstrap confidence interval
    (:func:`bootstrap_statistic` of :func:`numpy.mean`). NaN values are excluded
    and counted.

    Args:

        values (np.ndarray): 1-D per-token values (NaN where undefined).
        n_bootstrap (int, optional): Resamples, ``>= 1``. Default: 1000.
        seed (int, optional): Seed of the resampling. Default: 0.
        level (float, optional): Coverage of the interval, in ``(0, 1)``.
                    Default: 0.95.

    Returns:
        *dict* with ``mean``, ``lo``, ``hi`` (NaN when no value is defined),
        ``n`` (defined values) and ``n_undefined`` (NaN values).
    """
    return bootstrap_statistic((values,), np.mean, n_bootstrap, seed, level)


#: The agreement metrics of :func:`agreement`, in table order.
METRICS: Tuple[str, ...] = (
    "spearman",
    "top1",
    "top3",
    "onset_distance",
    "peak_distance",
)


def agreement(
    score: np.ndarray, drop: np.ndarray, frac: float = 0.5
) -> Dict[str, float]:
    r"""
    Every agreement metric of one token's per-layer score with its ablation drops.

    Args:

        score (np.ndarray): ``k`` per-layer scores.
        drop (np.ndarray): ``k`` per-layer ablation drops.
        frac (float, optional): Onset fraction, as in :func:`onset_index`.
                    Default: 0.5.

    Returns:
        *dict* keyed by :data:`METRICS`: :func:`spearman`, :func:`top_k_hit` with
        ``k = 1`` and ``k = 3``, :func:`onset_distance`, :func:`peak_distance`.
    """
    return {
        "spearman": spearman(score, drop),
        "top1": top_k_hit(score, drop, 1),
        "top3": top_k_hit(score, drop, 3),
        "onset_distance": onset_distance(score, drop, frac),
        "peak_distance": peak_distance(score, drop),
    }


def summarize(
    values: Dict[str, Dict[str, np.ndarray]],
    groups: Dict[str, np.ndarray],
    computed: Dict[str, np.ndarray],
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> Dict[str, Dict[str, Dict[str, Dict[str, float]]]]:
    r"""
    :func:`bootstrap_mean` of every method's every metric over every group of
    tokens.

    Args:

        values (dict): ``values[method][metric]``: ``N`` per-token values, NaN
                    where undefined or not computed.
        groups (dict): ``groups[name]``: ``N`` booleans, the tokens of the group.
        computed (dict): ``computed[method]``: ``N`` booleans, the tokens the
                    method was run on (the others are left out, not counted as
                    undefined).
        n_bootstrap (int, optional): Resamples. Default: 1000.
        seed (int, optional): Seed; every cell resamples with the same seed.
                    Default: 0.

    Returns:
        *dict*: ``summary[group][method][metric]`` is :func:`bootstrap_mean`'s.
    """
    return {
        group: {
            method: {
                metric: bootstrap_mean(
                    array[
                        np.asarray(members, bool) & np.asarray(computed[method], bool)
                    ],
                    n_bootstrap,
                    seed,
                )
                for metric, array in metrics.items()
            }
            for method, metrics in values.items()
        }
        for group, members in groups.items()
    }


def causal_onset(recovery: np.ndarray, threshold: float = 0.5) -> int:
    r"""
    The causal onset: the first layer whose restoration recovers at least
    ``threshold`` of the corruption's effect.

    Args:

        recovery (np.ndarray): ``k`` per-layer recoveries ``r(L)``.
        threshold (float, optional): Default: 0.5.

    Returns:
        *int*: a layer index, or ``-1`` when no layer reaches the threshold.
    """
    values = _vector(recovery, "recovery")
    reached = np.flatnonzero(values >= threshold)
    return int(reached[0]) if reached.size else -1


def recovery_gains(recovery: np.ndarray) -> np.ndarray:
    r"""
    Per-layer recovery gains ``r(L_j) − r(L_{j−1})``, with ``r(L_{−1}) = 0``
    (nothing restored).

    Args:

        recovery (np.ndarray): ``k`` per-layer recoveries.

    Returns:
        *np.ndarray* of ``k`` gains, summing to ``r(L_{k−1})``.
    """
    return np.diff(_vector(recovery, "recovery"), prepend=0.0)


def _check_bootstrap(n_bootstrap: int, level: float) -> None:
    if (
        isinstance(n_bootstrap, bool)
        or not isinstance(n_bootstrap, int)
        or n_bootstrap < 1
    ):
        raise ValueError(f"n_bootstrap: expected an int >= 1, got {n_bootstrap!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a number in (0, 1), got {level}")


def _bca_interval(
    arrays: Tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    n_bootstrap: int,
    seed: int,
    level: float,
) -> Tuple[float, float]:
    # A point-mass bootstrap distribution (one row, or constant values) has no
    # BCa interval in scipy (which needs two rows and a spread): it is the point.
    if arrays[0].size < 2:
        value = float(statistic(*arrays))
        return value, value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy_stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        found = scipy_stats.bootstrap(
            arrays,
            statistic,
            n_resamples=n_bootstrap,
            confidence_level=level,
            method="BCa",
            paired=True,
            rng=np.random.default_rng(seed),
        )
    spread = found.bootstrap_distribution
    if np.isfinite(spread).all() and np.ptp(spread) == 0:
        return float(spread[0]), float(spread[0])
    interval = found.confidence_interval
    if np.isnan([interval.low, interval.high]).any() and np.isfinite(spread).all():
        # BCa's bias correction is infinite when no resample falls below the
        # statistic (a median of tied integers, e.g. onset differences): the
        # percentile interval of the same resamples stands in.
        tail = (1 - level) / 2
        low, high = np.quantile(spread, [tail, 1 - tail])
        return float(low), float(high)
    return float(interval.low), float(interval.high)


def bootstrap_statistic(
    columns: Tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Dict[str, float]:
    r"""
    A statistic of per-token columns and its BCa bootstrap interval
    (:func:`scipy.stats.bootstrap` with ``method="BCa"``, ``paired=True``:
    tokens, i.e. rows of every column together, resampled with replacement).
    Rows with a NaN in any column are excluded and counted.

    Args:

        columns (tuple of np.ndarray): 1-D arrays of the same length.
        statistic (Callable): ``statistic(*columns) -> float``; when it takes an
                    ``axis`` keyword, scipy evaluates all resamples at once.
        n_bootstrap (int, optional): Resamples, ``>= 1``. Default: 1000.
        seed (int, optional): Seed of the resampling. Default: 0.
        level (float, optional): Coverage of the interval, in ``(0, 1)``.
                    Default: 0.95.

    Returns:
        *dict* with ``mean`` (the statistic on all defined rows), ``lo`` and
        ``hi`` (the interval: the value itself when every resample gives the same
        value, e.g. with one defined row; the percentile interval where BCa's
        bias correction is infinite, e.g. a median of tied integers; NaN when
        the statistic is undefined on some resample), ``n`` (defined rows) and
        ``n_undefined``.
    """
    _check_bootstrap(n_bootstrap, level)
    arrays = [np.asarray(c, dtype=np.float64).reshape(-1) for c in columns]
    sizes = [a.size for a in arrays]
    if len(set(sizes)) != 1:
        raise ValueError(f"columns: expected 1-D arrays of one length, got {sizes}")
    defined = ~np.any([np.isnan(a) for a in arrays], axis=0)
    arrays = [a[defined] for a in arrays]
    out = {"n": int(defined.sum()), "n_undefined": int((~defined).sum())}
    if not out["n"]:
        return dict(out, mean=float("nan"), lo=float("nan"), hi=float("nan"))
    lo, hi = _bca_interval(tuple(arrays), statistic, n_bootstrap, seed, level)
    value = statistic(*arrays)
    return dict(out, mean=float(value), lo=lo, hi=hi)


def _spearman_or_nan(a: np.ndarray, b: np.ndarray) -> float:
    return spearman(a, b) if a.size > 1 else float("nan")


def _within(layers: int) -> Callable[..., Any]:
    def share(diff: np.ndarray, axis: int = -1) -> Any:
        return np.mean(diff <= layers, axis=axis)

    return share


#: The metrics of :func:`onset_agreement`, in table order.
ONSET_METRICS: Tuple[str, ...] = (
    "onset_spearman",
    "mean_abs_diff",
    "median_abs_diff",
    "within_1",
    "within_2",
    "mean_lateness",
    "gain_spearman",
)


def onset_agreement(
    onsets: np.ndarray,
    causal: np.ndarray,
    gain_spearman: np.ndarray,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> Dict[str, Dict[str, float]]:
    r"""
    How a method's per-token onsets agree with the causal onsets, over tokens.

    Args:

        onsets (np.ndarray): ``N`` onset layers of the method (NaN: none).
        causal (np.ndarray): ``N`` causal onsets (NaN: none).
        gain_spearman (np.ndarray): ``N`` per-token Spearman correlations of the
                    method's per-layer scores with the recovery gains.
        n_bootstrap (int, optional): Resamples. Default: 1000.
        seed (int, optional): Seed. Default: 0.

    Returns:
        *dict* keyed by :data:`ONSET_METRICS`, each a :func:`bootstrap_statistic`
        dict: the Spearman correlation of the onsets over tokens, the mean and
        median ``|onset − causal onset|`` in layers, the share within 1 and 2
        layers, the mean signed lateness ``onset − causal onset`` (positive:
        the method's onset comes later), and the mean per-token
        ``gain_spearman``.
    """
    late = np.asarray(onsets, float) - np.asarray(causal, float)
    diff = np.abs(late)
    pair = (np.asarray(onsets, float), np.asarray(causal, float))

    def boot(cols: Tuple[np.ndarray, ...], stat: Callable[..., Any]) -> Any:
        return bootstrap_statistic(cols, stat, n_bootstrap, seed)

    return {
        "onset_spearman": boot(pair, _spearman_or_nan),
        "mean_abs_diff": boot((diff,), np.mean),
        "median_abs_diff": boot((diff,), np.median),
        "within_1": boot((diff,), _within(1)),
        "within_2": boot((diff,), _within(2)),
        "mean_lateness": boot((late,), np.mean),
        "gain_spearman": boot((np.asarray(gain_spearman, float),), np.mean),
    }
