r"""
The exact probability flow as an edge scorer of the circuit harness
(``SCORERS["flow"]``): for each pair, the flow of ``m`` along the straight
path of the first block's input from the counterfactual prompt to the clean
one (:func:`~captum_iglens.attr.flow.engine.flow_totals`, the exact
``"prediction_aware"`` estimator, with separate query, key and value
receivers), on the batch's token ids as they are (nothing is retokenised).
``SCORERS["flow-plain"]`` is the same path's first-order terms
(``"riemann_trapezoid"``), which the exact estimator corrects: what the
correction changes in a circuit.
"""

from typing import List

import torch
from torch import Tensor

from captum_iglens.attr.flow.budget import point_bytes, points_at_once
from captum_iglens.attr.flow.engine import (
    check_flow_parts,
    first_block_inputs,
    flow_totals,
)
from captum_iglens.attr.flow.nodes import FlowLayout
from captum_iglens.attr.flow.targets import FlowTarget
from captum_iglens.circuits.context import ScoringContext
from captum_iglens.circuits.graph import EdgeGraph
from captum_iglens.attr.flow.options import DEFAULT_CHUNK_BYTES


def receiver_rows(graph: EdgeGraph, layout: FlowLayout) -> List[int]:
    r"""
    For each receiver of the harness's graph but ``logits``, its row in the
    flow's edges, matched by name: the flow lists a head's ``<q>``, ``<k>``,
    ``<v>`` together, the harness every head's ``<q>``, then ``<k>``, then
    ``<v>``.

    Args:

        graph (EdgeGraph): The harness's graph.
        layout (FlowLayout): The flow's nodes, with ``qkv``.

    Returns:
        *list[int]*: ``R - 1`` rows.

    Raises:
        ValueError: If the two do not name the same senders and receivers.
    """
    rows = {name: i for i, name in enumerate(layout.receivers())}
    if layout.senders() != graph.senders or set(rows) != set(graph.receivers[:-1]):
        raise ValueError(
            "model: the flow's nodes are not the circuit graph's "
            f"({layout.n_layers} blocks of {layout.n_heads} heads, "
            f"against {graph.n_layers} of {graph.n_heads})"
        )
    return [rows[name] for name in graph.receivers[:-1]]


def flow_scores(context: ScoringContext, method: str = "prediction_aware") -> Tensor:
    r"""
    The flow: each edge's probability flow from the counterfactual to the
    clean prompt, averaged over pairs (exact, or the first-order terms with
    ``method="riemann_trapezoid"``).

    Each pair runs on its own path (``context.steps`` equal steps,
    ``steps + 1`` forward and backward passes of the model), with the flow's
    target ``m`` the harness's metric at the last position: ``"prob"``
    (``p(answer)``), ``"prob_diff"`` (``p(answer) − p(foil)``) or
    ``"logit_diff"`` (``logit(answer) − logit(foil)``), answer and foil from
    the pair. With the exact estimator, for each pair the flows into
    ``logits`` add up to ``Δm = m(clean) − m(counterfactual)`` at any step
    count, to float rounding.

    Args:

        context (ScoringContext): The pairs, the metric and ``steps``.
        method (str, optional): The flow's estimator
                    (:data:`~captum_iglens.attr.flow.options.FLOW_METHODS`).
                    Default: ``"prediction_aware"``

    Returns:
        *Tensor*: ``(S, R)`` float64.
    """
    model, graph = context.model, context.model.graph
    parts = model.parts
    layout = FlowLayout(graph.n_layers, check_flow_parts(parts), qkv=True)
    rows = receiver_rows(graph, layout)
    scores = torch.zeros(graph.n_senders, graph.n_receivers, dtype=torch.float64)
    for batch in context.batches:
        position = batch.clean.shape[1] - 1
        point = point_bytes(parts, layout, batch.clean.shape[1])
        at_once = points_at_once(point, context.steps + 1, None, DEFAULT_CHUNK_BYTES)
        for b in range(len(batch.index)):
            answer, foil = int(batch.answer[b]), int(batch.foil[b])
            target = FlowTarget(
                context.metric,
                answer,
                position,
                None if context.metric == "prob" else foil,
            )
            totals = flow_totals(
                parts,
                batch.clean[b : b + 1],
                first_block_inputs(parts, batch.counterfactual[b : b + 1]),
                target,
                layout,
                n_steps=context.steps,
                method=method,
                per_position=False,
                receiver_positions=False,
                internal_batch_size=at_once,
                max_chunk_bytes=DEFAULT_CHUNK_BYTES,
            )
            scores[:, :-1] += totals.edges[rows].T.cpu()
            scores[:, -1] += totals.direct.sum(-1).cpu()
    return scores / context.n_pairs
