r"""
The exact probability flow as an edge scorer of the circuit harness
(``SCORERS["flow"]``): for each pair, the flow of ``m`` along the straight
path of the first block's input from the counterfactual prompt to the clean
one, through the same front door as ``captum-iglens graph``
(:meth:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow.plan` and
``run_batch``, one call per batch of pairs: the exact step rule, separate
query, key and value receivers, the flow's graph the harness's), on the
batch's token ids as they are (nothing is retokenised).
``SCORERS["flow-plain"]`` is the same path's first-order terms
(``"first_order"``), which the exact rule corrects: what the correction
changes in a circuit. ``SCORERS["effect"]`` is each edge's own effect from
the same walk, ``Δz_u · mean_k ρ_w`` (``FlowGraph.effects``): what patching
the edge alone changes, to first order.
"""

import torch
from torch import Tensor

from captum_iglens.studies.distributed import computed_in_order
from captum_iglens.attr.flow.engine import flow_graph_of
from captum_iglens.attr.flow.probability_flow import ProbabilityFlow
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.graph.circuit import edge_matrix
from captum_iglens.graph.target import takes_foil


def flow_scores(
    context: ScoringContext, method: str = "exact", score: str = "flow"
) -> Tensor:
    r"""
    The flow: each edge's probability flow from the counterfactual to the
    clean prompt, averaged over pairs (exact, or the first-order terms with
    ``method="first_order"``); or, with ``score="effect"``, each edge's own
    effect from the same walk.

    Each batch of pairs is one call of the flow's batched path
    (:meth:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow.run_batch`):
    each pair runs on its own path (``context.steps`` equal steps,
    ``steps + 1`` forward and backward passes of the model, shared with the
    batch's other pairs where the memory budget holds them), with the flow's
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
                    Default: ``"exact"``
        score (str, optional): ``"flow"`` or ``"effect"``
                    (:meth:`~captum_iglens.attr.flow.graph.FlowGraph.scores`).
                    Default: ``"flow"``

    Returns:
        *Tensor*: ``(S, R)`` float64.

    Raises:
        ValueError: If the flow's graph of the model is not the harness's.
    """
    graph = context.model.graph
    flow = ProbabilityFlow(context.model.model)
    flow_graph = flow_graph_of(context.model.parts, qkv=True)
    if flow_graph != graph:
        raise ValueError(
            f"model: the flow's graph ({flow_graph.describe()}) is not the "
            f"circuit harness's ({graph.describe()})"
        )

    def per_batch(batch: Batch) -> Tensor:
        plan = flow.plan(
            batch.clean,
            counterfactual=batch.counterfactual,
            target=batch.answer,
            target_kind=context.metric,
            foil=batch.foil if takes_foil(context.metric) else None,
            n_steps=context.steps,
            method=method,
            qkv=True,
        )
        pairs = flow.run_batch(plan)
        return torch.stack(
            [edge_matrix(graph, torch.from_numpy(p.scores(score))) for p in pairs]
        ).nan_to_num(0.0)

    # batch by batch, shared across processes under torchrun, added pair by
    # pair in order (one process's sum, to the last bit)
    scores = torch.zeros(graph.legal.shape, dtype=torch.float64)
    for value in computed_in_order(context.batches, per_batch):
        for pair in value:
            scores += pair
    return scores / context.n_pairs
