r"""
What a scorer of :data:`~captum_iglens.studies.circuits.scorers.SCORERS` gets
(:class:`ScoringContext`) and what it returns (:data:`Scores`), apart from the
scorers so that a scorer in a module of its own can take it.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

from torch import Tensor

from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.patching import CircuitModel

#: An ``(S, R)`` tensor over the graph's senders × receivers (a search's
#: ``(2, S, R)``: the ranking of CPR's circuits, then CMD's), or a score per
#: edge name.
Scores = Union[Tensor, Dict[str, float]]


@dataclass
class ScoringContext:
    r"""
    What a scorer gets.

    Attributes:

        model (CircuitModel): The bound model (``model.model`` is the Hugging
                    Face model, ``model.graph`` its edge graph).
        tokenizer (Any): The model's tokenizer.
        batches (list[Batch]): The pairs kept by the filter, in batches.
        n_pairs (int): Their number.
        metric (str): The name of ``m`` in
                    :data:`~captum_iglens.graph.target.TARGETS`.
        steps (int): The step count of integrated-gradient methods.
        seed (int): The seed of random choices.
        sample (int): Edges exactly patched by ``patching``.
        path (str, optional): The file of a method that reads one
                    (``eap-json:PATH``).
        parts (tuple[Tensor, ...]): The ``(S, R)`` scores of the parts of a
                    method that averages them (``mean:A+B``), in order, or
                    of the method a search starts from (``search:A``).
        train (ScoringContext, optional): The training pairs' context
                    (``--train``), which every method is scored in when
                    given. Default: None
    """

    model: CircuitModel
    tokenizer: object
    batches: Sequence[Batch]
    n_pairs: int
    metric: str
    steps: int = 5
    seed: int = 0
    sample: int = 100
    path: Optional[str] = None
    parts: Tuple[Tensor, ...] = ()
    train: Optional["ScoringContext"] = None
