r"""
The runners of the source-token methods (registered in
:mod:`~captum_iglens.studies.methods.registry` with ``axis="sources"``): each
scores, for every attributed token, every source position ``0..T-1`` of its
sequence, an :class:`~captum_iglens.studies.methods.runners.Outcome` of
shape ``(B, P, T)``.

- ``lig_embeddings``: Captum's :class:`~captum.attr.LayerIntegratedGradients` on
  the embedding layer (input-token attribution, summed over the hidden
  dimension), ``F`` = the target's probability, ``x'`` = the baseline token
  everywhere, as the per-block Captum methods.
- ``attention_rollout``: Abnar & Zuidema (2020), the product over all blocks of
  ``0.5 · mean_h A^h + 0.5 · I`` (rows renormalised), read at the attributed
  position: a share of the input, not an attribution.
- ``ig_lens_sources``: IG-Lens with ``granularity="source"``, each source's
  credit summed over layers (the attention's part of ``Δp``; MLP and bias are
  no source).
"""

from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, cast

import torch
from captum.attr import LayerIntegratedGradients
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.hf.forward import position_ids_from_mask
from captum_iglens.studies.methods.registry import SOURCE_GRANULARITY
from captum_iglens.studies.methods.runners import (
    Outcome,
    TargetProbability,
    Work,
    _attribute_in_chunks,
)


def source_names(length: int) -> List[str]:
    r"""The names of the ``length`` source columns: their positions, ``"s0"``, ..."""
    return [f"s{i}" for i in range(length)]


def lig_embeddings(work: Work) -> Outcome:
    rows, extra = work.captum_rows()
    baseline = torch.full_like(rows, work.baseline_token)
    forward = TargetProbability(work.model, embeddings=False)
    embeddings = cast(Any, work.model).get_input_embeddings()  # a HF model's
    method = LayerIntegratedGradients(forward, embeddings)
    attributions, delta = _attribute_in_chunks(method, work, rows, baseline, extra)
    b, p = work.targets.shape
    scores = attributions.float().sum(-1).view(b, p, -1)
    delta = delta.view(b, p)
    change = scores.sum(-1) - delta  # F(x) − F(x')
    note = (
        "LayerIntegratedGradients on the embedding layer, summed over the hidden "
        f"dimension; F = p(target), x' = token {work.baseline_token} everywhere; "
        "Σ sources ≈ F(x) − F(x') (up to delta)."
    )
    names = source_names(scores.shape[-1])
    return Outcome(scores, change, change, "probability", note, delta, names)


@contextmanager
def _eager_attention(model: Module) -> Iterator[None]:
    """The model's eager attention (which returns its weights) inside the block;
    its own implementation restored on exit."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    if before is None or setter is None:
        raise ValueError(
            "attention_rollout: the model does not say which attention "
            "implementation it uses (a Hugging Face model with "
            "set_attn_implementation is needed)"
        )
    setter("eager")
    try:
        yield
    finally:
        setter(before)


def attention_weights(work: Work) -> List[Tensor]:
    r"""
    One forward with the eager attention: every block's weights, ``(B, H, T,
    T)`` each, in float64.
    """
    mask = work.attention_mask
    with _eager_attention(work.model), torch.no_grad():
        out = work.model(
            input_ids=work.input_ids,
            attention_mask=mask,
            position_ids=None if mask is None else position_ids_from_mask(mask),
            output_attentions=True,
            use_cache=False,
        )
    weights = list(out.attentions or [])
    if not weights or any(w is None for w in weights):
        raise ValueError(
            "attention_rollout: the model returned no attention weights for some "
            "blocks (a block without softmax attention); rollout needs them all"
        )
    return [w.double() for w in weights]


def rollout(weights: List[Tensor]) -> Tensor:
    r"""
    Attention rollout: ``R = Ã_L ⋯ Ã_1`` with ``Ã = 0.5 · mean_h A + 0.5 · I``,
    rows renormalised.

    Args:
        weights (list[Tensor]): Per block ``(B, H, T, T)``, rows summing to 1.

    Returns:
        *Tensor* ``(B, T, T)``: row ``t`` is position ``t``'s share of each
        source; rows sum to 1.
    """
    total = torch.eye(weights[0].shape[-1], dtype=weights[0].dtype)
    for a in weights:
        mixed = 0.5 * a.mean(1) + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
        total = (mixed / mixed.sum(-1, keepdim=True)) @ total
    return total


def attention_rollout(work: Work) -> Outcome:
    weights = attention_weights(work)
    shares = rollout(weights)  # (B, T, T)
    index = work.positions.to(shares.device)
    scores = shares[:, index].float().cpu()  # (B, P, T)
    ones = torch.ones(work.targets.shape)
    note = (
        f"attention rollout (Abnar & Zuidema 2020) over all {len(weights)} blocks: "
        "Π (0.5·mean_h A + 0.5·I), read at the attributed position; a share of the "
        "input (Σ sources = 1), not an attribution of p."
    )
    names = source_names(scores.shape[-1])
    return Outcome(scores, ones, ones, "share", note, None, names)


def source_granularity_missing() -> Optional[str]:
    r"""Why IG-Lens's source credits cannot be computed, or None when they can."""
    if SOURCE_GRANULARITY in GRANULARITIES:
        return None
    return (
        "ig_lens_sources needs IG-Lens's granularity='source', which this version "
        f"does not have (granularities: {', '.join(GRANULARITIES)})"
    )


def ig_lens_sources(work: Work) -> Outcome:
    missing = source_granularity_missing()
    if missing is not None:
        raise ValueError(missing)
    kwargs = dict(work.settings.map_kwargs(), granularity=SOURCE_GRANULARITY)
    result = work.ig_lens.attribute_map(
        work.input_ids,
        target=work.targets,
        additional_forward_args=work.extra,
        positions=work.positions,
        **kwargs,
    )
    scores = result.source_map().sum(2)  # (B, P, T): summed over blocks
    change = result.model_prob - result.base_prob
    note = (
        "IG-Lens granularity='source': each source token's attention credit summed "
        "over layers, in probability; Σ sources = the attention's part of Δp (MLP "
        "and bias are no source)."
    )
    names = source_names(scores.shape[-1])
    return Outcome(scores, scores.sum(-1), change, "probability", note, None, names)
