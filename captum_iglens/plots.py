r"""Every figure of the package: the map of an :class:`~captum_iglens.IGLensResult`,
the comparison of methods and the validation studies.

They follow the contract of Captum's ``LLMAttributionResult.plot_*``: they
return ``(fig, ax)`` (a dict of axes for the multi-panel figures) for further
customisation; the map's plots show the figure and return ``None`` when
``show=True``. They use matplotlib's object API and work on
a headless backend (Agg). The colour convention is Captum's: red for negative,
white for zero, green for positive credit.
"""

import textwrap
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import matplotlib.colors as mcolors
import numpy as np
from matplotlib.patches import Patch, Rectangle

from captum_iglens.result import IGLensResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from captum_iglens.studies.comparison.result import ComparisonResult
    from captum_iglens.studies.validation.result import (
        RestorationResult,
        ValidationResult,
    )

__all__ = [
    "plot_comparison",
    "plot_heatmap",
    "plot_restoration",
    "plot_trajectory",
    "plot_validation",
]

#: Colours of credit given (up) and taken back (down); Captum's convention.
UP_COLOR = "#2e8b3e"
DOWN_COLOR = "#d0365b"
_LABEL_CHARS = 28


def _color_map() -> mcolors.Colormap:
    """Captum's own diverging map (red, white, green), as its LLM plots use."""
    try:
        from captum.attr._core.llm_attr import LLMAttributionResult

        # The method does not use ``self``; it is Captum's single source of truth.
        return LLMAttributionResult._get_plot_color_map(None)  # type: ignore[arg-type]
    except Exception:  # pragma: no cover - a future Captum may move it
        return mcolors.LinearSegmentedColormap.from_list(
            "RdWhGn", ["red", "white", "green"]
        )


def _check_result(result: IGLensResult, batch_index: int) -> int:
    if not isinstance(result, IGLensResult):
        raise TypeError(
            "result: expected a captum_iglens.IGLensResult, got "
            f"{type(result).__name__}"
        )
    if result.attributions.dim() != 3 or 0 in tuple(result.attributions.shape):
        raise ValueError(
            "result: expected attributions of shape (B, P, k) with B, P, k >= 1, got "
            f"{tuple(result.attributions.shape)}"
        )
    batch = result.attributions.shape[0]
    if (
        isinstance(batch_index, bool)
        or not isinstance(batch_index, (int, np.integer))
        or not -batch <= batch_index < batch
    ):
        raise ValueError(
            f"batch_index: expected an int in [-{batch}, {batch}), got {batch_index!r}"
        )
    return int(batch_index) % batch


def _token_text(result: IGLensResult, b: int, p: int) -> str:
    """The target token as readable text: quoted, whitespace escaped, shortened."""
    if result.tokens is not None:
        text = repr(str(result.tokens[b][p]))
    else:
        text = f"id {int(result.targets[b, p])}"
    if len(text) > _LABEL_CHARS:
        text = text[: _LABEL_CHARS - 1] + "…"
    return text


def _finish(
    fig: "Figure", ax: "Axes", show: bool
) -> Union[None, Tuple["Figure", "Axes"]]:
    if show:
        import matplotlib.pyplot as plt

        plt.show()
        return None
    return fig, ax


def _new_axes(
    ax: Optional["Axes"], size: Tuple[float, float]
) -> Tuple["Figure", "Axes"]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    import matplotlib.pyplot as plt

    fig, new_ax = plt.subplots(figsize=size, layout="constrained")
    fig.set_facecolor("white")
    return fig, new_ax


def _layer_ticks(ax: "Axes", labels: List[str], start: int = 0) -> None:
    """Layer names on the x axis, from x = ``start``; vertical when long."""
    labels = [str(n) for n in labels]
    ax.set_xticks(np.arange(start, start + len(labels)), labels=labels)
    if max(len(s) for s in labels) > 4:
        ax.tick_params(axis="x", labelrotation=90)


#: Above this many columns, the heatmap labels groups (blocks), not columns.
_MAX_LABELLED_COLUMNS = 40


def _column_groups(names: List[str]) -> List[Tuple[int, int, str]]:
    """Runs of consecutive columns that share the part of their name before the
    first dot (``"12.attn.h3"``, ``"12.mlp"`` → block ``"12"``): start, end, name."""
    groups: List[Tuple[int, int, str]] = []
    for j, name in enumerate(names):
        key = str(name).split(".")[0]
        if groups and groups[-1][2] == key:
            groups[-1] = (groups[-1][0], j + 1, key)
        else:
            groups.append((j, j + 1, key))
    return groups


def _grouped_ticks(ax: "Axes", names: List[str]) -> None:
    """One tick per group of columns (a block), at its centre, and a line between
    groups, for maps with too many columns to label one by one."""
    groups = _column_groups(names)
    centres = [(start + end - 1) / 2 for start, end, _ in groups]
    ax.set_xticks(centres, labels=[g[2] for g in groups])
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    for start, _, _ in groups[1:]:
        ax.axvline(start - 0.5, color="#444444", linewidth=0.6)


def plot_heatmap(
    result: IGLensResult,
    batch_index: int = 0,
    *,
    ax: Optional["Axes"] = None,
    show: bool = False,
    annotate_onset: bool = True,
    onset_frac: float = 0.5,
    start: int = 0,
    max_rows: int = 100,
    show_top: Optional[bool] = None,
) -> Union[None, Tuple["Figure", "Axes"]]:
    r"""
    Plots the IG-Lens map of one sequence: attributed tokens (rows) by layers
    (columns). Cell ``(t, j)`` is layer ``j``'s credit to the probability of
    token ``t``, so each row sums to that token's change in probability
    ``model_prob - base_prob``. Green cells add probability, red cells take it
    back; the colour scale is symmetric around 0. Padding rows are left out.

    Args:

        result (IGLensResult): The map, e.g. from
                    :meth:`~captum_iglens.LayerIGLens.attribute_map`.
        batch_index (int, optional): Which sequence of the batch to plot
                    (negative values count from the end). Default: 0
        ax (matplotlib.axes.Axes, optional): Axes to draw on. Default: None (a
                    new figure whose size grows with the number of layers and
                    tokens, up to a width of 24 inches; with more than 40
                    columns, e.g. ``granularity="head"``, a tick labels each
                    block's group of columns and lines separate the blocks).
        show (bool, optional): Show the figure with ``plt.show()`` and return
                    None. Default: False
        annotate_onset (bool, optional): Outline each token's onset cell, the
                    earliest layer at which the cumulative ``|credit|`` reaches
                    ``onset_frac`` of the total (:meth:`IGLensResult.onset`).
                    Default: True
        onset_frac (float, optional): Fraction of the absolute credit mass that
                    defines the onset, in ``(0, 1]``. Default: 0.5
        start (int, optional): The first attributed token drawn (a page of a long
                    map). Default: 0
        max_rows (int, optional): The most tokens drawn; a longer map is drawn
                    a page at a time (the title says which tokens are shown), so
                    the figure stays a readable size. Default: 100
        show_top (bool, optional): Write in each cell the layer's top-1 token
                    (the classic logit-lens picture; bold where it is the
                    target), from a result with views (``top_k >= 1``), in
                    place of the credit values. Default: None (when the result
                    has views)

    Returns:
        None or 2-element tuple of **fig**, **ax**:
        - **fig** (*matplotlib.figure.Figure*): The figure, if ``show`` is False.
        - **ax** (*matplotlib.axes.Axes*): The heatmap's axes; ``ax.images[0]``
          holds the ``(n_tokens, n_layers)`` credits; with ``show_top``, the
          cell texts have gid ``"top1"``.

    Raises:
        ValueError: If ``result`` is empty or has no non-padding position in the
            chosen sequence, if ``batch_index`` is out of range, or if
            ``onset_frac`` is not in ``(0, 1]``.
    """
    b = _check_result(result, batch_index)
    show_top = result.has_views if show_top is None else show_top
    if show_top and not result.has_views:
        raise ValueError("show_top: the result has no views (attribute with top_k)")
    if not 0.0 < onset_frac <= 1.0:
        raise ValueError(f"onset_frac: expected a number in (0, 1], got {onset_frac}")
    for name, value, low in (("start", start, 0), ("max_rows", max_rows, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    all_rows = result.mask[b].nonzero()[:, 0].tolist()
    if not all_rows:
        raise ValueError(
            f"result: sequence {batch_index} has no attributed (non-padding) position"
        )
    if start >= len(all_rows):
        raise ValueError(
            f"start: expected a token index below {len(all_rows)}, got {start}"
        )
    rows = all_rows[start : start + max_rows]
    data = result.attributions[b, rows].detach().float().cpu().numpy()
    n_rows, n_layers = data.shape
    positions = result.positions.tolist()
    probs = result.model_prob[b].tolist()
    labels = [
        f"{_token_text(result, b, p)} @{positions[p]}  p={probs[p]:.2g}" for p in rows
    ]

    longest_layer = max(len(str(n)) for n in result.layer_names)
    rotated = longest_layer > 4  # see _layer_ticks
    grouped = n_layers > _MAX_LABELLED_COLUMNS
    cell = 0.62 if show_top else 0.42  # room for a short token in each cell
    width = 3.2 + 0.075 * max(len(s) for s in labels) + cell * n_layers
    width = min(width, 24.0) if grouped else width
    height = 1.8 + 0.34 * n_rows + (0.085 * longest_layer if rotated else 0.0)
    fig, ax = _new_axes(ax, (max(width, 5.0), max(height, 3.0)))

    vmax = float(np.abs(data).max())
    vmax = vmax if vmax > 0 else 1.0
    norm = mcolors.Normalize(vmin=-vmax, vmax=vmax)
    image = ax.imshow(
        data, cmap=_color_map(), norm=norm, aspect="auto", interpolation="nearest"
    )
    ax.grid(False)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    colorbar.set_label("credit (Δ probability)")

    if grouped:
        _grouped_ticks(ax, result.layer_names)
    else:
        _layer_ticks(ax, result.layer_names)
    ax.set_yticks(np.arange(n_rows), labels=labels)
    ax.set_xlabel("block (its columns in order)" if grouped else "layer")
    ax.set_ylabel("attributed token")
    # Thin white grid between cells, so neighbouring equal colours stay apart.
    if not grouped:
        ax.set_xticks(np.arange(-0.5, n_layers, 1.0), minor=True)
    ax.set_yticks(np.arange(-0.5, n_rows, 1.0), minor=True)
    ax.grid(which="minor", color="#bbbbbb", linewidth=0.4)
    ax.tick_params(which="minor", length=0)

    if show_top and n_rows <= 60:
        _write_top_tokens(ax, result, b, rows, data, norm)
    elif n_layers <= 12 and n_rows <= 40:
        for i in range(n_rows):
            for j in range(n_layers):
                val = data[i, j]
                ax.text(
                    j,
                    i,
                    f"{val:+.3f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if 0.15 < norm(val) < 0.85 else "white",
                )

    title = (
        f"IG-Lens credit per layer ({result.method}); rows: token @position, "
        "p = model's probability"
    )
    if show_top:
        title += "\ncell text: the layer's top-1 token (bold: the target)"
    if annotate_onset:
        onset = result.onset(onset_frac)[b, rows].tolist()
        for i, j in enumerate(onset):
            if j < 0:
                continue
            box = Rectangle(
                (j - 0.5, i - 0.5),
                1.0,
                1.0,
                fill=False,
                edgecolor="black",
                linewidth=2.0,
                zorder=3,
            )
            box.set_gid("onset")
            ax.add_patch(box)
        title += f"\nboxed: onset, where cumulative |credit| reaches {onset_frac:.0%}"
    if len(rows) < len(all_rows):
        title += (
            f"\ntokens {start + 1}–{start + len(rows)} of {len(all_rows)} "
            "(pass start= for another page)"
        )
    ax.set_title(title, fontsize=10)
    return _finish(fig, ax, show)


def _write_top_tokens(
    ax: "Axes",
    result: IGLensResult,
    b: int,
    rows: List[int],
    data: np.ndarray,
    norm: mcolors.Normalize,
) -> None:
    """Each cell's top-1 token (at most 6 characters), bold where it is the
    target."""
    for i, p in enumerate(rows):
        for j in range(data.shape[1]):
            if result.top_tokens is not None:
                text = result.top_tokens[b][p][j][0]
            else:
                text = f"#{int(result.top_ids[b, p, j, 0])}"
            label = ax.text(
                j,
                i,
                repr(text)[1:-1][:6],
                ha="center",
                va="center",
                fontsize=6,
                fontweight="bold" if int(result.rank[b, p, j]) == 1 else "normal",
                color="black" if 0.15 < norm(data[i, j]) < 0.85 else "white",
            )
            label.set_gid("top1")


def plot_trajectory(
    result: IGLensResult,
    position: int,
    batch_index: int = 0,
    *,
    ax: Optional["Axes"] = None,
    show: bool = False,
    onset_frac: float = 0.5,
) -> Union[None, Tuple["Figure", "Axes"]]:
    r"""
    Plots how the probability of one attributed token builds up across layers.

    Drawn on one axis, in probability units:

    - the logit-lens level ``f(h_L)`` of each layer (``result.lens``, a line);
    - the cumulative IG-Lens credit ``base_prob + cumsum(attributions)``
      (hollow circles). Both coincide for the exact ``"prediction_aware"``
      estimator; a gap shows an estimator's discretisation error;
    - the per-layer credits as a waterfall: each bar spans from the cumulative
      level before the layer to the level after it, green where the layer adds
      probability, red where it gives probability back;
    - the baseline level ``base_prob`` (at ``"base"``), the model's own
      probability ``model_prob`` (a dashed horizontal line) and the onset layer
      (a dotted vertical line).

    Args:

        result (IGLensResult): The map, e.g. from
                    :meth:`~captum_iglens.LayerIGLens.attribute_map`.
        position (int): Which attributed token: an index into
                    ``result.positions`` (negative values count from the end),
                    not a position in the sequence.
        batch_index (int, optional): Which sequence of the batch (negative values
                    count from the end). Default: 0
        ax (matplotlib.axes.Axes, optional): Axes to draw on. Default: None (a
                    new figure whose width grows with the number of layers).
        show (bool, optional): Show the figure with ``plt.show()`` and return
                    None. Default: False
        onset_frac (float, optional): Fraction of the absolute credit mass that
                    defines the onset, in ``(0, 1]``. Default: 0.5

    Returns:
        None or 2-element tuple of **fig**, **ax**:
        - **fig** (*matplotlib.figure.Figure*): The figure, if ``show`` is False.
        - **ax** (*matplotlib.axes.Axes*): The axes. Layer ``j`` is at x = ``j``
          and the baseline at x = -1. Its lines carry the labels
          ``"logit lens"`` and ``"cumulative credit"``; its bars are the
          per-layer credits.

    Raises:
        ValueError: If ``result`` is empty, ``batch_index`` or ``position`` is
            out of range, the position is padding in that sequence, or
            ``onset_frac`` is not in ``(0, 1]``.
    """
    b = _check_result(result, batch_index)
    n_pos = result.attributions.shape[1]
    if (
        isinstance(position, bool)
        or not isinstance(position, (int, np.integer))
        or not -n_pos <= position < n_pos
    ):
        raise ValueError(
            "position: expected an index into result.positions in "
            f"[-{n_pos}, {n_pos}), "
            f"got {position!r}"
        )
    p = int(position) % n_pos
    if not bool(result.mask[b, p]):
        raise ValueError(
            f"position: index {position} is padding in sequence {batch_index} "
            "(result.mask is False there)"
        )
    if not 0.0 < onset_frac <= 1.0:
        raise ValueError(f"onset_frac: expected a number in (0, 1], got {onset_frac}")

    credits = result.attributions[b, p].detach().double().cpu().numpy()
    lens = result.lens[b, p].detach().double().cpu().numpy()
    base = float(result.base_prob[b, p])
    model_prob = float(result.model_prob[b, p])
    cumulative = base + np.cumsum(credits)
    before = np.concatenate([[base], cumulative[:-1]])
    n_layers = len(credits)
    x = np.arange(n_layers)

    fig, ax = _new_axes(ax, (max(8.0, 5.0 + 0.32 * n_layers), 4.6))
    colors = [UP_COLOR if c >= 0 else DOWN_COLOR for c in credits]
    ax.bar(
        x,
        credits,
        bottom=before,
        width=0.6,
        color=colors,
        alpha=0.45,
        edgecolor=colors,
        linewidth=1.0,
        zorder=1,
    )
    ax.axhline(
        model_prob,
        color="0.35",
        linestyle="--",
        linewidth=1.0,
        label=f"model p = {model_prob:.4f}",
        zorder=0,
    )
    ax.plot(
        [-1],
        [base],
        marker="D",
        color="0.25",
        linestyle="none",
        label=f"baseline f(h_base) = {base:.4f}",
        zorder=4,
        clip_on=False,
    )
    ax.plot(
        x,
        lens,
        color="#1f4e9c",
        linewidth=1.8,
        marker=".",
        markersize=5,
        label="logit lens",
        zorder=3,
    )
    ax.plot(
        x,
        cumulative,
        linestyle="none",
        marker="o",
        markersize=9,
        markerfacecolor="none",
        markeredgecolor="#e08a00",
        markeredgewidth=1.6,
        label="cumulative credit",
        zorder=4,
    )
    onset = int(result.onset(onset_frac)[b, p])
    if onset >= 0:
        name = result.layer_names[onset]
        ax.axvline(
            onset,
            color="black",
            linestyle=":",
            linewidth=1.4,
            label=f"onset ({onset_frac:.0%} of |credit|): layer {name}",
            zorder=2,
        )

    _layer_ticks(ax, ["base", *result.layer_names], start=-1)
    ax.set_xlim(-1.6, n_layers - 0.4)
    ax.set_xlabel("layer")
    ax.set_ylabel("p(token)")
    ax.grid(axis="y", color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    token = _token_text(result, b, p)
    ax.set_title(
        f"{token} at position {int(result.positions[p])}: "
        f"p {base:.4f} → {model_prob:.4f} (Δp = {model_prob - base:+.4f})",
        fontsize=10,
    )
    values = np.concatenate([[base, model_prob], lens, cumulative])
    low, high = min(0.0, float(values.min())), float(values.max())
    span = high - low if high > low else 1.0
    ax.set_ylim(low - (0.03 * span if low < 0 else 0.0), high + 0.08 * span)
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Patch(facecolor=UP_COLOR, edgecolor=UP_COLOR, alpha=0.45, label="layer adds p"),
        Patch(
            facecolor=DOWN_COLOR,
            edgecolor=DOWN_COLOR,
            alpha=0.45,
            label="layer takes p back",
        ),
    ]
    ax.legend(
        handles=handles,
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        framealpha=0.9,
    )
    return _finish(fig, ax, show)


def plot_comparison(
    result: "ComparisonResult", sequence: int = 0
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    One heatmap per method (layers across, the attributed tokens down an axis
    shared by all), side by side, each with its own symmetric colour scale
    (Captum's red-white-green), and below them a bar chart of each method's
    residuals ``|Σ_layers − Δp|`` on a log scale. Works headless.

    Args:

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
            scores.numpy(), cmap=_color_map(), vmin=-top, vmax=top, aspect="auto"
        )
        fig.colorbar(image, ax=ax, location="bottom", shrink=0.9)
        title = textwrap.fill(name.replace("_", " "), 22)
        ax.set_title(f"{title}\n({result.methods[name].unit})", fontsize=9)
        _layer_ticks(ax, result.methods[name].layer_names)
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


def plot_validation(
    result: "ValidationResult", examples: Optional[Sequence[int]] = None
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    Top: for a few tokens, the ablation drop and the IG-Lens credit of every
    layer (both in probability). Bottom: every method's mean Spearman
    correlation and top-1 hit rate with their 95% intervals, over all tokens
    and over the non-monotone ones. Works headless.

    Args:

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
    layers = np.arange(len(result.layer_names))
    for col, i in enumerate(picks):
        ax = fig.add_subplot(grid[0, col])
        credit = result.scores["ig_lens"][i]
        ax.bar(
            layers,
            credit,
            color=np.where(credit >= 0, UP_COLOR, DOWN_COLOR),
            label="IG-Lens credit",
        )
        ax.plot(
            layers, result.drops[i], "k.-", linewidth=1, label=f"{result.mode} drop"
        )
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_title(
            textwrap.fill(f"{result.facts[i].prompt} → {result.target_tokens[i]!r}", 50)
            + f"\np = {result.model_prob[i]:.3f}",
            fontsize=9,
        )
        ax.set_xlabel("block", fontsize=8)
        ax.set_ylabel("probability", fontsize=8)
        ax.legend(fontsize=7)
        axes[f"example {col}"] = ax
    groups = [g for g in ("all", "non_monotone") if result.groups[g].any()]
    x = np.arange(len(result.methods))
    for col, metric in enumerate(("spearman", "top1")):
        ax = fig.add_subplot(bottom[0, col])
        width = 0.8 / len(groups)
        for g, group in enumerate(groups):
            cells = [result.summary[group][m][metric] for m in result.methods]
            mean = np.array([c["mean"] for c in cells], dtype=float)
            err = np.abs(
                np.array([[c["lo"], c["hi"]] for c in cells], dtype=float).T - mean
            )
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
        axes[metric] = ax
    return fig, axes


def plot_restoration(
    result: "RestorationResult",
    examples: Optional[Sequence[int]] = None,
    corruption: Optional[str] = None,
) -> Tuple["Figure", Dict[str, "Axes"]]:
    r"""
    For a few tokens, on the same axes: the recovery ``r(L)`` of restoring each
    block's output at the attributed position, and the IG-Lens trajectory as the
    share of the credit reached by each block, ``(f(h_L) − f(h_0)) / (p − f(h_0))``
    (both 0 before the first block and 1 at the last), with the causal and IG-Lens
    onsets marked. Works headless.

    Args:

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
