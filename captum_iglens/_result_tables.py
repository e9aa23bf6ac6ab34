r"""
The plain-text tables of an :class:`~captum_iglens.result.IGLensResult`, one
sequence at a time: the credits (:func:`format_table`), what each layer predicts
(:func:`format_views`) and the source routes (:func:`format_sources`). The
result's methods of the same names call these.

The result is taken as it is (``Any``): the result module imports this one, and
no module imports back up (see ``tests/test_layout.py``).
"""

from typing import Any, List, Optional

from torch import Tensor

from captum_iglens._utils.source_columns import format_sources as _source_lines
from captum_iglens.columns import parse_columns

#: How many characters of a token's text a table shows.
LABEL_WIDTH = 16


def visible(text: str) -> str:
    """Text with its non-printable characters (newlines, tabs) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def token_labels(result: Any, batch_index: int) -> List[str]:
    r"""The ``P`` target tokens of one sequence as short labels: their text
    (escaped, cut to 16 characters) when the result has ``tokens``, else
    ``#<id>``."""
    if result.tokens is not None:
        return [visible(t)[:LABEL_WIDTH] for t in result.tokens[batch_index]]
    return [f"#{int(t)}" for t in result.targets[batch_index]]


def view_field(result: Any, name: str) -> Tensor:
    """A view field (``top_ids``, ``rank``, ...), refused without views."""
    value = getattr(result, name)
    if value is None:
        raise ValueError("result: no views; attribute with top_k >= 1")
    return value


def _check_batch_index(result: Any, batch_index: int) -> None:
    size = result.attributions.shape[0]
    if not 0 <= batch_index < size:
        raise ValueError(
            f"batch_index: expected 0 <= batch_index < {size}, got {batch_index}"
        )


#: A map notes its credits' error bound where it exceeds this.
CREDIT_ERROR_NOTE = 1e-3


def format_table(
    result: Any,
    batch_index: int,
    width: int,
    onset_frac: float,
    companion: Optional[Any] = None,
) -> str:
    r"""See :meth:`IGLensResult.format_table
    <captum_iglens.result.IGLensResult.format_table>`."""
    _check_batch_index(result, batch_index)
    maps = [result] if companion is None else [result, _companion(result, companion)]
    onsets = [(m.path, m.layer_names, m.onset(onset_frac)[batch_index]) for m in maps]
    names = result.layer_names
    rows = result.mask[batch_index].nonzero()[:, 0].tolist()
    credits = result.attributions[batch_index]
    labels = token_labels(result, batch_index)
    token_w = max([5] + [len(labels[r]) for r in rows])
    col_w = max(7, 1 + max(len(n) for n in names))
    onset_w = [max(col_w, len(path) + 1) for path, _, _ in onsets]
    fixed = token_w + 4 * 9 + sum(onset_w) + 6
    k = len(names)
    fits = max(1, (width - fixed) // (col_w + 1))
    if fits >= k:
        shown = list(range(k))
    else:
        score = credits[rows].abs().amax(0) if rows else credits.abs().amax(0)
        shown = sorted(score.topk(fits).indices.tolist())
    change = result.model_prob[batch_index] - result.base_prob[batch_index]
    head = [f"{'token':<{token_w}}"]
    head += [f"{'L' + names[j]:>{col_w}}" for j in shown]
    head += [f"{c:>8}" for c in ("lens@top", "Σ", "Δp", "p_model")]
    if companion is None:
        head.append(f"{'onset':>{col_w}}")
    else:  # the onset of each path, headed by the path's name
        head += [f"{path:>{w}}" for (path, _, _), w in zip(onsets, onset_w)]
    lines = [" ".join(head)]
    for r in rows:
        cells = [f"{labels[r]:<{token_w}}"]
        cells += [f"{credits[r, j]:>+{col_w}.3f}" for j in shown]
        cells += [
            f"{result.levels[batch_index, r, -1]:>8.4f}",
            f"{result.total[batch_index, r]:>+8.4f}",
            f"{change[r]:>+8.4f}",
            f"{result.model_prob[batch_index, r]:>8.4f}",
        ]
        cells += [
            f"{at_names[at[r]] if at[r] >= 0 else '-':>{w}}"
            for (_, at_names, at), w in zip(onsets, onset_w)
        ]
        lines.append(" ".join(cells))
    if len(shown) < k:
        what = _columns_word(result.layer_names)
        lines.append(
            f"(showing {len(shown)} of {k} {what}, those with the largest "
            f"|credit|; Σ includes all {what})"
        )
    residual = (
        (result.total[batch_index] - change)[rows].abs().max().item() if rows else 0.0
    )
    if result.lens_change is not None:
        parts = result.lens_change[batch_index]
        lines.append(
            f"lens-change part ({result.readout_kind} readout; in the credits "
            "above, block part = credit - lens change):"
        )
        for r in rows:
            cells = [f"{labels[r]:<{token_w}}"]
            cells += [f"{parts[r, j]:>+{col_w}.3f}" for j in shown]
            cells.append(f"{'':>8} {parts[r].sum():>+8.4f}")
            lines.append(" ".join(cells))
    lines.append(f"completeness: max |Σ - Δp| = {residual:.2e} over {len(rows)} tokens")
    if result.credit_error is not None and rows:
        bound = result.credit_error[batch_index][rows].max().item()
        if bound > CREDIT_ERROR_NOTE:
            lines.append(
                f"credit error: each credit within ±{bound:.1e} of its integral "
                f"({result.method}'s own bound; a larger --n-steps narrows it)"
            )
    return "\n".join(lines)


def _columns_word(names: List[str]) -> str:
    """What the table's columns are called: ``"layers"`` where each is a block
    (or the input), else ``"columns"`` (heads, neurons, sublayers...)."""
    kinds = {column.kind for column in parse_columns(names)}
    return "layers" if kinds <= {"block", "input"} else "columns"


def format_views(result: Any, batch_index: int, width: int) -> str:
    r"""See :meth:`IGLensResult.format_views
    <captum_iglens.result.IGLensResult.format_views>`."""
    if not result.has_views:
        raise ValueError("result: no views; attribute with top_k >= 1")
    _check_batch_index(result, batch_index)
    b, names = batch_index, result.layer_names
    k, rank = len(names), view_field(result, "rank")
    rows = result.mask[b].nonzero()[:, 0].tolist()
    labels = token_labels(result, b)
    token_w = max([5] + [len(labels[r]) for r in rows])
    col_w = max(10, 1 + max(len(n) for n in names))
    fits = max(2, (width - token_w - 1) // (col_w + 1))
    shown = list(range(k))
    if fits < k:
        shown = sorted({round(i * (k - 1) / (fits - 1)) for i in range(fits)})
    head = [f"{'token':<{token_w}}"]
    head += [f"{'L' + names[j]:>{col_w}}" for j in shown]
    lines = ["what each layer predicts (top-1 token; * = the target)"]
    lines.append(" ".join(head))
    for r in rows:
        cells = [f"{labels[r]:<{token_w}}"]
        for j in shown:
            text = _top_label(result, b, r, j, 0, col_w - 1)
            mark = "*" if int(rank[b, r, j]) == 1 else ""
            cells.append(f"{text + mark:>{col_w}}")
        lines.append(" ".join(cells))
    lines.append("rank of the target (1 = top)")
    lines.append(" ".join(head))
    for r in rows:
        cells = [f"{labels[r]:<{token_w}}"]
        cells += [f"{int(rank[b, r, j]):>{col_w}}" for j in shown]
        lines.append(" ".join(cells))
    if len(shown) < k:
        what = _columns_word(names)
        lines.append(f"(showing {len(shown)} of {k} {what}, evenly spaced)")
    top = view_field(result, "top_ids").shape[-1]
    lines.append(f"the model's own top {top} (last layer), with probabilities")
    for r in rows:
        probs = view_field(result, "top_probs")[b, r, -1].tolist()
        best = ", ".join(
            f"{_top_label(result, b, r, k - 1, i, 16)} {probs[i]:.3f}"
            for i in range(top)
        )
        lines.append(f"{labels[r]:<{token_w}} {best}")
    return "\n".join(lines)


def _top_label(result: Any, b: int, p: int, j: int, i: int, width: int) -> str:
    """The ``i``-th top token of layer ``j`` as a short quoted label (so that
    spaces show), cut to ``width`` characters."""
    if result.top_tokens is None:
        return f"#{int(view_field(result, 'top_ids')[b, p, j, i])}"[:width]
    text = repr(result.top_tokens[b][p][j][i])
    return text if len(text) <= width else text[: width - 2] + "…" + text[-1]


def format_sources(result: Any, batch_index: int, top: int) -> str:
    r"""See :meth:`IGLensResult.format_sources
    <captum_iglens.result.IGLensResult.format_sources>`."""
    layout = result.source_layout()
    if layout is None:
        raise ValueError(
            "format_sources: this result has no per-source columns; attribute "
            'with granularity="source" (or "source_head")'
        )
    _check_batch_index(result, batch_index)
    rows = result.mask[batch_index].nonzero()[:, 0].tolist()
    labels = token_labels(result, batch_index)
    width = max([5] + [len(labels[r]) for r in rows])
    sources = result.metadata.get("source_tokens")
    return _source_lines(
        layout,
        result.attributions[batch_index, rows],
        [labels[r].ljust(width) for r in rows],
        None if sources is None else sources[batch_index],
        top,
    )


def _companion(result: Any, companion: Any) -> Any:
    """``companion``, checked to hold the same tokens as ``result``."""
    same = (
        companion.targets.shape == result.targets.shape
        and bool((companion.targets == result.targets).all())
        and bool((companion.mask == result.mask).all())
    )
    if not same:
        raise ValueError(
            "companion: expected a result of the same tokens (targets and mask), "
            "e.g. the block map of the same call on another path"
        )
    return companion
