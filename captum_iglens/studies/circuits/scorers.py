r"""
The edge scorers of the circuit harness, each named by its
:class:`~captum_iglens.studies.circuits.methods.Scorer` record in the one
registry, :data:`~captum_iglens.studies.circuits.methods.SCORERS` (read-only;
:func:`~captum_iglens.studies.circuits.methods.register` adds one), which this
module re-exports; the registry imports no torch, and a record's function is
imported on its first call.

A scorer's function is a callable ``(context: ScoringContext) -> scores``,
where scores are either an ``(S, R)`` tensor over the graph's senders ×
receivers (:class:`~captum_iglens.graph.model_graph.ModelGraph`) or a dict
from edge name (``"a3.h1->m5"``, ``"input->a0.h2<q>"``) to score. Larger is
more important; CPR's circuits take the largest signed scores, CMD's the
largest ``|score|``. Its record says whether it takes a step count (and its
default), reads a file, or is a ground truth (and how it is compared).

``flow`` is the exact probability flow
(:func:`~captum_iglens.studies.circuits.flow_scores.flow_scores`, at
:data:`~captum_iglens.attr.flow.options.DEFAULT_STEPS` steps unless given,
``"flow:8"``); ``flow-plain`` is its first-order terms alone, before the
exact estimator's correction. ``joint`` and ``telescoping`` are IG-Lens's head maps of
``p(answer)`` on the clean prompt lifted to edges, a node's credit shared
equally by its in-edges and each edge into ``logits`` given its sender's
credit (:mod:`~captum_iglens.studies.circuits.node_scores`): what a ranking knows
without the edges. They attribute ``p(answer)`` whatever the run's metric.
The baselines, written from their papers:

- ``eap`` (Syed et al., 2023): ``(z_u - z'_u) · ∂m/∂x_w`` at the clean
  input, summed over positions and averaged over pairs;
- ``eap-ig-inputs`` (Hanna et al., 2024): the gradient averaged over the
  inputs interpolated from the counterfactual's embeddings to the clean ones,
  at ``α = k / steps`` for ``k = 0 … steps − 1`` (EAP-IG's left rule);
- ``eap-ig-activations`` (MIB): for each sender group (the embeddings, a
  layer's heads, a layer's MLP) its writes alone are interpolated, at
  ``α = k / steps`` for ``k = 1 … steps``, and the gradients at every
  receiver score that group's edges;
- ``random``: uniform scores under the context's seed;
- ``eap-json:PATH``: the edge scores of an EAP-IG graph file
  (:mod:`~captum_iglens.studies.circuits.eap_json_scores`), whoever wrote it;
- ``patching``: exact single-edge patching, ``m(N) − m(N \ e)``, on a random
  subsample of edges (NaN elsewhere);
- ``patching-nodes``: exact patching of each node alone, ``m(N) − m(N \ u)``
  with every write of ``u`` replaced by its counterfactual one, shared equally
  by ``u``'s out-edges;
- ``patching-nodes-denoising``: the same from the other end,
  ``m(∅ ∪ u) − m(∅)``, the counterfactual run with ``u``'s clean writes.

The last three are the ground truth of the rank correlations, not circuits
(their record's ``truth`` says how each is compared: edge by edge on the
sampled edges, or node by node on each sender's total over its out-edges).
"""

from functools import partial
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.studies.circuits.batches import Batch, batch_sum
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.graph.target import metric
from captum_iglens.graph.circuit import legal_edges
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.studies.circuits.methods import (  # noqa: F401 (re-exported)
    SCORERS,
    Comparison,
    Scorer,
    register,
)


def _receiver_grads(
    context: ScoringContext,
    batch: Batch,
    override: Optional[Tuple[int, Tensor]] = None,
    first: int = 0,
) -> Tensor:
    r"""
    ``∂ Σ_pairs m / ∂x_w`` for every receiver, ``(B, R, T, d)``; zero for the
    receivers before sender group ``first``'s readers (the backward stops
    there: a group's writes reach no earlier receiver).
    """
    run = context.model.run(batch.clean, override=override, receiver_grads=True)
    value = metric(context.metric, run.logits, batch.answer, batch.foil).sum()
    wanted = run.inputs[first:]
    grads = torch.autograd.grad(value, wanted, materialize_grads=True)
    before = [torch.zeros_like(x) for x in run.inputs[:first]]
    return torch.cat([*before, *grads], 1)


def _writes(context: ScoringContext, batch: Batch) -> List[Tensor]:
    with torch.no_grad():
        clean = context.model.run(batch.clean, return_writes=True).writes
        other = context.model.run(batch.counterfactual, return_writes=True).writes
    assert clean is not None and other is not None
    return [clean, other]


def _edge_scores(diff: Tensor, grads: Tensor) -> Tensor:
    """``Σ_{b,t} diff_s · grad_r``: ``(B, S, T, d)`` × ``(B, R, T, d)`` → ``(S, R)``."""
    return torch.einsum("bstd,brtd->sr", diff.double(), grads.double())


def _summed(context: ScoringContext, per_batch: Callable[[Batch], Tensor]) -> Tensor:
    """``per_batch`` summed over the context's batches from zeros ``(S, R)``
    (:func:`~captum_iglens.studies.circuits.batches.batch_sum`: shared across
    processes under ``torchrun``)."""
    zeros = torch.zeros(context.model.graph.legal.shape, dtype=torch.float64)
    return batch_sum(context.batches, per_batch, zeros)


def eap(context: ScoringContext) -> Tensor:
    """EAP: the activation difference times the gradient at the clean input."""

    def per_batch(batch: Batch) -> Tensor:
        clean, other = _writes(context, batch)
        return _edge_scores(clean - other, _receiver_grads(context, batch)).cpu()

    return _summed(context, per_batch) / context.n_pairs


def _group_slices(context: ScoringContext) -> List[slice]:
    """The sender groups: ``input``, then per layer its heads and its MLP."""
    H = context.model.n_heads
    out, start = [slice(0, 1)], 1
    for _ in context.model.layers:
        out += [slice(start, start + H), slice(start + H, start + H + 1)]
        start += H + 1
    return out


def eap_ig_inputs(context: ScoringContext) -> Tensor:
    """EAP-IG-inputs: gradients averaged along the embeddings' straight path."""
    graph = context.model.graph

    def per_batch(batch: Batch) -> Tensor:
        clean, other = _writes(context, batch)
        grads = (
            torch.zeros_like(clean[:, :1])
            .expand(-1, len(graph.receivers), -1, -1)
            .clone()
        )
        for k in range(context.steps):
            embed = other[:, :1] + k / context.steps * (clean[:, :1] - other[:, :1])
            grads += _receiver_grads(context, batch, (0, embed))
        return _edge_scores(clean - other, grads / context.steps).cpu()

    return _summed(context, per_batch) / context.n_pairs


def eap_ig_activations(context: ScoringContext) -> Tensor:
    """EAP-IG-activations: each sender group's writes interpolated alone."""
    graph = context.model.graph

    def per_batch(batch: Batch) -> Tensor:
        scores = torch.zeros(graph.legal.shape, dtype=torch.float64)
        clean, other = _writes(context, batch)
        for group, senders in enumerate(_group_slices(context)):
            grads = None
            for k in range(1, context.steps + 1):
                mixed = other[:, senders] + k / context.steps * (
                    clean[:, senders] - other[:, senders]
                )
                step = _receiver_grads(context, batch, (group, mixed), group)
                grads = step if grads is None else grads + step
            assert grads is not None
            diff = (clean - other)[:, senders]
            scores[senders] += _edge_scores(diff, grads / context.steps).cpu()
        return scores

    return _summed(context, per_batch) / context.n_pairs


def random_scores(context: ScoringContext) -> Tensor:
    """Uniform random scores in ``[0, 1)``, under the context's seed."""
    graph = context.model.graph
    generator = torch.Generator().manual_seed(context.seed)
    return torch.rand(graph.legal.shape, generator=generator, dtype=torch.float64)


def patching(context: ScoringContext) -> Tensor:
    """Exact single-edge patching on a random subsample of edges (NaN elsewhere)."""
    legal = legal_edges(context.model.graph)
    edges = legal.nonzero()
    generator = torch.Generator().manual_seed(context.seed)
    chosen = edges[torch.randperm(len(edges), generator=generator)[: context.sample]]
    scores = torch.full(legal.shape, float("nan"), dtype=torch.float64)
    scores[chosen[:, 0], chosen[:, 1]] = 0.0
    m = partial(metric, context.metric)

    @torch.no_grad()
    def per_batch(batch: Batch) -> Tensor:
        effects = torch.zeros(legal.shape, dtype=torch.float64)
        other = context.model.run(batch.counterfactual, return_writes=True).writes
        full = m(context.model.run(batch.clean).logits, batch.answer, batch.foil)
        for s, r in chosen.tolist():
            keep = legal.clone()
            keep[s, r] = False
            run = context.model.run(batch.clean, keep=keep, counterfactual=other)
            effects[s, r] += float(
                (full - m(run.logits, batch.answer, batch.foil)).sum()
            )
        return effects

    return batch_sum(context.batches, per_batch, scores) / context.n_pairs


def node_patching(context: ScoringContext, denoising: bool = False) -> Tensor:
    r"""
    Exact patching of each node alone, shared equally by its out-edges.

    Noising (the default): ``m(N) − m(N \ u)``, the clean run with ``u``'s
    writes replaced by its counterfactual ones. Denoising: ``m(∅ ∪ u) − m(∅)``,
    the counterfactual run with ``u``'s clean writes.
    """
    graph = context.model.graph
    m = partial(metric, context.metric)

    @torch.no_grad()
    def per_batch(batch: Batch) -> Tensor:
        effects = torch.zeros(len(graph.senders), dtype=torch.float64)
        clean, other = _writes(context, batch)
        ids, base, patch, sign = batch.clean, clean, other, 1.0
        if denoising:
            ids, base, patch, sign = batch.counterfactual, other, clean, -1.0
        unpatched = m(context.model.run(ids).logits, batch.answer, batch.foil)
        for group, senders in enumerate(_group_slices(context)):
            for node in range(senders.start, senders.stop):
                mixed = base[:, senders].clone()
                mixed[:, node - senders.start] = patch[:, node]
                run = context.model.run(ids, override=(group, mixed))
                patched = m(run.logits, batch.answer, batch.foil)
                effects[node] += sign * float((unpatched - patched).sum())
        return effects

    zeros = torch.zeros(len(graph.senders), dtype=torch.float64)
    effects = batch_sum(context.batches, per_batch, zeros)
    legal = legal_edges(graph).double()
    return legal * (effects / context.n_pairs / legal.sum(1)).unsqueeze(1)


def sampled_edges(
    graph: ModelGraph, scores: Tensor, truth: Tensor
) -> Tuple[Tensor, Tensor]:
    """Edge by edge, on the edges the ground truth scored."""
    sampled = torch.isfinite(truth)
    return scores[sampled], truth[sampled]


def node_totals(
    graph: ModelGraph, scores: Tensor, truth: Tensor
) -> Tuple[Tensor, Tensor]:
    """Node by node: each sender's total over its out-edges."""
    legal = legal_edges(graph)

    def totals(x: Tensor) -> Tensor:
        return torch.where(legal, x, 0.0).sum(1)

    return totals(scores), totals(truth)
