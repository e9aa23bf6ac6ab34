"""Synthetic IG-Lens results for the viewer's tests: any number of positions and
layers, with or without the optional top-token views, made without a model."""

from typing import List, Optional

import torch

from captum_iglens import IGLensResult


def synthetic_result(
    positions: int = 6,
    layers: int = 5,
    *,
    batch: int = 1,
    top_k: Optional[int] = 5,
    tokens: Optional[List[str]] = None,
    layer_names: Optional[List[str]] = None,
    seed: int = 0,
) -> IGLensResult:
    r"""
    A consistent ``(batch, positions, layers)`` map: a random logit-lens
    trajectory per token, credits its differences (so they add up to ``Δp``),
    and, unless ``top_k`` is None, the optional views (``top_ids``,
    ``top_probs``, ``top_tokens``, ``entropy``, ``kl``, ``rank``) set as
    attributes the way a result that has them carries them.
    """
    gen = torch.Generator().manual_seed(seed)
    b, p, k = batch, positions, layers
    levels = torch.sigmoid(torch.randn(b, p, k + 1, generator=gen).cumsum(-1) - 1)
    base, lens = levels[..., 0].contiguous(), levels[..., 1:].contiguous()
    attributions = torch.diff(levels, dim=-1)
    model_prob = lens[..., -1].clone()
    delta = attributions.sum(-1) - (model_prob - base)
    words = tokens or [f" w{i}" for i in range(p)]
    result = IGLensResult(
        attributions=attributions,
        levels=lens,
        base_prob=base,
        model_prob=model_prob,
        delta=delta,
        targets=torch.randint(0, 1000, (b, p), generator=gen),
        positions=torch.arange(10, 10 + p),
        mask=torch.ones(b, p, dtype=torch.bool),
        layer_names=layer_names or [str(i) for i in range(k)],
        method="prediction_aware",
        n_steps=50,
        tokens=[list(words) for _ in range(b)],
        metadata={
            "prompt": "What is the capital of Vietnam?",
            "answer": "".join(words),
        },
    )
    if top_k is not None:
        probs = torch.rand(b, p, k, top_k, generator=gen).sort(-1, descending=True)[0]
        result.top_probs = probs / probs.sum(-1, keepdim=True) * 0.9
        result.top_ids = torch.randint(0, 5000, (b, p, k, top_k), generator=gen)
        result.top_tokens = [
            [
                [[f" t{int(i)}" for i in result.top_ids[s, q, j]] for j in range(k)]
                for q in range(p)
            ]
            for s in range(b)
        ]
        result.entropy = torch.rand(b, p, k, generator=gen) * 5
        result.kl = torch.rand(b, p, k, generator=gen) * 3
        result.rank = torch.randint(1, 100, (b, p, k), generator=gen)
    return result


def synthetic_source_result(
    positions: int = 4, blocks: int = 3, sources: int = 9, seed: int = 0, heads: int = 0
) -> IGLensResult:
    r"""
    A one-sequence ``granularity="source"`` map without a model: the columns
    ``input``, then per block ``<b>.attn.s<j>`` for ``j < sources``,
    ``<b>.attn.bias`` and ``<b>.mlp``, as the source granularity names them
    (with ``heads``, ``<b>.attn.h<i>.s<j>`` per head, as ``"source_head"``);
    the last ``positions`` of ``sources`` tokens attributed, each with zero
    credit from the sources after it (causal), credits adding up to ``Δp``.
    """
    gen = torch.Generator().manual_seed(seed)
    names = ["input"]
    parts = [f"h{i}." for i in range(heads)] or [""]
    width = len(parts) * sources + 2  # columns per block
    for b in range(blocks):
        names += [f"{b}.attn.{h}s{j}" for h in parts for j in range(sources)]
        names += [f"{b}.attn.bias", f"{b}.mlp"]
    at = torch.arange(sources - positions, sources)
    credits = torch.randn(1, positions, len(names), generator=gen) * 0.005
    credits[..., 0] = 0.0  # the default baseline: nothing before the first block
    for p, pos in enumerate(at.tolist()):
        for b in range(blocks):
            for h in range(len(parts)):
                first = 1 + b * width + h * sources
                credits[0, p, first + pos + 1 : first + sources] = 0.0
    base = 0.4 + torch.rand(1, positions, generator=gen) * 0.2
    lens = base[..., None] + credits.cumsum(-1)
    words = [f" w{j}" if j % 4 else "\n" for j in range(sources)]
    return IGLensResult(
        attributions=credits,
        levels=lens,
        base_prob=base,
        model_prob=lens[..., -1].clone(),
        delta=torch.zeros(1, positions),
        targets=torch.randint(0, 1000, (1, positions), generator=gen),
        positions=at,
        mask=torch.ones(1, positions, dtype=torch.bool),
        layer_names=names,
        method="prediction_aware",
        n_steps=50,
        tokens=[[words[j] if j + 1 < sources else " end" for j in (at + 1).tolist()]],
        metadata={
            "prompt": "".join(words),
            "granularity": "source",
            "source_tokens": [words],
        },
    )
