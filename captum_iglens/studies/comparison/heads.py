r"""Per-head IG-Lens credits beside per-head Direct Logit Attribution: which heads
each ranks first, and how well the two rankings agree (Spearman)."""

from typing import List

from torch import Tensor

from captum_iglens.columns import parse_columns
from captum_iglens.studies.comparison.ranking import ranks, spearman
from captum_iglens.studies.comparison.result import ComparisonResult

_FIRST, _SECOND = "ig_lens", "dla"


def head_columns(names: List[str]) -> List[int]:
    r"""The indices of the head columns (``"<block>.attn.h<i>"``) among ``names``."""
    return [i for i, column in enumerate(parse_columns(names)) if column.kind == "head"]


def _head_scores(result: ComparisonResult) -> List[Tensor]:
    missing = [m for m in (_FIRST, _SECOND) if m not in result.methods]
    if missing:
        raise ValueError(
            f"result: per-head agreement needs the methods {_FIRST!r} and "
            f"{_SECOND!r}; missing {missing}"
        )
    first, second = result.methods[_FIRST], result.methods[_SECOND]
    if first.layer_names != second.layer_names or not head_columns(first.layer_names):
        raise ValueError(
            "result: per-head agreement needs IG-Lens and DLA on the same head "
            "columns; run compare with granularity='head'"
        )
    heads = head_columns(first.layer_names)
    return [first.scores[..., heads], second.scores[..., heads]]


def head_rank_agreement(result: ComparisonResult) -> Tensor:
    r"""
    Spearman's rank correlation between IG-Lens's head credits (probability) and
    DLA's head scores (logits), per attributed token.

    Args:
        result (ComparisonResult): From :func:`compare` with
                    ``granularity="head"`` and the methods ``"ig_lens"`` and
                    ``"dla"``.

    Returns:
        *Tensor* ``(B, P)`` float32; NaN at padding.
    """
    ig, dla = _head_scores(result)
    rho = spearman(ig, dla)
    return rho.masked_fill(~result.mask, float("nan"))


def format_head_agreement(
    result: ComparisonResult, sequence: int = 0, top: int = 10
) -> str:
    r"""
    A plain-text table per attributed token of one sequence: the ``top`` heads by
    IG-Lens credit, each with its credit, its DLA score and its DLA rank, and the
    Spearman correlation of the two rankings over all heads.

    Args:
        result (ComparisonResult): As in :func:`head_rank_agreement`.
        sequence (int, optional): The sequence. Default: 0
        top (int, optional): Heads shown per token. Default: 10

    Returns:
        *str*: the table.
    """
    ig, dla = _head_scores(result)
    names = [
        result.methods[_FIRST].layer_names[i]
        for i in head_columns(result.methods[_FIRST].layer_names)
    ]
    rho = spearman(ig, dla)
    ig_rank, dla_rank = ranks(ig), ranks(dla)
    lines = [
        f"per-head IG-Lens credit (probability) beside DLA (logit) over "
        f"{len(names)} heads; rank 1 = largest"
    ]
    for row in result.mask[sequence].nonzero()[:, 0].tolist():
        lines.append(
            f"{result.label(sequence, row)}: Spearman ρ = {rho[sequence, row]:+.3f}"
        )
        lines.append(
            f"  {'head':<14}{'IG-Lens':>10}{'rank':>6}{'DLA':>10}{'DLA rank':>10}"
        )
        order = ig_rank[sequence, row].argsort()[:top].tolist()
        for i in order:
            lines.append(
                f"  {names[i]:<14}{ig[sequence, row, i]:>+10.4f}"
                f"{int(ig_rank[sequence, row, i]):>6}{dla[sequence, row, i]:>+10.3f}"
                f"{int(dla_rank[sequence, row, i]):>10}"
            )
    return "\n".join(lines)
