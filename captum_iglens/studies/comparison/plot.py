r"""The figure of a comparison of methods: one heatmap per method and their
completeness residuals (see :class:`~captum_iglens.studies.ComparisonResult`)."""

import textwrap
from typing import TYPE_CHECKING, Any, Dict, Tuple

import numpy as np

from captum_iglens.plots import color_map, layer_ticks

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_comparison"]


def plot_comparison(
    result: Any, sequence: int = 0
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    One heatmap per method (layers across, the attributed tokens down an axis
    shared by all), side by side, each with its own symmetric colour scale
    (Captum's red-white-green), and below them a bar chart of each method's
    residuals ``|Σ_layers − Δp|`` on a log scale. Works headless.

    Args:

        result (ComparisonResult): The comparison, e.g. from
                    :func:`~captum_iglens.studies.compare`.
        sequence (int, optional): Which sequence of the batch. Default: 0.

    Returns:
        2-element tuple of **figure**, **axes**: the ``matplotlib`` figure, and
        a dict from each method's name, and ``"residuals"``, to its axes.
    """
    import matplotlib.pyplot as plt

    names = list(result.methods)
    rows = result.mask[sequence].nonzero()[:, 0].tolist()
    fig = plt.figure(
        figsize=(max(8.0, 2.4 * len(names)), 4.5 + 0.25 * len(rows)),
        layout="constrained",
    )
    fig.set_facecolor("white")
    grid = fig.add_gridspec(2, len(names), height_ratios=[1.2 + 0.1 * len(rows), 1])
    axes: Dict[str, Any] = {}
    for col, name in enumerate(names):
        ax = fig.add_subplot(grid[0, col], sharey=axes.get(names[0]))
        scores = result.methods[name].scores[sequence, rows]
        top = max(scores.abs().max().item(), 1e-12)
        image = ax.imshow(
            scores.numpy(), cmap=color_map(), vmin=-top, vmax=top, aspect="auto"
        )
        fig.colorbar(image, ax=ax, location="bottom", shrink=0.9)
        title = textwrap.fill(name.replace("_", " "), 22)
        ax.set_title(f"{title}\n({result.methods[name].unit})", fontsize=9)
        layer_ticks(ax, result.methods[name].layer_names)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("layer", fontsize=8)
        if col == 0:
            labels = [result.label(sequence, i) for i in rows]
            ax.set_yticks(range(len(rows)), labels)
        else:
            ax.tick_params(axis="y", labelleft=False)
        axes[name] = ax
    bars = fig.add_subplot(grid[1, :])
    floor = 1e-12
    x = np.arange(len(names), dtype=np.float64)
    stats = [result.residual_stats(name, sequence) for name in names]
    for shift, label, column in ((-0.2, "max", 0), (0.2, "median", 1)):
        heights = [max(s[column], floor) for s in stats]
        bars.bar(x + shift, heights, width=0.4, label=label)
        for xi, h in zip((x + shift).tolist(), heights):
            if h <= floor:
                bars.annotate("0", (xi, floor), ha="center", fontsize=7)
    bars.set_yscale("log")
    bars.set_ylim(bottom=floor)
    bars.axhline(1e-6, color="grey", linestyle=":", linewidth=1)
    ticks = [textwrap.fill(n.replace("_", " "), 22) for n in names]
    bars.set_xticks(x, ticks, fontsize=8)
    bars.set_ylabel("|Σ_layers − Δp| (probability)", fontsize=8)
    bars.set_title(
        f"Telescoping residual per token, sequence {sequence} (log scale; dotted: "
        "1e-6; exact zeros marked 0)",
        fontsize=9,
    )
    bars.legend(fontsize=8)
    axes["residuals"] = bars
    return fig, axes
