r"""Rank helpers of the agreement tables (per head, per source): ranks and
Spearman's correlation along the last dimension."""

import torch
from torch import Tensor


def ranks(scores: Tensor) -> Tensor:
    """Rank 1 for the largest score along the last dimension (ties in order)."""
    order = scores.argsort(dim=-1, descending=True)
    out = torch.empty_like(order)
    out.scatter_(-1, order, torch.arange(1, scores.shape[-1] + 1).expand_as(order))
    return out


def spearman(first: Tensor, second: Tensor) -> Tensor:
    r"""
    Spearman's rank correlation along the last dimension.

    Args:
        first (Tensor): ``(..., n)`` scores, ``n >= 2``.
        second (Tensor): ``(..., n)`` scores.

    Returns:
        *Tensor* ``(...)``: the Pearson correlation of the two rankings, in
        ``[-1, 1]``.
    """
    if first.shape != second.shape or first.shape[-1] < 2:
        raise ValueError(
            f"first/second: expected equal shapes (..., n >= 2), got "
            f"{tuple(first.shape)} and {tuple(second.shape)}"
        )
    a, b = ranks(first).double(), ranks(second).double()
    a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    return ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).float()
