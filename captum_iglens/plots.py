r"""The figures of an :class:`~captum_iglens.IGLensResult` (its map and a token's
trajectory) and the drawing helpers the studies' figures share.

They follow the contract of Captum's ``LLMAttributionResult.plot_*``: they
return ``(fig, ax)`` for further customisation, or show the figure and return
``None`` when ``show=True``. They use matplotlib's object API and work on a
headless backend (Agg). The colour convention is Captum's: red for negative,
white for zero, green for positive credit. The studies' figures live with their
studies (:func:`~captum_iglens.studies.comparison.plot_comparison`,
:func:`~captum_iglens.studies.validation.plot_validation`,
:func:`~captum_iglens.studies.validation.plot_restoration`).
"""

from typing import TYPE_CHECKING, List, Optional, Tuple, Union

import matplotlib.colors as mcolors
import numpy as np
from matplotlib.patches import Patch, Rectangle

from captum_iglens.columns import parse_columns
from captum_iglens.result import IGLensResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_heatmap", "plot_source_map", "plot_trajectory"]

#: Colours of credit given (up) and taken back (down); Captum's convention.
UP_COLOR = "#2e8b3e"
DOWN_COLOR = "#d0365b"
_LABEL_CHARS = 28


def color_map() -> mcolors.Colormap:
    """Captum's own diverging map (red, white, green), as its LLM plots use."""
    try:
        from captum.attr._core.llm_attr import LLMAttributionResult

        # The method does not use ``self``; it is Captum's single source of truth.
        return LLMAttributionResult._get_plot_color_map(None)
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


def _check_onset_frac(onset_frac: float) -> None:
    if not 0.0 < onset_frac <= 1.0:
        raise ValueError(f"onset_frac: expected a number in (0, 1], got {onset_frac}")


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


def layer_ticks(ax: "Axes", labels: List[str], start: int = 0) -> None:
    """Layer names on the x axis, from x = ``start``; vertical when long."""
    labels = [str(n) for n in labels]
    ax.set_xticks(np.arange(start, start + len(labels)), labels=labels)
    if max(len(s) for s in labels) > 4:
        ax.tick_params(axis="x", labelrotation=90)


#: Above this many columns, the heatmap labels groups (blocks), not columns.
_MAX_LABELLED_COLUMNS = 40


def _column_groups(names: List[str]) -> List[Tuple[int, int, str]]:
    """Runs of consecutive columns of one block (``"12.attn.h3"``, ``"12.mlp"``
    → block ``"12"``; see :class:`~captum_iglens.columns.Column`): start, end,
    name."""
    groups: List[Tuple[int, int, str]] = []
    for j, column in enumerate(parse_columns([str(name) for name in names])):
        key = column.name if column.block is None else column.block
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
    _check_onset_frac(onset_frac)
    rows, n_all = _heatmap_rows(result, b, batch_index, start, max_rows)
    data = result.attributions[b, rows].detach().float().cpu().numpy()
    positions = result.positions.tolist()
    probs = result.model_prob[b].tolist()
    labels = [
        f"{_token_text(result, b, p)} @{positions[p]}  p={probs[p]:.2g}" for p in rows
    ]
    grouped = data.shape[1] > _MAX_LABELLED_COLUMNS
    fig, ax = _new_axes(ax, _heatmap_size(result, labels, show_top, grouped))
    norm = _draw_credits(fig, ax, data, result.layer_names, labels, grouped)
    if show_top and len(rows) <= 60:
        _write_top_tokens(ax, result, b, rows, data, norm)
    elif data.shape[1] <= 12 and len(rows) <= 40:
        _write_values(ax, data, norm)
    title = (
        f"IG-Lens credit per layer ({result.method}, {result.path} path); "
        "rows: token @position, "
        "p = model's probability"
    )
    if show_top:
        title += "\ncell text: the layer's top-1 token (bold: the target)"
    if annotate_onset:
        _box_onsets(ax, result.onset(onset_frac)[b, rows].tolist())
        title += f"\nboxed: onset, where cumulative |credit| reaches {onset_frac:.0%}"
    if len(rows) < n_all:
        title += (
            f"\ntokens {start + 1}–{start + len(rows)} of {n_all} "
            "(pass start= for another page)"
        )
    ax.set_title(title, fontsize=10)
    return _finish(fig, ax, show)


def _heatmap_rows(
    result: IGLensResult, b: int, batch_index: int, start: int, max_rows: int
) -> Tuple[List[int], int]:
    """The positions (indices into ``result.positions``) of one page of the map,
    and the count of attributed positions of the sequence."""
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
    return all_rows[start : start + max_rows], len(all_rows)


def _heatmap_size(
    result: IGLensResult, labels: List[str], show_top: bool, grouped: bool
) -> Tuple[float, float]:
    """A figure size that grows with the tokens and layers (at most 24 inches
    wide when the columns are labelled by group)."""
    longest_layer = max(len(str(n)) for n in result.layer_names)
    rotated = longest_layer > 4  # see layer_ticks
    cell = 0.62 if show_top else 0.42  # room for a short token in each cell
    width = 3.2 + 0.075 * max(len(s) for s in labels) + cell * len(result.layer_names)
    width = min(width, 24.0) if grouped else width
    height = 1.8 + 0.34 * len(labels) + (0.085 * longest_layer if rotated else 0.0)
    return max(width, 5.0), max(height, 3.0)


def _draw_credits(
    fig: "Figure",
    ax: "Axes",
    data: np.ndarray,
    layer_names: List[str],
    labels: List[str],
    grouped: bool,
) -> mcolors.Normalize:
    """The ``(n_tokens, n_layers)`` credits as an image on a colour scale
    symmetric around 0, with its colour bar, ticks and cell grid; returns the
    scale."""
    n_rows, n_layers = data.shape
    vmax = float(np.abs(data).max())
    vmax = vmax if vmax > 0 else 1.0
    norm = mcolors.Normalize(vmin=-vmax, vmax=vmax)
    image = ax.imshow(
        data, cmap=color_map(), norm=norm, aspect="auto", interpolation="nearest"
    )
    ax.grid(False)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    colorbar.set_label("credit (Δ probability)")
    if grouped:
        _grouped_ticks(ax, layer_names)
    else:
        layer_ticks(ax, layer_names)
    ax.set_yticks(np.arange(n_rows), labels=labels)
    ax.set_xlabel("block (its columns in order)" if grouped else "layer")
    ax.set_ylabel("attributed token")
    # Thin white grid between cells, so neighbouring equal colours stay apart.
    if not grouped:
        ax.set_xticks(np.arange(-0.5, n_layers, 1.0), minor=True)
    ax.set_yticks(np.arange(-0.5, n_rows, 1.0), minor=True)
    ax.grid(which="minor", color="#bbbbbb", linewidth=0.4)
    ax.tick_params(which="minor", length=0)
    return norm


def _text_color(norm: mcolors.Normalize, value: float) -> str:
    """Black on light cells, white on dark ones."""
    return "black" if 0.15 < norm(value) < 0.85 else "white"


def _write_values(ax: "Axes", data: np.ndarray, norm: mcolors.Normalize) -> None:
    """Each cell's credit, signed, to three decimals."""
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            val = data[i, j]
            ax.text(
                j,
                i,
                f"{val:+.3f}",
                ha="center",
                va="center",
                fontsize=7,
                color=_text_color(norm, val),
            )


def _box_onsets(ax: "Axes", onsets: List[int]) -> None:
    """A black frame (gid ``"onset"``) around each row's onset cell."""
    for i, j in enumerate(onsets):
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
    top_ids, rank = result.top_ids, result.rank
    assert top_ids is not None and rank is not None  # called with views only
    for i, p in enumerate(rows):
        for j in range(data.shape[1]):
            if result.top_tokens is not None:
                text = result.top_tokens[b][p][j][0]
            else:
                text = f"#{int(top_ids[b, p, j, 0])}"
            label = ax.text(
                j,
                i,
                repr(text)[1:-1][:6],
                ha="center",
                va="center",
                fontsize=6,
                fontweight="bold" if int(rank[b, p, j]) == 1 else "normal",
                color=_text_color(norm, data[i, j]),
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

    - the logit-lens level ``f(h_L)`` of each layer (``result.levels``, a line);
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
    p = _check_position(result, position, b, batch_index)
    _check_onset_frac(onset_frac)
    credits = result.attributions[b, p].detach().double().cpu().numpy()
    levels = result.levels[b, p].detach().double().cpu().numpy()
    base = float(result.base_prob[b, p])
    model_prob = float(result.model_prob[b, p])
    cumulative = base + np.cumsum(credits)
    n_layers = len(credits)
    fig, ax = _new_axes(ax, (max(8.0, 5.0 + 0.32 * n_layers), 4.6))
    _draw_waterfall(ax, credits, base, model_prob)
    _draw_levels(ax, levels, cumulative)
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
    layer_ticks(ax, ["base", *result.layer_names], start=-1)
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
    values = np.concatenate([[base, model_prob], levels, cumulative])
    low, high = min(0.0, float(values.min())), float(values.max())
    span = high - low if high > low else 1.0
    ax.set_ylim(low - (0.03 * span if low < 0 else 0.0), high + 0.08 * span)
    _trajectory_legend(ax)
    return _finish(fig, ax, show)


def _check_position(
    result: IGLensResult, position: int, b: int, batch_index: int
) -> int:
    """``position`` as an index into ``result.positions`` that is not padding in
    sequence ``b``."""
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
    return p


def _draw_waterfall(
    ax: "Axes", credits: np.ndarray, base: float, model_prob: float
) -> None:
    """The per-layer credits as bars from the cumulative level before each layer
    to the level after it, the model's probability (dashed) and the baseline
    level (at x = -1)."""
    cumulative = base + np.cumsum(credits)
    before = np.concatenate([[base], cumulative[:-1]])
    colors = [UP_COLOR if c >= 0 else DOWN_COLOR for c in credits]
    ax.bar(
        np.arange(len(credits)),
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


def _draw_levels(ax: "Axes", levels: np.ndarray, cumulative: np.ndarray) -> None:
    """The logit-lens level of each layer (a line) and the cumulative credit
    (hollow circles)."""
    x = np.arange(len(levels))
    ax.plot(
        x,
        levels,
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


def _trajectory_legend(ax: "Axes") -> None:
    """The legend, right of the axes, with the colours of the bars."""
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


def plot_source_map(
    result: IGLensResult,
    token: int = 0,
    batch_index: int = 0,
    *,
    ax: Optional["Axes"] = None,
    show: bool = False,
) -> Union[None, Tuple["Figure", "Axes"]]:
    r"""
    Plots, for one attributed token, its layer × source-token map: blocks
    (rows) by source positions (columns), cell ``(l, j)`` the credit block
    ``l``'s attention gave the token's probability from source ``j`` (heads
    summed), from a result of ``granularity="source"`` or ``"source_head"``.
    Green adds probability, red takes it back; the colour scale is symmetric
    around 0. Sources after the token's position (never read) are left out.

    Args:

        result (IGLensResult): The map.
        token (int, optional): Which attributed token (an index into
                    ``result.positions``; negative counts from the end).
                    Default: 0
        batch_index (int, optional): Which sequence. Default: 0
        ax (matplotlib.axes.Axes, optional): Axes to draw on. Default: None
        show (bool, optional): Show the figure and return None. Default: False

    Returns:
        None or 2-element tuple of **fig**, **ax**; ``ax.images[0]`` holds the
        ``(k, t + 1)`` credits.

    Raises:
        ValueError: If the result has no source columns, or ``token`` or
            ``batch_index`` is out of range or at padding.
    """
    b = _check_result(result, batch_index)
    n_tokens = result.positions.shape[0]
    if isinstance(token, bool) or not -n_tokens <= token < n_tokens:
        raise ValueError(f"token: expected an int in [-{n_tokens}, {n_tokens})")
    p = token % n_tokens
    if not bool(result.mask[b, p]):
        raise ValueError(f"token: attributed token {token} is padding")
    layout = result.source_layout()
    if layout is None:
        raise ValueError(
            'result: no per-source columns; attribute with granularity="source"'
        )
    last = min(int(result.positions[p]) + 1, layout.n_sources)
    data = result.source_map()[b, p, :, :last].float().cpu().numpy()
    sources = result.metadata.get("source_tokens")
    labels = [
        (repr(sources[b][j])[:16] if sources is not None else f"@{j}")
        for j in range(last)
    ]
    size = (min(24.0, 2.5 + 0.28 * last), min(24.0, 1.5 + 0.22 * len(layout.blocks)))
    fig, ax = _new_axes(ax, size)
    limit = float(np.abs(data).max()) or 1.0
    norm = mcolors.Normalize(vmin=-limit, vmax=limit)
    image = ax.imshow(data, cmap=color_map(), norm=norm, aspect="auto")
    fig.colorbar(image, ax=ax, label="credit (probability)")
    ax.set_xticks(range(last), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(layout.blocks)), layout.blocks, fontsize=7)
    ax.set_xlabel("source token")
    ax.set_ylabel("block")
    ax.set_title(
        f"{_token_text(result, b, p)} @{int(result.positions[p])}: attention credit "
        f"by block and source ({result.method}); "
        f"Σ = {data.sum():+.4f} of Δp "
        f"{float(result.model_prob[b, p] - result.base_prob[b, p]):+.4f}",
        fontsize=9,
    )
    return _finish(fig, ax, show)
