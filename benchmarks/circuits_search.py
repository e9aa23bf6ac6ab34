r"""
Does the search need the gradient at each circuit's own patched state?
``search:METHOD`` re-scores every edge at the circuit it is improving
(``∂f / ∂c`` at ``T_k``, EAP's score taken in the patched run); registered
here, ``search-at-model:METHOD`` is the same search with the gradient taken
once, at the full model (EAP's own score on the training pairs), so its swaps
are the first-order guesses a ranking already has, checked by the same
measurements and under the same budget of passes. With ``--train`` every
method, ``METHOD`` included, is scored on the training pairs, so ``METHOD``'s
row is the search's starting point unsearched. All are scored by
``benchmarks/circuits.py``'s runs on the same scored pairs.

    python benchmarks/circuits_search.py --models smollm2 --tasks ioi --pairs 8 \
        --train 8 --generate 40 --bootstrap 200 --out runs-search
"""

import sys
from typing import List, Sequence

from torch import Tensor

from captum_iglens.graph.circuit import legal_edges
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.objective import PatchedObjective
from captum_iglens.studies.circuits.scorers import Scorer, register
from captum_iglens.studies.circuits.search import search_rankings

import circuits


class AtModel:
    r"""An objective whose gradient is taken once, at the full model, whatever
    the circuit (the search's ablation)."""

    def __init__(self, objective: PatchedObjective) -> None:
        self.objective = objective
        self.at_model = objective.gradient(legal_edges(objective.model.graph))

    def faithfulness(self, keeps: Sequence[Tensor]) -> List[float]:
        return self.objective.faithfulness(keeps)

    def gradient(self, keep: Tensor) -> Tensor:
        return self.at_model


def search_at_model(context: ScoringContext) -> Tensor:
    """The search with every gradient taken at the full model."""
    objective = AtModel(
        PatchedObjective(context.model, context.batches, context.metric)
    )
    return search_rankings(context.model.graph, objective, context.parts[0])


if __name__ == "__main__":
    register(
        "search-at-model",
        Scorer(search_at_model, "the search, gradients at the model", searches=True),
    )
    methods = ",".join(
        f"{name}eap-ig-inputs:5" for name in ("", "search:", "search-at-model:")
    )
    sys.exit(circuits.run(circuits.parse_args(__doc__, methods)))
