r"""
The data of a viewer page, plain JSON-ready values: floats rounded to
:data:`DIGITS` significant digits (the precision the page shows), rows of
attributed tokens only, so that a 200-token by 30-layer map with its top-5 views
stays well under 2 MB.

Each result kind builds its own page data (its ``page_data`` method, see
:class:`~captum_iglens.viewer.Viewable`) from the helpers here: :func:`sig` for
numbers, :func:`about` for a result's metadata, and the map page's rows
(:func:`map_sequences`) and column groups
(:func:`~captum_iglens.viewer._columns.column_groups`), which the map and the
prompt-set pages share. The helpers read results by their fields and import no
result class.
"""

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from captum_iglens.settings import model_name
from captum_iglens.viewer._columns import column_groups

#: Significant digits of every number in a page (and shown by it).
DIGITS = 4
#: Significant digits of a completeness residual ``|Σ − Δp|``.
RESIDUAL_DIGITS = 3

#: The optional per-layer views of an IG-Lens map, read when the result has them.
VIEWS = ("top_ids", "top_probs", "top_tokens", "entropy", "kl", "rank")


def sig(value: Any, digits: int = DIGITS) -> Any:
    r"""``value`` (a number, tensor, array or nested list) as nested lists of
    floats rounded to ``digits`` significant digits; NaN, inf and None (a loaded
    result's NaN) become None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [sig(item, digits) for item in value]
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


class Vocab:
    """The strings of the top-token views, stored once per page."""

    def __init__(self) -> None:
        self.index: Dict[str, int] = {}
        self.strings: List[str] = []

    def __call__(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.strings)
            self.strings.append(text)
        return self.index[text]


def _views(result: Any) -> Dict[str, Any]:
    views = {name: getattr(result, name, None) for name in VIEWS}
    return {
        name: value.tolist() if isinstance(value, torch.Tensor) else value
        for name, value in views.items()
    }


def _top_rows(views: Dict[str, Any], b: int, p: int, vocab: Vocab) -> Dict[str, Any]:
    """The optional views of one token: per layer, the top tokens (indices into
    the page's vocabulary), their probabilities, entropy, KL and target rank."""
    row: Dict[str, Any] = {}
    ids, texts = views["top_ids"], views["top_tokens"]
    if views["top_probs"] is not None and (ids is not None or texts is not None):
        probs = views["top_probs"][b][p]
        k, top_k = len(probs), len(probs[0]) if len(probs) else 0
        row["top"] = [
            [
                vocab(
                    texts[b][p][j][i]
                    if texts is not None
                    else f"#{int(ids[b][p][j][i])}"
                )
                for i in range(top_k)
            ]
            for j in range(k)
        ]
        row["topp"] = sig(probs)
    for name in ("entropy", "kl"):
        if views[name] is not None:
            row[name] = sig(views[name][b][p])
    if views["rank"] is not None:
        row["rank"] = [int(r) for r in views["rank"][b][p]]
    return row


def map_sequences(result: Any, vocab: Optional[Vocab] = None) -> List[Dict[str, Any]]:
    r"""
    The rows of an IG-Lens map, one list per sequence.

    Args:

        result (IGLensResult): ``(B, P, k)``.
        vocab (optional): Collects the top-token strings; a new one by default.

    Returns:
        *list[dict]*: per sequence, ``rows``: one object per attributed
        (non-padding) token with its text, position, target id, ``credit`` and
        ``lens`` (``k`` each), ``base``, ``prob`` (``p_model``), ``sum``, ``dp``,
        ``resid`` (``|Σ − Δp|``, from the unrounded values), ``onset`` (a column
        index or -1), under a learned readout ``change`` (the lens-change part of
        each credit, ``k``) and, when the result has them, the top-token views.
    """
    vocab = vocab if vocab is not None else Vocab()
    views = _views(result)
    onset = result.onset()
    total = result.attributions.double().sum(-1)
    change = result.model_prob.double() - result.base_prob.double()
    sequences = []
    for b in range(result.attributions.shape[0]):
        rows = []
        for p in result.mask[b].nonzero()[:, 0].tolist():
            target = int(result.targets[b, p])
            text = result.tokens[b][p] if result.tokens is not None else f"#{target}"
            row = {
                "token": text,
                "pos": int(result.positions[p]),
                "id": target,
                "credit": sig(result.attributions[b, p]),
                "lens": sig(result.levels[b, p]),
                "base": sig(result.base_prob[b, p]),
                "prob": sig(result.model_prob[b, p]),
                "sum": sig(total[b, p]),
                "dp": sig(change[b, p]),
                "resid": sig((total[b, p] - change[b, p]).abs(), RESIDUAL_DIGITS),
                "onset": int(onset[b, p]),
            }
            if result.lens_change is not None:  # a learned readout per layer
                row["change"] = sig(result.lens_change[b, p])
            if result.credit_error is not None:  # the estimator's own error bound
                row["error"] = sig(result.credit_error[b, p])
            row.update(_top_rows(views, b, p, vocab))
            rows.append(row)
        sequences.append({"rows": rows})
    return sequences


def about(result: Any) -> Dict[str, str]:
    r"""The metadata a page shows in its header: the prompt, answer, model,
    granularity, baselines and positions of ``result.metadata``, where they are
    strings."""
    metadata = dict(getattr(result, "metadata", {}) or {})
    keep = ("prompt", "answer", "model", "granularity", "baselines", "positions")
    about = {key: metadata[key] for key in keep if key in metadata}
    if isinstance(about.get("model"), str):
        about["model"] = model_name(about["model"])
    if getattr(result, "learned_readout", False):
        kind = result.readout_kind
        checksum = str(getattr(result, "readout_checksum", ""))[:16]
        about["readout"] = f"{kind} lens per layer (checksum {checksum})"
    return {key: value for key, value in about.items() if isinstance(value, str)}


def batch_payload(
    items: Sequence[Dict[str, Any]], run: Dict[str, Any]
) -> Dict[str, Any]:
    r"""
    The page data of a prompt set.

    Args:

        items (list[dict]): One per prompt: ``id``, ``prompt``, ``answer`` and
                    ``result`` (a one-sequence IGLensResult).
        run (dict): The run's settings (``run.json``); a few are shown.

    Returns:
        *dict*: the layers, each prompt's map, the mean credit per layer over
        every attributed token of every prompt (with the mean ``Δp`` it sums
        to), the count of onsets per layer and the caption of a token's
        trajectory on the prompts' path (their ``trajectory_caption``).
    """
    layers: List[str] = []
    vocab = Vocab()
    credit_sum: Optional[torch.Tensor] = None
    change_sum, n_tokens = 0.0, 0
    prompts = []
    for item in items:
        result = item["result"]
        if not layers:
            layers = list(result.layer_names)
            credit_sum = torch.zeros(len(layers), dtype=torch.float64)
            onsets = [0] * len(layers)
        if list(result.layer_names) != layers:
            raise ValueError(
                f"items: prompt {item['id']!r} has layers {result.layer_names}, "
                f"expected {layers}"
            )
        mask = result.mask[0]
        credit_sum += result.attributions[0][mask].double().sum(0)
        change_sum += (result.model_prob[0] - result.base_prob[0]).double()[mask].sum()
        n_tokens += int(mask.sum())
        for j in result.onset()[0][mask].tolist():
            if j >= 0:
                onsets[j] += 1
        (sequence,) = map_sequences(result, vocab)
        prompts.append(
            {
                "id": str(item["id"]),
                "prompt": str(item["prompt"]),
                "answer": str(item["answer"]),
                "rows": sequence["rows"],
            }
        )
    mean: Any = (credit_sum / max(n_tokens, 1)) if credit_sum is not None else []
    mean_change = float(change_sum) / max(n_tokens, 1)
    keep = ("model", "method", "n_steps", "granularity", "baselines", "positions")
    shown = {k: str(run[k]) for k in keep if k in run and run[k] is not None}
    if "model" in shown:
        shown["model"] = model_name(shown["model"])
    return {
        "kind": "batch",
        "title": "IG-Lens prompt set",
        "layers": layers,
        "groups": column_groups(layers),
        "about": shown,
        "mean_credit": sig(mean),
        "mean_credit_sum": sig(float(sum(mean)) if n_tokens else 0.0),
        "mean_dp": sig(mean_change),
        "n_tokens": n_tokens,
        "onsets": onsets if layers else [],
        "trajectory": items[0]["result"].trajectory_caption if items else None,
        "prompts": prompts,
        "vocab": vocab.strings,
    }


def payload(result: Any) -> Dict[str, Any]:
    r"""
    The page data of a result: what its own ``page_data`` method builds (see
    :class:`~captum_iglens.viewer.Viewable`).

    Args:

        result (Viewable): Any result kind with a viewer page (an IGLensResult
                    or a study's result).

    Returns:
        *dict*: JSON-ready values with ``kind`` and ``title``.
    """
    page_data = getattr(result, "page_data", None)
    if not callable(page_data):
        raise TypeError(
            "result: expected a result with a viewer page (a "
            "captum_iglens.viewer.Viewable, such as an IGLensResult), got "
            f"{type(result).__name__}"
        )
    return page_data()
