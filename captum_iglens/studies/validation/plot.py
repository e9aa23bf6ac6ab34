r"""The figures of the validation studies: per-token examples and the agreement
of each method with ablation (:class:`ValidationResult`), and recovery beside
the IG-Lens trajectory under restoration (:class:`RestorationResult`)."""

import textwrap
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from captum_iglens.plots import DOWN_COLOR, UP_COLOR

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_restoration", "plot_validation"]


def plot_validation(
    result: Any, examples: Optional[Sequence[int]] = None
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    Top: for a few tokens, the ablation drop and the IG-Lens credit of every
    layer (both in probability). Bottom: every method's mean Spearman
    correlation and top-1 hit rate with their 95% intervals, over all tokens
    and over the non-monotone ones. Works headless.

    Args:

        result (ValidationResult): The study, e.g. from
                    :func:`~captum_iglens.studies.validation.run_validation`.
        examples (list[int], optional): Indices of the tokens to show.
                    Default: three, spread over the prompt set.

    Returns:
        2-element tuple of **figure**, **axes**: a dict with ``"example 0"``,
        ..., ``"spearman"`` and ``"top1"``.
    """
    import matplotlib.pyplot as plt

    n = len(result.facts)
    picks = (
        sorted(set(np.linspace(0, n - 1, min(3, n)).round().astype(int).tolist()))
        if examples is None
        else list(examples)
    )
    cols = max(len(picks), 2)
    fig = plt.figure(figsize=(5.0 * cols, 8.5), layout="constrained")
    fig.set_facecolor("white")
    grid = fig.add_gridspec(2, cols)
    bottom = grid[1, :].subgridspec(1, 2)
    axes: Dict[str, Any] = {}
    for col, i in enumerate(picks):
        axes[f"example {col}"] = ax = fig.add_subplot(grid[0, col])
        _draw_drops(ax, result, i)
    groups = [g for g in ("all", "non_monotone") if result.groups[g].any()]
    for col, metric in enumerate(("spearman", "top1")):
        axes[metric] = ax = fig.add_subplot(bottom[0, col])
        _draw_agreement(ax, result, metric, groups)
    return fig, axes


def _draw_drops(ax: "Axes", result: Any, i: int) -> None:
    """Token ``i``'s IG-Lens credit (bars) and ablation drop (a line) per block."""
    layers = np.arange(len(result.layer_names))
    credit = result.scores["ig_lens"][i]
    ax.bar(
        layers,
        credit,
        color=np.where(credit >= 0, UP_COLOR, DOWN_COLOR),
        label="IG-Lens credit",
    )
    ax.plot(layers, result.drops[i], "k.-", linewidth=1, label=f"{result.mode} drop")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_title(
        textwrap.fill(f"{result.facts[i].prompt} → {result.target_tokens[i]!r}", 50)
        + f"\np = {result.model_prob[i]:.3f}",
        fontsize=9,
    )
    ax.set_xlabel("block", fontsize=8)
    ax.set_ylabel("probability", fontsize=8)
    ax.legend(fontsize=7)


def _draw_agreement(ax: "Axes", result: Any, metric: str, groups: List[str]) -> None:
    """Each method's mean ``metric`` per group of tokens, with its 95% interval,
    beside the chance level."""
    x = np.arange(len(result.methods))
    width = 0.8 / len(groups)
    for g, group in enumerate(groups):
        cells = [result.summary[group][m][metric] for m in result.methods]
        mean = np.array([c["mean"] for c in cells], dtype=float)
        bounds = np.array([[c["lo"], c["hi"]] for c in cells], dtype=float)
        err = np.abs(bounds.T - mean)
        ax.bar(
            x + (g - (len(groups) - 1) / 2) * width,
            mean,
            width,
            yerr=err,
            capsize=3,
            label=f"{group} tokens ({int(result.groups[group].sum())})",
        )
    chance = 0.0 if metric == "spearman" else 1 / len(result.layer_names)
    ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label="chance")
    ax.set_xticks(
        x,
        [
            f"{m.replace('_', ' ')} (n={result.summary['all'][m][metric]['n']})"
            for m in result.methods
        ],
        rotation=30,
        ha="right",
        fontsize=8,
    )
    ax.set_title(
        f"{'Spearman ρ' if metric == 'spearman' else 'top-1 hit rate'} with "
        f"the {result.mode} drops (95% bootstrap CI)",
        fontsize=9,
    )
    ax.legend(fontsize=7)


def plot_restoration(
    result: Any,
    examples: Optional[Sequence[int]] = None,
    corruption: Optional[str] = None,
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    For a few tokens, on the same axes: the recovery ``r(L)`` of restoring each
    block's output at the attributed position, and the IG-Lens trajectory as the
    share of the credit reached by each block, ``(f(h_L) − f(h_0)) / (p − f(h_0))``
    (both 0 before the first block and 1 at the last), with the causal and IG-Lens
    onsets marked; and each traced method's share under the corruption (e.g.
    ``ig_lens_flow``: of ``Δp`` crossing the attributed position), its onset
    dotted. Works headless.

    Args:

        result (RestorationResult): The study, e.g. from
                    :func:`~captum_iglens.studies.validation.run_restoration`.
        examples (list[int], optional): Indices of the tokens to show.
                    Default: three counted tokens (else traced ones), spread
                    over the set.
        corruption (str, optional): Which corruption's recovery. Default: the
                    first one of the result.

    Returns:
        2-element tuple of **figure**, **axes**: a dict with ``"example 0"``, ...
    """
    import matplotlib.pyplot as plt

    corruption = corruption or result.corruptions[0]
    if corruption not in result.corruptions:
        raise ValueError(
            f"corruption: expected one of {result.corruptions}, got {corruption!r}"
        )
    causal = result.causal_onsets[corruption]
    if examples is None:  # counted tokens, else any traced ones
        counted = np.flatnonzero(~np.isnan(causal))
        if not len(counted):
            counted = np.flatnonzero(~np.isnan(result.probs[corruption][:, 0]))
        spread = np.linspace(0, len(counted) - 1, min(3, len(counted))).round()
        examples = counted[spread.astype(int)].tolist() if len(counted) else []
    if not examples:
        raise ValueError("examples: no token to show")
    fig, row = plt.subplots(
        1, len(examples), figsize=(4.8 * len(examples), 3.6), layout="constrained"
    )
    fig.set_facecolor("white")
    row = np.atleast_1d(row)
    recovery = result.recovery(corruption)
    layers = np.arange(len(result.layer_names))
    axes: Dict[str, Any] = {}
    for col, (ax, i) in enumerate(zip(row, examples)):
        credit = result.scores["ig_lens"][i]
        share = np.cumsum(credit) / credit.sum()
        ax.plot(layers, recovery[i], "k.-", label=f"recovery r(L), {corruption}")
        ax.plot(layers, share, ".-", color=UP_COLOR, label="IG-Lens: share of credit")
        if not np.isnan(causal[i]):
            ax.axvline(causal[i], color="k", linestyle="--", linewidth=0.8)
        onset = result.onsets["ig_lens"][i]
        if not np.isnan(onset):
            ax.axvline(onset, color=UP_COLOR, linestyle="--", linewidth=0.8)
        _draw_traced(ax, result, corruption, i)
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(
            textwrap.fill(
                f"{result.facts[i].prompt} → {result.target_tokens[i]!r}", 45
            ),
            fontsize=9,
        )
        ax.set_xlabel("block (dashed: causal / IG-Lens onset)", fontsize=8)
        ax.set_ylabel("share of the clean effect", fontsize=8)
        ax.legend(fontsize=7)
        axes[f"example {col}"] = ax
    return fig, axes


def _draw_traced(ax: "Axes", result: Any, corruption: str, i: int) -> None:
    """Token ``i``'s share of each traced method under ``corruption``, its
    onset dotted (where it was traced)."""
    layers = np.arange(len(result.layer_names))
    for n, (m, shares) in enumerate(result.traced_shares.get(corruption, {}).items()):
        if np.isnan(shares[i]).any():
            continue
        color = f"C{n + 2}"
        ax.plot(layers, shares[i], ".-", color=color, label=f"{m}: share")
        onset = result.traced_onsets[corruption][m][i]
        if not np.isnan(onset):
            ax.axvline(onset, color=color, linestyle=":", linewidth=0.8)
