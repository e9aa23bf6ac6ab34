r"""IG-Lens's per-source credits (summed over blocks) beside the source-token
methods, LayerIntegratedGradients on the embeddings and attention rollout: how
each orders the earlier tokens by importance, and how well the orders agree
(Spearman, per answer token)."""

from typing import Any, Dict, List

import torch
from torch import Tensor

from captum_iglens.studies.methods.registry import METHODS
from captum_iglens.studies.comparison.ranking import ranks, spearman

#: The method the others are ranked against.
REFERENCE = "ig_lens_sources"


def _others(result: Any) -> List[str]:
    return [
        name
        for name in result.methods
        if name != REFERENCE and name in METHODS and METHODS[name].axis == "sources"
    ]


def has_source_agreement(result: Any) -> bool:
    r"""Whether ``result`` has IG-Lens's source credits and another source-token
    method to rank against them."""
    return REFERENCE in result.methods and bool(_others(result))


def source_methods(result: Any) -> List[str]:
    r"""The source-token methods of ``result`` other than :data:`REFERENCE`, in
    the order run; raises unless IG-Lens's source credits and one other are
    there."""
    others = _others(result)
    if not has_source_agreement(result):
        raise ValueError(
            f"result: source rank agreement needs the method {REFERENCE!r} and "
            "another source-token method (lig_embeddings, attention_rollout); got "
            f"{list(result.methods)}"
        )
    return others


def _causal(result: Any, name: str, b: int, p: int) -> Tensor:
    """``|score|`` of method ``name`` over the sources ``0..position``."""
    position = int(result.positions[p])
    return result.methods[name].scores[b, p, : position + 1].abs()


def source_rank_agreement(result: Any) -> Dict[str, Tensor]:
    r"""
    Spearman's rank correlation, per attributed token, between IG-Lens's
    per-source credits summed over blocks and each other source-token method's
    scores, both by magnitude (``|score|``: the order of importance; rollout's
    shares have no sign), over the sources the token can see, ``0..position``.

    Args:
        result (ComparisonResult): From :func:`compare` with the methods
                    ``"ig_lens_sources"`` and ``"lig_embeddings"`` and/or
                    ``"attention_rollout"``.

    Returns:
        *dict[str, Tensor]*: per other method, ``(B, P)`` float32; NaN at
        padding and where fewer than two sources are visible.
    """
    others = source_methods(result)
    b_size, p_size = result.targets.shape
    out = {}
    for name in others:
        rho = torch.full((b_size, p_size), float("nan"))
        for b, p in result.mask.nonzero().tolist():
            first = _causal(result, REFERENCE, b, p)
            if first.numel() >= 2:
                rho[b, p] = spearman(first, _causal(result, name, b, p))
        out[name] = rho
    return out


def format_source_agreement(result: Any, sequence: int = 0, top: int = 5) -> str:
    r"""
    A plain-text table per attributed token of one sequence: Spearman's ρ of
    each source-token method against IG-Lens's per-source credits, then the
    ``top`` sources by IG-Lens credit, each with its credit and its rank under
    every method.

    Args:
        result (ComparisonResult): As in :func:`source_rank_agreement`.
        sequence (int, optional): The sequence. Default: 0
        top (int, optional): Sources shown per token. Default: 5

    Returns:
        *str*: the table.
    """
    rho = source_rank_agreement(result)
    others = list(rho)
    names = result.methods[REFERENCE].layer_names
    lines = [
        "per-source agreement: Spearman ρ of |score| against IG-Lens's per-source "
        "credit (summed over blocks), over the sources 0..position; rank 1 = "
        "largest |score|"
    ]
    for p in result.mask[sequence].nonzero()[:, 0].tolist():
        agreement = ", ".join(f"ρ({n}) = {rho[n][sequence, p]:+.3f}" for n in others)
        lines.append(f"{result.label(sequence, p)}: {agreement}")
        lines.append(
            f"  {'source':<22}{'IG-Lens':>10}{'rank':>6}"
            + "".join(f"{n[:16] + ' rank':>22}" for n in others)
        )
        reference = _causal(result, REFERENCE, sequence, p)
        order_of = {n: ranks(_causal(result, n, sequence, p)) for n in others}
        signed = result.methods[REFERENCE].scores[sequence, p]
        order = ranks(reference).argsort()[:top].tolist()
        for j in order:
            cells = "".join(f"{int(order_of[n][j]):>22}" for n in others)
            lines.append(
                f"  {names[j][:22]:<22}{signed[j]:>+10.4f}"
                f"{int(ranks(reference)[j]):>6}{cells}"
            )
    return "\n".join(lines)
