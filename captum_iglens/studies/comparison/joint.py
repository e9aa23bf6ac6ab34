r"""The joint path beside DLA, per attributed token: how well their rankings of
the blocks agree (Spearman), the joint path's completeness ``|Σ − Δp|``, and
DLA's distance from additivity once mapped to probability (``dla_prob``)."""

from typing import Dict

import torch
from torch import Tensor

from captum_iglens.studies.comparison.ranking import spearman
from captum_iglens.studies.comparison.result import ComparisonResult

_JOINT, _DLA, _DLA_PROB = "ig_lens_joint", "dla", "dla_prob"


def has_joint_agreement(result: ComparisonResult) -> bool:
    r"""Whether ``result`` holds the joint path and DLA on the same columns."""
    methods = result.methods
    return (
        _JOINT in methods
        and _DLA in methods
        and methods[_JOINT].layer_names == methods[_DLA].layer_names
        and len(methods[_JOINT].layer_names) >= 2
    )


def joint_agreement(result: ComparisonResult) -> Dict[str, Tensor]:
    r"""
    Per attributed token: Spearman's rank correlation between the joint path's
    credits and DLA's scores over the columns, the joint path's ``|Σ − Δp|``,
    and (where ``"dla_prob"`` ran) DLA's ``|Σ − Δp|`` in probability.

    Args:
        result (ComparisonResult): From :func:`compare` with the methods
                    ``"ig_lens_joint"`` and ``"dla"`` (and ``"dla_prob"``).

    Returns:
        *dict* of ``(B, P)`` float32 tensors, NaN at padding: ``"spearman"``,
        ``"joint_residual"`` and, where ``"dla_prob"`` ran,
        ``"dla_prob_residual"``.

    Raises:
        ValueError: If the joint path or DLA is missing, or they are on other
            columns.
    """
    if not has_joint_agreement(result):
        raise ValueError(
            f"result: the joint path's agreement needs {_JOINT!r} and {_DLA!r} on "
            "the same columns (at least two); run compare with both"
        )
    joint, dla = result.methods[_JOINT], result.methods[_DLA]
    out = {
        "spearman": spearman(joint.scores, dla.scores),
        "joint_residual": joint.residual,
    }
    if _DLA_PROB in result.methods:
        out["dla_prob_residual"] = result.methods[_DLA_PROB].residual
    padding = ~result.mask
    return {k: v.float().masked_fill(padding, float("nan")) for k, v in out.items()}


def format_joint_agreement(result: ComparisonResult, sequence: int = 0) -> str:
    r"""
    A plain-text table of one sequence: per attributed token, the rank
    agreement of the joint path with DLA over the columns, the joint path's
    ``|Σ − Δp|`` and DLA's ``|Σ − Δp|`` in probability (``dla_prob``).

    Args:
        result (ComparisonResult): As in :func:`joint_agreement`.
        sequence (int, optional): The sequence. Default: 0

    Returns:
        *str*: the table.
    """
    found = joint_agreement(result)
    missing = torch.full_like(found["spearman"], float("nan"))
    dla_prob = found.get("dla_prob_residual", missing)
    lines = [
        f"joint path beside DLA over {len(result.methods[_JOINT].layer_names)} "
        "columns: Spearman ρ of the rankings; |Σ − Δp| of the joint credits and "
        "of DLA mapped to probability (dla_prob)",
        f"  {'token':<28}{'ρ':>8}{'joint |Σ−Δp|':>15}{'dla_prob |Σ−Δp|':>18}",
    ]
    for row in result.mask[sequence].nonzero()[:, 0].tolist():
        lines.append(
            f"  {result.label(sequence, row):<28}"
            f"{found['spearman'][sequence, row]:>+8.3f}"
            f"{found['joint_residual'][sequence, row]:>15.2e}"
            f"{dla_prob[sequence, row]:>18.2e}"
        )
    return "\n".join(lines)
