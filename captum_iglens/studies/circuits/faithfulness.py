r"""
MIB's faithfulness of circuits: keep the top ``k%`` of edges, patch every
other edge to its counterfactual write, and read

.. math::

    f(k) = \frac{\bar m(C_k) - \bar m(\emptyset)}{\bar m(N) - \bar m(\emptyset)}

(means over pairs), for ``k`` in :data:`PERCENTS`. CPR is the area under
``f`` and CMD the area under ``|1 - f|``, by the trapezoid rule over the
fractions ``k / 100`` (MIB's ``evaluate_area_under_curve``); as in MIB, CPR
ranks edges by their signed score and CMD by its absolute value. The 95%
intervals resample pairs (bootstrap percentiles).
"""

from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.studies.distributed import computed_in_order
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.graph.circuit import top_edges
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.graph.target import metric as metric_of

#: MIB's circuit sizes, in percent of the edges.
PERCENTS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def ranking(scores: Tensor, absolute: bool) -> Tensor:
    r"""
    The scores one family of circuits is ranked by: a method's ``(S, R)``
    scores for both, or of a search's ``(2, S, R)`` the first for CPR's and
    the second for CMD's.

    Args:

        scores (Tensor): ``(S, R)`` or ``(2, S, R)``.
        absolute (bool): CMD's family (ranked by ``|score|``) or CPR's.

    Returns:
        *Tensor*: ``(S, R)``.
    """
    return scores[int(absolute)] if scores.dim() == 3 else scores


def circuits(graph: ModelGraph, scores: Tensor, absolute: bool) -> List[Tensor]:
    r"""
    The pruned top-``k%`` circuits of one scoring, for ``k`` in :data:`PERCENTS`.

    Args:

        graph (ModelGraph): The model's graph.
        scores (Tensor): ``(S, R)`` edge scores, or a search's ``(2, S, R)``
                    (:func:`ranking`).
        absolute (bool): Rank by ``|score|`` (CMD) or signed (CPR).

    Returns:
        *list[Tensor]*: one ``(S, R)`` bool circuit per size.
    """
    ranked = ranking(scores, absolute)
    return [
        top_edges(graph, ranked, int(pct / 100 * graph.n_edges), absolute)
        for pct in PERCENTS
    ]


@torch.no_grad()
def patched_metrics(
    model: CircuitModel,
    batches: Sequence[Batch],
    keeps: Sequence[Tensor],
    metric: str,
    n_pairs: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    ``m`` of every pair for the full model, the empty circuit and each circuit.
    The counterfactual writes are computed once per batch and reused by every
    circuit, and equal circuits run once.

    Args:

        model (CircuitModel): The bound model.
        batches (list[Batch]): The pairs.
        keeps (list[Tensor]): Circuits, each ``(S, R)`` bool.
        metric (str): The kind of ``m``
                    (:data:`~captum_iglens.graph.target.TARGETS`).
        n_pairs (int): The number of pairs (the batches' indices are below it).

    Returns:
        3-element tuple of **full** ``(N,)``, **empty** ``(N,)`` and
        **circuit** ``(len(keeps), N)``, float64.
    """
    m = partial(metric_of, metric)
    full = torch.zeros(n_pairs, dtype=torch.float64)
    empty = torch.zeros(n_pairs, dtype=torch.float64)
    circuit = torch.zeros(len(keeps), n_pairs, dtype=torch.float64)
    first: Dict[bytes, int] = {}  # equal circuits (CPR's and CMD's) run once
    same = [first.setdefault(k.cpu().numpy().tobytes(), i) for i, k in enumerate(keeps)]

    def metrics(batch: Batch) -> Tuple[Tensor, Tensor, Dict[int, Tensor]]:
        other = model.run(batch.counterfactual, return_writes=True)
        clean = model.run(batch.clean)
        values = {}
        for i, keep in enumerate(keeps):
            if same[i] == i:
                run = model.run(batch.clean, keep=keep, counterfactual=other.writes)
                values[i] = m(run.logits, batch.answer, batch.foil).double().cpu()
        return (
            m(clean.logits, batch.answer, batch.foil).double().cpu(),
            m(other.logits, batch.answer, batch.foil).double().cpu(),
            values,
        )

    # shared across processes under torchrun, every pair's values on each
    for batch, found in zip(batches, computed_in_order(batches, metrics)):
        index = batch.index.cpu()
        full[index], empty[index] = found[0], found[1]
        for i, value in found[2].items():
            circuit[i, index] = value
    for i, j in enumerate(same):
        circuit[i] = circuit[j]
    return full, empty, circuit


def faithfulness(full: Tensor, empty: Tensor, circuit: Tensor) -> Tensor:
    r"""
    ``f`` per circuit, from means over the pairs (the last axis).

    Args:

        full (Tensor): ``m(N)``, ``(..., N)``.
        empty (Tensor): ``m(∅)``, ``(..., N)``.
        circuit (Tensor): ``m(C)``, ``(K, ..., N)``.

    Returns:
        *Tensor*: ``(K, ...)``.
    """
    low, high = empty.mean(-1), full.mean(-1)
    return (circuit.mean(-1) - low) / (high - low)


def area_weights(percents: Sequence[float]) -> Tensor:
    r"""
    The weight of each size's ``f`` in the area under the curve (the
    trapezoid rule over the fractions ``k / 100``).

    Args:
        percents (list[float]): The sizes, ascending.

    Returns:
        *Tensor*: ``(K,)`` float64, summing to the last fraction minus the first.
    """
    x = torch.tensor(percents, dtype=torch.float64) / 100
    width = x[1:] - x[:-1]
    weights = torch.zeros_like(x)
    weights[1:] += width / 2
    weights[:-1] += width / 2
    return weights


def areas(f: Tensor) -> Tuple[Tensor, Tensor]:
    r"""
    CPR and CMD of curves over :data:`PERCENTS`.

    Args:

        f (Tensor): ``(K, ...)``, ``K = len(PERCENTS)``.

    Returns:
        2-element tuple of **cpr** and **cmd**, each ``(...)``.
    """
    weights = area_weights(PERCENTS).to(f.dtype).view(-1, *([1] * (f.dim() - 1)))
    return (weights * f).sum(0), (weights * (1 - f).abs()).sum(0)


@dataclass
class Curve:
    r"""
    The faithfulness of one method's circuits.

    Attributes:

        method (str): The scorer's name.
        n_edges (list[int]): Edges kept per size, after pruning (signed ranking).
        f (list[float]): ``f(k)`` of the signed ranking (CPR's curve).
        f_abs (list[float]): ``f(k)`` of the absolute ranking (CMD's curve).
        cpr (float), cmd (float): The areas.
        cpr_ci (tuple[float, float]), cmd_ci (tuple[float, float]): Their
                    bootstrap 95% intervals over pairs.
        seconds (dict[str, float]): Time spent scoring and evaluating.
    """

    method: str
    n_edges: List[int]
    f: List[float]
    f_abs: List[float]
    cpr: float
    cmd: float
    cpr_ci: Tuple[float, float]
    cmd_ci: Tuple[float, float]
    seconds: Dict[str, float] = field(default_factory=dict)


def curve(
    method: str,
    keeps: Sequence[Tensor],
    full: Tensor,
    empty: Tensor,
    signed: Tensor,
    absolute: Tensor,
    n_boot: int = 1000,
    seed: int = 0,
) -> Curve:
    r"""
    A method's curves, areas and intervals from per-pair metrics.

    Args:

        method (str): The scorer's name.
        keeps (list[Tensor]): The signed ranking's circuits (for their sizes).
        full (Tensor): ``m(N)`` per pair, ``(N,)``.
        empty (Tensor): ``m(∅)`` per pair, ``(N,)``.
        signed (Tensor): ``m`` of the signed ranking's circuits, ``(K, N)``.
        absolute (Tensor): ``m`` of the absolute ranking's circuits, ``(K, N)``.
        n_boot (int): Bootstrap resamples. Default: 1000
        seed (int): Their seed. Default: 0

    Returns:
        *Curve*.
    """
    f, f_abs = faithfulness(full, empty, signed), faithfulness(full, empty, absolute)
    cpr, _ = areas(f)
    _, cmd = areas(f_abs)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(len(full), (n_boot, len(full)), generator=generator)
    boot_cpr, _ = areas(faithfulness(full[rows], empty[rows], signed[:, rows]))
    _, boot_cmd = areas(faithfulness(full[rows], empty[rows], absolute[:, rows]))

    def interval(values: Tensor) -> Tuple[float, float]:
        q = torch.nanquantile(values, torch.tensor([0.025, 0.975], dtype=values.dtype))
        return float(q[0]), float(q[1])

    return Curve(
        method=method,
        n_edges=[int(k.sum()) for k in keeps],
        f=f.tolist(),
        f_abs=f_abs.tolist(),
        cpr=float(cpr),
        cmd=float(cmd),
        cpr_ci=interval(boot_cpr),
        cmd_ci=interval(boot_cmd),
    )
