r"""
IG-Lens's node maps lifted to edges, as edge scorers of the circuit harness
(``SCORERS["joint"]`` and ``SCORERS["telescoping"]``): a check of what the
edge graph adds to the per-node credits it refines.

For each pair, :class:`~captum_iglens.LayerIGLens` attributes ``p(answer)`` at
the clean prompt's last position, at ``granularity="head"`` (one credit per
head and per MLP of every block, and ``input``, which is zero on the default
path start ``h_0``), on the ``"joint"`` or ``"telescoping"`` path
(docs/paths.md). The counterfactual prompt is not used, and the target is
``p(answer)`` whatever the run's metric: with the harness's usual
``logit_diff`` the node maps attribute another quantity than the one the
circuits are scored by, and they know nothing of the foil.

The lift (:func:`lift_to_edges`): a node's credit is shared equally by its
in-edges (its ``<q>``, ``<k>`` and ``<v>`` receivers together for a head), and
an edge into ``logits`` gets its sender's credit. A node map says how much
each node matters, not which of its inputs carry that, so equal shares are
the only split that adds no information of its own. ``logits`` has no credit
of its own but the total: giving each sender's direct edge to it that
sender's credit splits the total as the node map does (the joint credit is a
node's direct write as the readout reads it), and keeps both rankings from
resting on ties.
"""

from typing import Dict

import torch
from torch import Tensor

from captum_iglens.studies.distributed import computed_in_order
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.columns import INPUT, Column
from captum_iglens.graph.circuit import legal_edges
from captum_iglens.graph.model_graph import (
    LOGITS,
    ModelGraph,
    head_name,
    mlp_name,
)


def lift_to_edges(graph: ModelGraph, credits: Tensor) -> Tensor:
    r"""
    Node credits as edge scores: an edge ``u -> w`` into a head or an MLP
    gets ``credit(w) / in_degree(w)`` (a head's in-edges are those of its
    ``<q>``, ``<k>`` and ``<v>`` receivers), an edge ``u -> logits`` gets
    ``credit(u)``. So the scores into a node add up to its credit, and those
    into ``logits`` to the sum of every credit.

    Args:

        graph (ModelGraph): The harness's graph.
        credits (Tensor): ``(S,)``, one credit per sender.

    Returns:
        *Tensor*: ``(S, R)`` float64, zero off the edges.
    """
    credits = credits.to(torch.float64)
    legal = legal_edges(graph).to(torch.float64)
    node = torch.from_numpy(graph.receiver_node)
    has = node < len(graph.senders)  # every receiver but logits
    in_degree = torch.zeros(len(graph.senders), dtype=torch.float64)
    in_degree.index_add_(0, node[has], legal[:, has].sum(0))
    share = credits.clone()
    share[in_degree > 0] /= in_degree[in_degree > 0]
    scores = torch.zeros_like(legal)
    scores[:, has] = legal[:, has] * share[node[has]][None, :]
    logits = graph.receivers.index(LOGITS)
    scores[:, logits] = legal[:, logits] * credits
    return scores


def sender_columns(lens: LayerIGLens, graph: ModelGraph, names: list) -> Dict[int, int]:
    r"""
    For each sender of the graph, its column in a ``"head"`` map, matched by
    name (``input``; ``<b>.attn.h<i>`` is ``a<l>.h<i>``, ``<b>.mlp`` is
    ``m<l>``, with ``l`` the block's index in ``lens.layer_names``).

    Args:

        lens (LayerIGLens): The lens over every block.
        graph (ModelGraph): The harness's graph.
        names (list[str]): The map's column names.

    Returns:
        *dict[int, int]*: sender index -> column index, for every sender.

    Raises:
        ValueError: If a column is no sender (an attention bias) or a sender
                    has no column.
    """
    senders = graph.node_index
    out: Dict[int, int] = {}
    for j, name in enumerate(names):
        column = Column.parse(name)
        block = str(column.block)  # named by every column but input's
        if column.kind == "input":
            sender = INPUT
        elif column.kind == "head" and column.index is not None:
            sender = head_name(lens.layer_names.index(block), column.index)
        elif column.kind == "sublayer" and column.part == "mlp":
            sender = mlp_name(lens.layer_names.index(block))
        else:
            raise ValueError(f"model: the head map's column {name!r} is no node")
        out[senders[sender]] = j
    if len(out) != len(graph.senders):
        raise ValueError("model: the head map does not credit every node")
    return out


def node_credits(context: ScoringContext, path: str) -> Tensor:
    r"""
    Each pair's IG-Lens credit of every sender, for ``p(answer)`` at the
    clean prompt's last position.

    Args:

        context (ScoringContext): The pairs.
        path (str): ``"joint"`` or ``"telescoping"``.

    Returns:
        *Tensor*: ``(n_pairs, S)`` float64, in the order of the batches.
    """
    graph = context.model.graph
    lens = LayerIGLens.from_model(context.model.model)

    def rows(batch: Batch) -> Tensor:
        result = lens.attribute_map(
            batch.clean,
            target=batch.answer,
            positions=[batch.clean.shape[1] - 1],
            granularity="head",
            path=path,
        )
        columns = sender_columns(lens, graph, list(result.layer_names))
        order = torch.tensor([columns[s] for s in range(len(graph.senders))])
        return result.attributions[:, 0, order].to(torch.float64).cpu()

    # shared across processes under torchrun, in the batches' order
    return torch.cat(list(computed_in_order(context.batches, rows)))


def lifted_scores(context: ScoringContext, path: str) -> Tensor:
    r"""
    A path's head map lifted to edges (:func:`lift_to_edges`), averaged over
    pairs: ``SCORERS["joint"]`` and ``SCORERS["telescoping"]``.

    Args:

        context (ScoringContext): The pairs (the metric is not used: the map
                    attributes ``p(answer)``).
        path (str): ``"joint"`` or ``"telescoping"``.

    Returns:
        *Tensor*: ``(S, R)`` float64.
    """
    mean = node_credits(context, path).sum(0) / context.n_pairs
    return lift_to_edges(context.model.graph, mean)
