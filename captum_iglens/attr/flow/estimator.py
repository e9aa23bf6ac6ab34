r"""
The edge flows of one step of the path, from the first-order terms of its
ends.

Between grid points ``a_{s-1}`` and ``a_s``, sender ``u`` changed its write by
``δz_u`` and receiver ``w`` had the mean node-input gradient ``ρ̄_w``; the
first-order edge term is ``ρ̄_w · δz_u`` (per position: the dot product at one
position of the stream), and the direct term into the logits is ``∇̄f · δz_u``.

The flow's step rules are named for what they do, not for the estimators of
``LayerIGLens`` they resemble (``method=``, :data:`STEP_RULES`):

- ``"exact"`` (the prediction-aware rule on the graph): the step's observed
  change ``δm`` is split
  among the direct terms; then, from the last node to the first, each node's
  step outflow is split among its in-edges in proportion to their terms (a
  head's query, key and value reads share one split). Completeness
  (``Σ_u F(u→logits) = δm``) and conservation at every node hold at every step,
  so at any step count, to float rounding.
- ``"first_order"``: the terms themselves. The input's outflows
  are then Captum's ``LayerIntegratedGradients`` on the embeddings with
  ``method="riemann_trapezoid"`` and ``n_steps + 1`` points; completeness and
  conservation hold only as the steps shrink.

**The split rule.** An amount ``A`` (a step's ``δm``, or a node's step
outflow) is split among terms ``t`` (the allowed ones) as
``F_u = t_u + (A − Σ t) · |t_u| / Σ|t|``: each edge keeps its first-order term
and the difference between the observed amount and the first-order sum is
shared in proportion to ``|t|``. Where the terms have one sign this is the
split in proportion to the terms, ``F_u = A · t_u / Σ t``; where they have
both, it never amplifies (``Σ|F| ≤ Σ|t| + |A − Σ t|``), whereas the
proportional split of nearly cancelling terms does, without bound, and
compounds over the layers. Where every term is zero, equal amounts go to the
allowed entries. The amounts add up to ``A`` under every rule, and as the steps
shrink ``A − Σ t → 0``, so the flows converge to the integrals.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.attr.flow.reads import owners
from captum_iglens.graph.model_graph import ModelGraph


def allocate(amount: Tensor, terms: Tensor, allowed: Tensor) -> Tensor:
    r"""
    Splits ``amount`` among ``terms`` by the module's rule.

    Args:
        amount (Tensor): ``(...)`` float64: what each row splits.
        terms (Tensor): ``(..., N)`` float64: the first-order terms.
        allowed (Tensor): ``(..., N)`` bool, broadcastable: the entries that
                    may get a part (at least one per row).

    Returns:
        *Tensor* ``(..., N)`` float64 that adds up to ``amount`` along the last
        axis, zero where not allowed.
    """
    terms = terms * allowed
    magnitude = terms.abs()
    size = magnitude.sum(-1, keepdim=True)
    rest = amount.unsqueeze(-1) - terms.sum(-1, keepdim=True)
    if bool((size > 0).all()):  # no row needs the equal split
        return terms + rest * (magnitude / size)
    count = allowed.to(terms.dtype).expand_as(terms)
    equal = count / count.sum(-1, keepdim=True).clamp_min(1)
    weights = torch.where(
        size > 0, magnitude / size.clamp_min(torch.finfo(terms.dtype).tiny), equal
    )
    return terms + rest * weights


@dataclass
class StepTerms:
    r"""
    The first-order terms of one step.

    Args:
        edges (Tensor): ``(R, S)`` float64: ``ρ̄_w · δz_u`` summed over the
                    positions.
        direct (Tensor): ``(S, T)`` float64: ``∇̄f · δz_u`` per position.
        dm (float): The step's observed change of the target, ``δm``.
    """

    edges: Tensor
    direct: Tensor
    dm: float


def exact_step(
    terms: StepTerms, graph: ModelGraph, allowed: Tensor
) -> Tuple[Tensor, Tensor]:
    r"""
    The prediction-aware split of one step.

    Args:
        terms (StepTerms): The step's terms.
        graph (ModelGraph): The graph's nodes.
        allowed (Tensor): ``(R, S)`` bool: which senders each receiver reads
                    (:func:`~captum_iglens.attr.flow.reads.allowed`).

    Returns:
        2-element tuple of **edges** ``(R, S)`` (summed over the positions;
        :func:`exact_positions` splits them) and **direct** ``(S, T)`` float64:
        the step's flows.
    """
    edge_sums, direct_sums = terms.edges, terms.direct.sum(-1)
    everyone = torch.ones_like(direct_sums, dtype=torch.bool)
    out = allocate(torch.tensor(terms.dm, dtype=torch.float64), direct_sums, everyone)
    outflow = out.clone()
    edges = torch.zeros_like(edge_sums)
    owner = owners(graph)
    n, k, s = graph.n_heads, len(graph.kinds), edge_sums.shape[1]

    def by_head(rows: Tensor) -> Tensor:  # (k · n, S) kind-major -> (n, k · S)
        return rows.reshape(k, n, s).transpose(0, 1).reshape(n, k * s)

    for heads, mlp in reversed(graph.blocks()):
        edges[mlp] = allocate(outflow[owner[mlp]], edge_sums[mlp], allowed[mlp])
        outflow += edges[mlp]
        split = allocate(
            outflow[owner[heads]][:n],
            by_head(edge_sums[heads]),
            by_head(allowed[heads]),
        )
        edges[heads] = split.reshape(n, k, s).transpose(0, 1).reshape(k * n, s)
        outflow += split.reshape(n * k, s).sum(0)  # summed head by head
    return edges, exact_positions(out, terms.direct)


def exact_positions(
    flows: Tensor, terms: Tensor, allowed: Optional[Tensor] = None
) -> Tensor:
    r"""
    The exact split of flows over positions (an edge's over its sender's
    positions, or a sender position's over the receiver's).

    Args:
        flows (Tensor): ``(...)`` float64: the step's flows.
        terms (Tensor): ``(..., T)`` float64: their first-order terms per
                    position.
        allowed (Tensor, optional): ``(..., T)`` bool, broadcastable: the
                    positions that may get a part. Default: None (all)

    Returns:
        *Tensor* ``(..., T)`` float64 that adds up to ``flows``.
    """
    if allowed is None:
        allowed = torch.ones(terms.shape[-1], dtype=torch.bool, device=terms.device)
    return allocate(flows, terms, allowed)


def plain_step(
    terms: StepTerms, graph: ModelGraph, allowed: Tensor
) -> Tuple[Tensor, Tensor]:
    r"""The plain split of one step: the first-order terms themselves (same
    arguments and returns as :func:`exact_step`)."""
    return terms.edges * allowed, terms.direct


def plain_positions(
    flows: Tensor, terms: Tensor, allowed: Optional[Tensor] = None
) -> Tensor:
    r"""The plain flows per position: the terms themselves (same arguments and
    returns as :func:`exact_positions`)."""
    return terms if allowed is None else terms * allowed


class StepRule(NamedTuple):
    r"""
    A flow method's rule for one step.

    Args:
        split (Callable): The step's flows from its terms (:func:`exact_step`).
        positions (Callable): Flows split over positions
                    (:func:`exact_positions`).
    """

    split: Callable[[StepTerms, ModelGraph, Tensor], Tuple[Tensor, Tensor]]
    positions: Callable[[Tensor, Tensor, Optional[Tensor]], Tensor]


#: Each flow method's step rule, by the name ``method=`` takes
#: (:data:`~captum_iglens.attr.flow.options.FLOW_METHODS`).
STEP_RULES = {
    "exact": StepRule(exact_step, exact_positions),
    "first_order": StepRule(plain_step, plain_positions),
}
