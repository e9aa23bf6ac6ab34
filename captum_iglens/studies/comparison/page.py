r"""The viewer page of a comparison of methods (see
:class:`~captum_iglens.studies.ComparisonResult`)."""

from typing import Any, Dict

from captum_iglens.studies.comparison.sources import (
    REFERENCE,
    has_source_agreement,
    source_rank_agreement,
)
from captum_iglens.viewer._payload import RESIDUAL_DIGITS, about, sig


def comparison_page(result: Any) -> Dict[str, Any]:
    r"""
    The page data of a comparison.

    Args:

        result (ComparisonResult): ``B`` sequences, ``P`` attributed positions.

    Returns:
        *dict*: per sequence the attributed tokens, and per method its columns,
        scores, ``Δp``, expected sum and residual ``|Σ − Δp|`` per token; with
        IG-Lens's source credits and another source-token method, each one's
        Spearman ρ against them per token (``agreement``; see
        :func:`~captum_iglens.studies.comparison.sources.source_rank_agreement`).
    """
    agreement = source_rank_agreement(result) if has_source_agreement(result) else {}
    sequences = []
    for b in range(result.targets.shape[0]):
        rows = result.mask[b].nonzero()[:, 0].tolist()
        labels = []
        for p in rows:
            target = int(result.targets[b, p])
            given = result.input_tokens[b][p] if result.input_tokens else ""
            text = result.tokens[b][p] if result.tokens else f"#{target}"
            labels.append(
                {"token": text, "given": given, "pos": int(result.positions[p])}
            )
        methods = []
        for name, m in result.methods.items():
            methods.append(
                {
                    "name": name,
                    "unit": m.unit,
                    "note": m.note,
                    "layers": list(m.layer_names),
                    "scores": sig(m.scores[b, rows]),
                    "sum": sig(m.layer_sum[b, rows]),
                    "dp": sig(m.prob_change[b, rows]),
                    "expected": sig(m.expected[b, rows]),
                    "resid": sig(m.residual[b, rows], RESIDUAL_DIGITS),
                }
            )
        rho = {name: sig(value[b, rows]) for name, value in agreement.items()}
        sequences.append({"rows": labels, "methods": methods, "agreement": rho})
    return {
        "kind": "comparison",
        "title": "IG-Lens comparison",
        "layers": list(result.layer_names),
        "about": about(result),
        "reference": REFERENCE,
        "sequences": sequences,
    }
