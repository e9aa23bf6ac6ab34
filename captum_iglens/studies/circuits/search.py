r"""
``search:METHOD``: circuits searched against faithfulness on training pairs,
from ``METHOD``'s scores on those pairs (the warm start).

MIB reads two families of circuits from a method: CPR's take the top ``k%``
of edges by signed score, CMD's by ``|score|``, and the two pull apart (CPR
rewards ``f`` far above 1, CMD ``f`` near 1). The search keeps both as
*rankings*, one per family, each searched against its own objective: CPR's
circuits to raise ``f``, CMD's to bring ``|1 − f|`` down. It returns the two
rankings as scores, ``(2, S, R)``: the harness takes CPR's circuits from the
first and CMD's from the second, by the same top-``k%`` rule and MIB's
pruning as any method's (:func:`~captum_iglens.graph.circuit.top_edges`), so
a circuit at size ``k`` has at most ``int(k / 100 · E)`` edges after pruning.

Each ranking's circuits are nested: the circuit at size ``k``, ``T_k``, is its
first ``n_k`` edges. A step at size ``k`` swaps edges of ``T_k``'s own shell
(ranks ``n_{k−1} … n_k``) with edges of the next shell (ranks ``n_k …
n_{k+1}``), which changes ``T_k`` and no other size's circuit; so each size
is a search of its own, and improving each improves the area. A step:

1. re-scores every edge at the circuit's own patched state: ``∂f / ∂c`` at
   ``T_k`` (:meth:`~captum_iglens.studies.circuits.objective.Objective.gradient`),
   the first-order change of ``f`` when an edge is added or removed;
2. pairs the best additions from the next shell with the worst edges of the
   shell (in the objective's direction: up for CPR; towards 1 for CMD, no
   further than the first-order gap), as long as each swap gains, and never
   drops an edge that an added edge needs (an edge into its sender or out
   of its receiver's node: an added edge's gain assumes them). An edge that
   pruning removes changes nothing (its gradient is 0), so it goes first:
   prune and regrow is a special case;
3. measures the new circuit and keeps it only if the training objective
   improves, else halves the number of swaps and measures again, up to
   ``tries`` times.

A gradient is the expensive part (about five measurements), so each serves
several steps: a round takes the gradient at the circuit of the size of
highest priority and steps there, then steps once at every smaller size with
the same gradient (their shells lie inside that circuit, whose gradient
scores their edges: how much each matters in the larger circuit). Rounds go
to the sizes by their weight in the area (the trapezoid rule over
:data:`~captum_iglens.studies.circuits.faithfulness.PERCENTS`: 50% weighs
0.4, 0.1% 0.0005), times the last measured gain (CPR) or the gap ``|1 − f|``
(CMD), until the budget of passes over the training pairs is spent, half for
each family. A size whose step from its own gradient is refused is not
searched again.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.graph.circuit import edge_matrix, edge_values
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.faithfulness import PERCENTS, area_weights
from captum_iglens.studies.circuits.objective import Objective, PatchedObjective

#: The passes over the training pairs a search may spend (a measured circuit
#: is one, a gradient :data:`GRADIENT_PASSES`), half for each ranking: on
#: SmolLM2 one pass costs about a ninth of EAP-IG-inputs' scoring (5 steps),
#: so the search and its warm start cost about 8 times that method's.
BUDGET = 60
#: What a gradient costs, in passes: a forward keeping the graph, the backward
#: and the edge products (4.2 to 7.2 passes measured on SmolLM2, at the 50%
#: and the 5% circuits).
GRADIENT_PASSES = 5
#: Measurements per step: the swaps are halved after each refused one.
TRIES = 2


@dataclass
class Ranking:
    r"""
    One family of nested circuits under search.

    Attributes:

        order (Tensor): ``(E,)`` long, the edges (indices into the graph's
                    edges) by rank; the circuit at size ``k`` is the first
                    ``n_k``.
        absolute (bool): CMD's family (``|1 − f|`` minimized) or CPR's
                    (``f`` maximized).
        f (list[float or None]): The training ``f`` of each size's circuit,
                    where measured.
        gains (list[float]): The last measured gain of each size (1 before
                    its first step); 0 once a step there is refused.
    """

    order: Tensor
    absolute: bool
    f: List[Optional[float]]
    gains: List[float]

    def better(self, new: float, old: float) -> bool:
        """Whether ``f = new`` is better than ``old`` for this family."""
        return abs(1 - new) < abs(1 - old) if self.absolute else new > old

    def priority(self, k: int, weight: float) -> float:
        """What a step at size ``k`` may add to the area: its weight times
        its last gain (for CMD, no more than its gap to ``f = 1``)."""
        f, gain = self.f[k], self.gains[k]
        if self.absolute and f is not None:
            gain = min(gain, abs(1 - f))
        return weight * gain


def _mask(graph: ModelGraph, edges: Tensor) -> Tensor:
    """The ``(S, R)`` bool circuit of the given edge indices."""
    keep = torch.zeros(graph.legal.shape, dtype=torch.bool)
    senders = torch.from_numpy(graph.edge_senders)[edges]
    keep[senders, torch.from_numpy(graph.edge_receivers)[edges]] = True
    return keep


def _needed(graph: ModelGraph, added: Tensor, inside: Tensor) -> Tensor:
    r"""Which of the circuit's edges ``inside`` an added edge needs: those
    into its sender, and those out of its receiver's node."""
    senders = torch.from_numpy(graph.edge_senders)
    node = torch.from_numpy(graph.receiver_node)[torch.from_numpy(graph.edge_receivers)]
    return torch.isin(node[inside], senders[added]) | torch.isin(
        senders[inside], node[added]
    )


def _swaps(
    graph: ModelGraph,
    value: Tensor,
    inside: Tensor,
    outside: Tensor,
    gap: Optional[float],
) -> Tuple[Tensor, Tensor]:
    r"""
    The swaps of a step: additions from ``outside`` and removals from
    ``inside``, paired best with worst by ``value`` (each edge's first-order
    change of ``f`` in the objective's direction) while each pair gains, no
    removal an edge an addition needs (:func:`_needed`); with ``gap``, no more
    than the first-order gain nearest to it.

    Returns:
        2-element tuple of **added** and **removed** edge indices, as many.
    """
    adds = outside[torch.argsort(value[outside], descending=True, stable=True)]
    removes = inside[torch.argsort(value[inside], stable=True)]
    n = min(len(adds), len(removes))
    count = int((value[adds[:n]] > value[removes[:n]]).sum())
    removes = removes[~_needed(graph, adds[:count], removes)]
    n = min(count, len(removes))
    gains = value[adds[:n]] - value[removes[:n]]
    count = int((gains > 0).sum())
    if gap is not None and count:
        reached = torch.cat([gains.new_zeros(1), gains[:count].cumsum(0)])
        count = int(torch.argmin((reached - gap).abs()))
    return adds[:count], removes[:count]


def _try(
    graph: ModelGraph,
    objective: Objective,
    ranking: Ranking,
    sizes: Sequence[int],
    k: int,
    gradient: Tensor,
    tries: int,
) -> Tuple[bool, int]:
    r"""
    A step at size ``k`` from ``gradient`` (``(E,)``, ``∂f/∂c`` at this
    size's circuit or a larger one): the module's 2 and 3.

    Returns:
        2-element tuple of **accepted** and the **passes** spent.
    """
    low, n, high = sizes[k - 1] if k else 0, sizes[k], sizes[k + 1]
    order, f = ranking.order, ranking.f[k]
    assert f is not None
    towards = 1.0 if not ranking.absolute or f < 1 else -1.0
    gap = abs(1 - f) if ranking.absolute else None
    added, removed = _swaps(graph, towards * gradient, order[low:n], order[n:high], gap)
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))
    count, passes = len(added), 0
    while count and passes < tries:
        new = order.clone()
        new[position[removed[:count]]] = added[:count]
        new[position[added[:count]]] = removed[:count]
        (measured,) = objective.faithfulness([_mask(graph, new[:n])])
        passes += 1
        if ranking.better(measured, f):
            ranking.order, ranking.f[k] = new, measured
            ranking.gains[k] = abs(measured - f)
            return True, passes
        count //= 2
    return False, passes


def _search(
    graph: ModelGraph,
    objective: Objective,
    ranking: Ranking,
    sizes: Sequence[int],
    weights: Tensor,
    budget: int,
    tries: int,
) -> None:
    r"""
    Rounds on one ranking while the budget of passes allows: a gradient at
    the circuit of the size of highest priority, then a step there (up to
    ``tries`` measurements; refused, the size is not searched again) and,
    with the same gradient, one measured step at each smaller size (their
    shells lie inside that circuit, whose gradient scores their edges), in
    order of priority.
    """
    searched = [
        k
        for k in range(len(sizes) - 1)
        if (sizes[k - 1] if k else 0) < sizes[k] < sizes[k + 1]
    ]
    spent = 0

    def measure(k: int) -> None:
        nonlocal spent
        keep = _mask(graph, ranking.order[: sizes[k]])
        (ranking.f[k],) = objective.faithfulness([keep])
        spent += 1

    while True:
        priority = {k: ranking.priority(k, float(weights[k])) for k in searched}
        ready = sorted(
            (k for k in searched if priority[k] > 0), key=priority.__getitem__
        )
        if not ready:
            return
        top = ready.pop()
        if ranking.f[top] is None:
            if spent + 1 > budget:
                return
            measure(top)
            continue  # its priority now knows its gap
        if spent + GRADIENT_PASSES + tries > budget:
            return
        keep = _mask(graph, ranking.order[: sizes[top]])
        gradient = edge_values(graph, objective.gradient(keep))
        spent += GRADIENT_PASSES
        accepted, passes = _try(graph, objective, ranking, sizes, top, gradient, tries)
        spent += passes
        if not accepted:
            ranking.gains[top] = 0.0
        for k in reversed([k for k in ready if k < top]):
            if ranking.f[k] is None and spent < budget:
                measure(k)
            if spent >= budget:
                return
            spent += _try(graph, objective, ranking, sizes, k, gradient, 1)[1]


def search_rankings(
    graph: ModelGraph,
    objective: Objective,
    warm: Tensor,
    *,
    percents: Sequence[float] = PERCENTS,
    budget: int = BUDGET,
    tries: int = TRIES,
) -> Tensor:
    r"""
    CPR's and CMD's circuits searched from a warm start (the module's
    search), as two rankings.

    Args:

        graph (ModelGraph): The model's graph.
        objective (Objective): The training faithfulness.
        warm (Tensor): ``(S, R)`` scores: the signed ranking starts CPR's
                    search, the absolute one CMD's.
        percents (list[float]): The circuit sizes, percent of the edges,
                    ascending, the last 100. Default: :data:`PERCENTS`
        budget (int): Passes over the training pairs to spend, half for
                    each ranking. Default: :data:`BUDGET`
        tries (int): Measurements per step. Default: :data:`TRIES`

    Returns:
        *Tensor*: ``(2, S, R)`` float64 scores, CPR's ranking then CMD's,
        each ``(E − rank) / E`` on the edges (all positive, no ties), NaN off
        them.

    Raises:
        ValueError: If ``percents`` does not rise to 100, or ``warm`` is not
            ``(S, R)`` or not finite on the edges.
    """
    if list(percents) != sorted(percents) or percents[-1] != 100:
        raise ValueError(
            f"percents: expected ascending sizes up to 100, got {percents}"
        )
    if tuple(warm.shape) != graph.legal.shape:
        raise ValueError(
            f"warm: expected scores of shape {graph.legal.shape}, "
            f"got {tuple(warm.shape)}"
        )
    values = edge_values(graph, warm.double().cpu())
    if not torch.isfinite(values).all():
        raise ValueError("warm: expected finite scores on every edge")
    E = graph.n_edges
    sizes = [int(p / 100 * E) for p in percents]
    weights = area_weights(percents)
    out = []
    for absolute in (False, True):
        start = values.abs() if absolute else values
        order = torch.argsort(start, descending=True, stable=True)
        ranking = Ranking(order, absolute, [None] * len(sizes), [1.0] * len(sizes))
        _search(graph, objective, ranking, sizes, weights, budget // 2, tries)
        rank = torch.empty(E, dtype=torch.float64)
        rank[ranking.order] = torch.arange(E, dtype=torch.float64)
        out.append(edge_matrix(graph, (E - rank) / E))
    return torch.stack(out)


def search_scores(context: ScoringContext) -> Tensor:
    r"""
    The ``search:METHOD`` scorer: the search on the context's pairs (the
    training pairs; the harness never gives it the scored ones), from
    ``METHOD``'s scores on them (``context.parts[0]``).

    Args:
        context (ScoringContext): The training pairs and the warm start.

    Returns:
        *Tensor*: ``(2, S, R)``, :func:`search_rankings`' rankings.
    """
    objective = PatchedObjective(context.model, context.batches, context.metric)
    return search_rankings(context.model.graph, objective, context.parts[0])
