r"""
Which half of the first-order rule separates the flow's circuits from
EAP-IG-inputs'. Both walk the same straight path of the embeddings from the
counterfactual prompt to the clean one and score edge ``u → w`` with the
receiver's input gradient ``ρ_w`` and the sender's write ``z_u``; they differ
in two ways, crossed here:

- the form: the whole change times the mean gradient, ``Δz · mean_k ρ_k``
  (EAP-IG's ``product``), or each step's change times that step's gradient,
  ``Σ_k ρ̄_k · δz_k`` (the flow's ``steps``);
- the grid: EAP-IG's ``left`` rule (``α = k / N``, ``k = 0 … N − 1``) or the
  flow's ``trapezoid`` (``k = 0 … N``, the ends at half weight).

The four are registered as scorers (``product-left`` is EAP-IG-inputs and
``steps-trapezoid`` the flow's first-order terms, ``flow-plain``, written
again from the harness's node-by-node runs: a check) and scored by
``benchmarks/circuits.py``'s runs, so a folder that holds ``eap-ig-inputs`` and
``flow-plain:5`` needs only the other two.

    python benchmarks/circuits_rules.py --models gemma3 --tasks greater-than \
        --methods steps-left:5,product-trapezoid:5 --out runs100
"""

import sys
from functools import partial
from typing import Any, Dict

import torch
from torch import Tensor

from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.graph.target import metric
from captum_iglens.studies.circuits.scorers import Scorer, register

import circuits

#: The four rules, ``FORM-GRID``.
RULES = ("product-left", "product-trapezoid", "steps-left", "steps-trapezoid")

#: The last run's scores, with the batches they were made of (held, and so
#: compared by identity) and the step count and metric.
_LAST: Dict[str, Any] = {}


def rule_scores(context: ScoringContext) -> Dict[str, Tensor]:
    r"""
    The four rules' ``(S, R)`` scores, averaged over pairs, from one walk of
    the path per batch (``steps + 1`` runs with gradients), kept for the other
    three scorers of the same run.
    """
    key = (context.steps, context.metric)
    if _LAST.get("batches") is context.batches and _LAST.get("key") == key:
        return _LAST["scores"]
    graph, n = context.model.graph, context.steps
    m = partial(metric, context.metric)
    scores = {
        rule: torch.zeros(graph.legal.shape, dtype=torch.float64) for rule in RULES
    }

    def dot(z: Tensor, rho: Tensor) -> Tensor:
        return torch.einsum("bstd,brtd->sr", z.double(), rho.double())

    for batch in context.batches:
        with torch.no_grad():
            ends = [
                context.model.run(ids, return_writes=True).writes[:, :1]
                for ids in (batch.counterfactual, batch.clean)
            ]
        writes, grads = [], []
        for k in range(n + 1):
            embed = ends[0] + k / n * (ends[1] - ends[0])
            run = context.model.run(
                batch.clean,
                override=(0, embed),
                return_writes=True,
                receiver_grads=True,
            )
            value = m(run.logits, batch.answer, batch.foil).sum()
            rho = torch.cat(torch.autograd.grad(value, run.inputs), 1)
            writes.append(run.writes.detach())
            grads.append(rho.detach())
        change = writes[n] - writes[0]
        left = sum(grads[:n]) / n
        trapezoid = left + (grads[n] - grads[0]) / (2 * n)
        scores["product-left"] += dot(change, left)
        scores["product-trapezoid"] += dot(change, trapezoid)
        for k in range(n):
            step = writes[k + 1] - writes[k]
            scores["steps-left"] += dot(step, grads[k])
            scores["steps-trapezoid"] += dot(step, (grads[k] + grads[k + 1]) / 2)
    averaged = {rule: s / context.n_pairs for rule, s in scores.items()}
    _LAST.update(batches=context.batches, key=key, scores=averaged)
    return averaged


def _rule(context: ScoringContext, rule: str) -> Tensor:
    return rule_scores(context)[rule]


if __name__ == "__main__":
    for rule in RULES:
        register(rule, Scorer(partial(_rule, rule=rule), f"the {rule} rule", 5))
    every = ",".join(f"{rule}:5" for rule in RULES)
    sys.exit(circuits.run(circuits.parse_args(__doc__, every)))
