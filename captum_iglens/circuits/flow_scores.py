r"""
The exact probability flow as an edge scorer of the circuit harness
(``SCORERS["flow"]``): for each pair, the flow of ``m`` along the straight
path of the first block's input from the counterfactual prompt to the clean
one (:func:`~captum_iglens.attr.flow.engine.flow_totals`, the exact
``"prediction_aware"`` estimator, with separate query, key and value
receivers, the flow's graph the harness's: the flows' receivers are in its
order), on the batch's token ids as they are (nothing is retokenised).
``SCORERS["flow-plain"]`` is the same path's first-order terms
(``"riemann_trapezoid"``), which the exact estimator corrects: what the
correction changes in a circuit.
"""

import torch
from torch import Tensor

from captum_iglens.attr.flow.budget import point_bytes, points_at_once
from captum_iglens.attr.flow.engine import (
    first_block_inputs,
    flow_graph_of,
    flow_totals,
)
from captum_iglens.attr.flow.options import DEFAULT_CHUNK_BYTES
from captum_iglens.attr.flow.targets import FlowTarget
from captum_iglens.circuits.context import ScoringContext


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

    Raises:
        ValueError: If the flow's graph of the model is not the harness's.
    """
    graph, parts = context.model.graph, context.model.parts
    flow_graph = flow_graph_of(parts, qkv=True)
    if flow_graph != graph:
        raise ValueError(
            f"model: the flow's graph ({flow_graph.describe()}) is not the "
            f"circuit harness's ({graph.describe()})"
        )
    scores = torch.zeros(graph.legal.shape, dtype=torch.float64)
    for batch in context.batches:
        position = batch.clean.shape[1] - 1
        point = point_bytes(parts, graph, batch.clean.shape[1])
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
                graph,
                n_steps=context.steps,
                method=method,
                per_position=False,
                receiver_positions=False,
                internal_batch_size=at_once,
                max_chunk_bytes=DEFAULT_CHUNK_BYTES,
            )
            scores[:, :-1] += totals.edges.T.cpu()
            scores[:, -1] += totals.direct.sum(-1).cpu()
    return scores / context.n_pairs
