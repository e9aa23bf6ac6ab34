r"""The viewer pages of the validation studies: ablation
(:class:`ValidationResult`) and restoration (:class:`RestorationResult`)."""

import math
from typing import Any, Dict, Optional

import numpy as np

from captum_iglens.viewer._payload import sig


def validation_page(result: Any) -> Dict[str, Any]:
    r"""
    The page data of the ablation study.

    Args:

        result (ValidationResult): ``N`` prompts, ``k`` blocks.

    Returns:
        *dict*: per prompt its token, ablation drops ``(k,)``, logit-lens
        trajectory ``(k + 1,)`` and the scores ``(k,)`` of each method that ran
        on it, and the summary table ``summary[group][method][metric]``.
    """
    prompts = []
    for i, fact in enumerate(result.facts):
        prompts.append(
            {
                "id": str(fact.id),
                "prompt": fact.prompt,
                "answer": fact.answer,
                "generated": result.generated[i],
                "correct": result.correct[i],
                "token": result.target_tokens[i],
                "prob": sig(result.model_prob[i]),
                "drops": sig(result.drops[i]),
                "trajectory": sig(result.trajectory[i]),
                "scores": _scores(result, i),
            }
        )
    return {
        "kind": "validation",
        "title": "IG-Lens validation",
        "layers": list(result.layer_names),
        "mode": result.mode,
        "methods": list(result.methods),
        "prompts": prompts,
        "summary": _summary(result.summary),
    }


def restoration_page(result: Any) -> Dict[str, Any]:
    r"""
    The page data of the restoration study.

    Args:

        result (RestorationResult): ``N`` facts, ``k`` blocks.

    Returns:
        *dict*: per fact its token, logit-lens trajectory ``(k + 1,)``, the
        scores ``(k,)`` and onsets of each method that ran on it, the IG-Lens
        share of the credit reached by each block ``(k,)`` and, per corruption
        that was traced on it, ``p_clean``, ``p_corrupt``, the recovery
        ``r(L)`` of restoring each block ``(k,)``, the causal onset, and each
        traced method's shares ``(k,)`` and onset under it; the summary table
        ``summary[corruption][group][method][metric]``.
    """
    facts = []
    for i, fact in enumerate(result.facts):
        credit = result.scores["ig_lens"][i]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.cumsum(credit) / credit.sum()
        facts.append(
            {
                "id": str(fact.id),
                "prompt": fact.prompt,
                "answer": fact.answer,
                "token": result.target_tokens[i],
                "trajectory": sig(result.trajectory[i]),
                "scores": _scores(result, i),
                "onsets": {m: _index(o[i]) for m, o in result.onsets.items()},
                "share": sig(share),
                "traces": _traces(result, i),
            }
        )
    keep = ("recovery_threshold", "onset_frac", "min_effect")
    return {
        "kind": "restoration",
        "title": "IG-Lens restoration",
        "layers": list(result.layer_names),
        "corruptions": list(result.corruptions),
        "methods": list(result.methods),
        "settings": {k: sig(result.settings[k]) for k in keep},
        "facts": facts,
        "summary": {str(c): _summary(s) for c, s in result.summary.items()},
    }


def _traces(result: Any, i: int) -> Dict[str, Any]:
    """Fact ``i`` under each corruption that was traced on it."""
    traces = {}
    for c in result.corruptions:
        probs = result.probs[c][i]
        if np.isnan(probs[0]):
            continue
        traced = result.traced_shares.get(c, {})
        ran = [m for m, shares in traced.items() if not np.isnan(shares[i]).any()]
        traces[c] = {
            "clean": sig(probs[0]),
            "corrupt": sig(probs[1]),
            "recovery": sig(result.recovery(c)[i]),
            "onset": _index(result.causal_onsets[c][i]),
            "shares": {m: sig(traced[m][i]) for m in ran},
            "onsets": {m: _index(result.traced_onsets[c][m][i]) for m in ran},
        }
    return traces


def _scores(result: Any, i: int) -> Dict[str, Any]:
    """The per-layer scores of token ``i``, of the methods that ran on it."""
    return {m: sig(s[i]) for m, s in result.scores.items() if not np.isnan(s[i]).all()}


def _index(value: float) -> Optional[int]:
    """A layer index stored as a float, NaN (none) as None."""
    return None if math.isnan(value) else int(value)


def _summary(summary: Dict[str, Any]) -> Dict[str, Any]:
    """``summary[group][method][metric]``: each statistic rounded."""
    return {
        str(group): {
            str(method): {
                str(metric): {key: sig(value) for key, value in stats.items()}
                for metric, stats in metrics.items()
            }
            for method, metrics in by_method.items()
        }
        for group, by_method in summary.items()
    }
