r"""
The ensemble of the circuit harness, ``mean:A+B[+C…]`` (MIB's strongest
shared-task entries averaged EAP and EAP-IG): each part's scores over the
graph's edges are ranked by ``|score|`` and normalized to ``(0, 1]`` (rank
over the number of edges: the largest ``|score|`` is 1, tied scores share
their mean rank), the score's sign is kept, and the parts are averaged.

The sign is kept because the harness ranks both ways, as MIB does: CPR's
circuits take the largest signed scores, CMD's the largest ``|score|``
(:func:`~captum_iglens.graph.circuit.top_edges`). ``sign(s) · rank(|s|) / E``
orders a part's edges as its own scores do in both rankings, so a part's
edges that lower the metric stay out of the ensemble's CPR circuits, and
parts that disagree on an edge's sign cancel. Entries off the graph's edges
are 0.
"""

import torch
from torch import Tensor

from captum_iglens.graph.circuit import edge_values
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.studies.circuits.context import ScoringContext


def average_ranks(values: Tensor) -> Tensor:
    r"""
    Ranks from 1, ascending, tied values given their mean rank (scipy's
    ``rankdata(method="average")``).

    Args:
        values (Tensor): ``(E,)``.

    Returns:
        *Tensor*: ``(E,)`` float64.
    """
    _, group, counts = torch.unique(values, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()  # the rank of the last of each tied group
    return (last - (counts.double() - 1) / 2)[group]


def rank_scores(graph: ModelGraph, scores: Tensor) -> Tensor:
    r"""
    One part's scores rank-normalized: ``sign(s) · rank(|s|) / E`` on the
    graph's ``E`` edges (:func:`average_ranks`), 0 off them.

    Args:
        graph (ModelGraph): The model's graph.
        scores (Tensor): ``(S, R)`` edge scores.

    Returns:
        *Tensor*: ``(S, R)`` float64, in ``[-1, 1]``.
    """
    values = edge_values(graph, scores.double().cpu())
    ranked = values.sign() * average_ranks(values.abs()) / graph.n_edges
    out = torch.zeros(graph.legal.shape, dtype=torch.float64)
    senders = torch.from_numpy(graph.edge_senders)
    out[senders, torch.from_numpy(graph.edge_receivers)] = ranked
    return out


def mean_scores(context: ScoringContext) -> Tensor:
    r"""
    The ensemble's scores: the mean of its parts' :func:`rank_scores`.

    Args:
        context (ScoringContext): Its ``parts`` are the parts' ``(S, R)``
                    scores, already computed.

    Returns:
        *Tensor*: ``(S, R)`` float64, 0 off the graph's edges.
    """
    graph = context.model.graph
    ranked = [rank_scores(graph, scores) for scores in context.parts]
    return torch.stack(ranked).mean(0)
