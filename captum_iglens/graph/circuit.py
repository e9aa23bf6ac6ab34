r"""
Circuits over a :class:`~captum_iglens.graph.model_graph.ModelGraph`: edge
scores and circuits as torch ``(S, R)`` sender × receiver tensors (EAP-IG's
``(n_forward, n_backward)`` layout, entries off the graph's edges ignored),
the top-``n`` circuit of a scoring, MIB's pruning, node patching as a circuit,
and scores by edge name. Every node, receiver and edge is looked up in the
graph's arrays; no name is parsed.
"""

from typing import Dict, List, Mapping, Sequence

import torch
from torch import Tensor

from captum_iglens.columns import INPUT
from captum_iglens.graph.model_graph import ModelGraph


def legal_edges(graph: ModelGraph) -> Tensor:
    r"""
    The graph's edges as a tensor.

    Args:
        graph (ModelGraph): The model's graph.

    Returns:
        *Tensor*: ``(S, R)`` bool (shares the graph's array: never write it).
    """
    return torch.from_numpy(graph.legal)


def edge_values(graph: ModelGraph, matrix: Tensor) -> Tensor:
    r"""
    An ``(S, R)`` tensor's entries on the graph's edges.

    Args:
        graph (ModelGraph): The model's graph.
        matrix (Tensor): ``(S, R)``.

    Returns:
        *Tensor*: ``(E,)``, in the order of :attr:`ModelGraph.edges`.
    """
    senders = torch.from_numpy(graph.edge_senders)
    receivers = torch.from_numpy(graph.edge_receivers)
    return matrix[senders.to(matrix.device), receivers.to(matrix.device)]


def edge_matrix(graph: ModelGraph, values: Tensor) -> Tensor:
    r"""
    Edge values as an ``(S, R)`` tensor.

    Args:
        graph (ModelGraph): The model's graph.
        values (Tensor): ``(E,)``, in the order of :attr:`ModelGraph.edges`.

    Returns:
        *Tensor*: ``(S, R)`` float64, NaN off the edges.

    Raises:
        ValueError: If ``values`` is not ``(E,)``.
    """
    if tuple(values.shape) != (graph.n_edges,):
        raise ValueError(
            f"values: expected ({graph.n_edges},), got {tuple(values.shape)}"
        )
    out = torch.full(graph.legal.shape, float("nan"), dtype=torch.float64)
    senders = torch.from_numpy(graph.edge_senders)
    receivers = torch.from_numpy(graph.edge_receivers)
    out[senders, receivers] = values.to(torch.float64).cpu()
    return out


def scores_from_dict(
    graph: ModelGraph, scores: Mapping[str, float], what: str
) -> Tensor:
    r"""
    An ``(S, R)`` score tensor from a score for every edge, by name.

    Args:
        graph (ModelGraph): The model's graph.
        scores (Mapping[str, float]): A score for every edge of the graph.
        what (str): Whose scores, for messages.

    Returns:
        *Tensor*: ``(S, R)`` float64, NaN off the edges.

    Raises:
        ValueError: If a name is not an edge of the graph, an edge has no
            score, or a score is not finite.
    """
    positions = graph.edge_positions(scores, what)
    values = torch.empty(graph.n_edges, dtype=torch.float64)
    values[positions] = torch.tensor(
        [float(v) for v in scores.values()], dtype=torch.float64
    )
    if not torch.isfinite(values).all():
        raise ValueError(f"{what}: some edge scores are not finite")
    return edge_matrix(graph, values)


def scores_to_dict(graph: ModelGraph, scores: Tensor) -> Dict[str, float]:
    r"""
    Scores by edge name.

    Args:
        graph (ModelGraph): The model's graph.
        scores (Tensor): ``(S, R)``.

    Returns:
        *dict[str, float]*: every edge's score, in the graph's edge order.
    """
    return dict(zip(graph.edges, edge_values(graph, scores).tolist()))


def circuit_edges(graph: ModelGraph, keep: Tensor) -> List[str]:
    r"""
    The names of a circuit's edges.

    Args:
        graph (ModelGraph): The model's graph.
        keep (Tensor): ``(S, R)`` bool, the circuit.

    Returns:
        *list[str]*: its edges, in the graph's edge order.
    """
    kept = edge_values(graph, keep.cpu()).tolist()
    return [name for name, flag in zip(graph.edges, kept) if flag]


def top_edges(graph: ModelGraph, scores: Tensor, n: int, absolute: bool) -> Tensor:
    r"""
    The circuit of the ``n`` best-scored edges, pruned (:func:`prune`); ties
    go to the earlier entry of the ``(S, R)`` tensor.

    Args:
        graph (ModelGraph): The model's graph.
        scores (Tensor): ``(S, R)`` edge scores.
        n (int): How many edges to take, at most ``E``.
        absolute (bool): Rank by ``|score|`` (MIB's CMD) or by the signed
                    score (MIB's CPR).

    Returns:
        *Tensor*: ``(S, R)`` bool, the edges in the circuit.
    """
    legal = legal_edges(graph)
    ranked = scores.abs() if absolute else scores.clone()
    ranked = ranked.to(torch.float64).cpu().masked_fill(~legal, -float("inf"))
    order = torch.argsort(ranked.reshape(-1), descending=True, stable=True)
    keep = torch.zeros(legal.numel(), dtype=torch.bool)
    keep[order[:n]] = True
    return prune(graph, keep.view_as(legal) & legal)


def prune(graph: ModelGraph, keep: Tensor) -> Tensor:
    r"""
    MIB's pruning: repeatedly drops the nodes with no edge out, or (but for
    ``input``) no edge in, with their edges, until nothing changes.
    ``logits`` is always kept.

    Args:
        graph (ModelGraph): The model's graph.
        keep (Tensor): ``(S, R)`` bool, the edges in the circuit.

    Returns:
        *Tensor*: ``(S, R)`` bool, the pruned circuit.
    """
    n_senders = len(graph.senders)
    keep = keep.cpu() & legal_edges(graph)
    node_of = torch.from_numpy(graph.receiver_node)
    reads = node_of < n_senders  # every receiver but logits
    while True:
        fed = keep.any(0)[reads].long()
        into = torch.zeros(n_senders, dtype=torch.long)
        into = into.index_add_(0, node_of[reads], fed) > 0
        into[graph.node_index[INPUT]] = True
        alive = keep.any(1) & into
        receiver_alive = torch.ones(len(graph.receivers), dtype=torch.bool)
        receiver_alive[reads] = alive[node_of[reads]]
        pruned = keep & alive[:, None] & receiver_alive[None, :]
        if torch.equal(pruned, keep):
            return keep
        keep = pruned


def node_circuit(graph: ModelGraph, nodes: Sequence[str]) -> Tensor:
    r"""
    Node patching as a circuit: every edge out of the named nodes (the other
    nodes' writes are counterfactual for every receiver).

    Args:
        graph (ModelGraph): The model's graph.
        nodes (Sequence[str]): Sender names kept (``input`` is added).

    Returns:
        *Tensor*: ``(S, R)`` bool.

    Raises:
        ValueError: If a name is not a sender of the graph.
    """
    senders = graph.senders
    unknown = sorted(set(nodes) - set(senders))
    if unknown:
        raise ValueError(f"nodes: not nodes of this graph: {unknown}")
    kept = torch.tensor([s in nodes or s == INPUT for s in senders])
    return legal_edges(graph) & kept[:, None]
