r"""
The layout of the credit columns of ``granularity="source"`` and
``"source_head"``, read from the column names alone (see
:class:`~captum_iglens.columns.Column`): ``"input"``, then per block
``"<block>.attn.s<j>"`` (or ``"<block>.attn.h<i>.s<j>"``), optionally
``"<block>.attn.bias"``, and ``"<block>.mlp"``.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens.columns import parse_columns


@dataclass(frozen=True)
class SourceLayout:
    r"""
    Where each (block, head, source) credit is among the columns.

    Attributes:
        blocks (list[str]): The ``k`` block names, in path order.
        n_heads (int or None): ``H`` for ``"source_head"``, None when the heads
                    are summed.
        n_sources (int): ``T``, the number of source positions.
        index (Tensor): ``(k, H, T)`` (``(k, 1, T)`` with heads summed) long:
                    the column of each credit.
        bias (list[int or None]): Per block, its bias column if any.
        mlp (list[int]): Per block, its MLP column.
    """

    blocks: List[str]
    n_heads: Optional[int]
    n_sources: int
    index: Tensor
    bias: List[Optional[int]]
    mlp: List[int]

    def source_map(self, credits: Tensor, by_head: bool = False) -> Tensor:
        r"""
        The source credits of ``credits`` ``(..., n_columns)``.

        Returns:
            *Tensor* ``(..., k, T)``, or ``(..., k, H, T)`` with ``by_head``.
        """
        found = credits[..., self.index.flatten()].view(
            *credits.shape[:-1], *self.index.shape
        )
        return found if by_head else found.sum(-2)


def source_layout(names: Sequence[str]) -> Optional[SourceLayout]:
    """The layout of ``names``, or None if they are not source columns."""
    blocks: List[str] = []
    cells: dict = {}
    bias: dict = {}
    mlp: dict = {}
    for i, column in enumerate(parse_columns(names)):
        if column.kind == "source":
            if column.block not in cells:
                blocks.append(str(column.block))
                cells[column.block] = {}
            head = -1 if column.index is None else column.index
            cells[column.block][(head, column.source)] = i
        elif column.kind == "bias" and column.part == "attn":
            bias[column.block] = i
        elif column.kind == "sublayer" and column.part == "mlp":
            mlp[column.block] = i
    if not blocks or any(b not in mlp for b in blocks):
        return None
    keys = sorted(cells[blocks[0]])
    heads = sorted({h for h, _ in keys})
    n_sources = 1 + max(j for _, j in keys)
    uneven = any(sorted(cells[b]) != keys for b in blocks)
    if uneven or len(keys) != len(heads) * n_sources:
        return None
    index = torch.tensor(
        [[[cells[b][(h, j)] for j in range(n_sources)] for h in heads] for b in blocks]
    )
    return SourceLayout(
        blocks=blocks,
        n_heads=None if heads == [-1] else len(heads),
        n_sources=n_sources,
        index=index,
        bias=[bias.get(b) for b in blocks],
        mlp=[mlp[b] for b in blocks],
    )


def _label(tokens: Optional[Sequence[str]], j: int) -> str:
    """A source as text: its token (escaped) and position."""
    if tokens is None or j >= len(tokens):
        return f"@{j}"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in tokens[j])
    return f"'{text}'@{j}"


def format_sources(
    layout: SourceLayout,
    credits: Tensor,
    labels: Sequence[str],
    sources: Optional[Sequence[str]],
    top: int = 5,
) -> str:
    r"""
    Per attributed token, its top source tokens (credit summed over the blocks
    and heads) and its strongest routes, source → block (→ head).

    Args:
        layout (SourceLayout): The columns' layout.
        credits (Tensor): ``(P, n_columns)``: one sequence's credits (its real
                    positions only).
        labels (list[str]): ``P`` token labels.
        sources (list[str], optional): ``T`` source tokens.
        top (int, optional): How many of each to list. Default: 5

    Returns:
        *str*: two lines per token.
    """
    by_head = layout.n_heads is not None
    cells = layout.source_map(credits, by_head=True)  # (P, k, H or 1, T)
    lines = []
    for p, label in enumerate(labels):
        per_source = cells[p].sum((0, 1))
        attention = float(per_source.sum())
        order = per_source.abs().argsort(descending=True)[:top].tolist()
        listed = ", ".join(
            f"{_label(sources, j)} {float(per_source[j]):+.3f}" for j in order
        )
        lines.append(f"{label}  sources (Σ attention {attention:+.4f}): {listed}")
        flat = cells[p].flatten()
        routes = []
        for i in flat.abs().argsort(descending=True)[:top].tolist():
            block, rest = divmod(i, cells.shape[2] * cells.shape[3])
            head, j = divmod(rest, cells.shape[3])
            where = f"L{layout.blocks[block]}" + (f".h{head}" if by_head else "")
            routes.append(f"{_label(sources, j)}→{where} {float(flat[i]):+.3f}")
        lines.append(f"{' ' * len(label)}  routes: {', '.join(routes)}")
    return "\n".join(lines)
