r"""
The onset rules: which layer of a token's per-layer credits is "where the
answer arrives". :meth:`~captum_iglens.IGLensResult.onset` and the studies'
onsets (:func:`~captum_iglens.studies.validation.stats.onset_index`) both
apply :func:`onset_layers`, so every onset in the package follows one of the
rules of :data:`ONSET_RULES`:

- ``"abs"``: the earliest layer at which the cumulative ``|credit|`` reaches
  ``frac`` of the total ``|credit|`` (negative credits count as mass);
- ``"positive"``: the same on ``max(credit, 0)``: the earliest layer by which
  ``frac`` of the probability that is built has been built;
- ``"argmax"``: the layer with the largest (signed) credit, the first of tied
  ones; ``frac`` is not used.
"""

from typing import Callable, Dict

import torch
from torch import Tensor

from captum_iglens._utils.registry import registered

#: Relative slack of the cumulative rules, so that a mass reached up to
#: rounding counts as reached.
ONSET_SLACK = 1e-6


def _cumulative(mass: Tensor, frac: float) -> Tensor:
    """The first index where the cumulative ``mass`` reaches ``frac`` of its
    total; -1 where the total is zero."""
    running = mass.cumsum(-1)
    total = running[..., -1:]
    index = (running >= frac * total * (1 - ONSET_SLACK)).long().argmax(-1)
    return torch.where(total[..., 0] > 0, index, -1)


def _abs(credits: Tensor, frac: float) -> Tensor:
    return _cumulative(credits.abs(), frac)


def _positive(credits: Tensor, frac: float) -> Tensor:
    return _cumulative(credits.clamp(min=0), frac)


def _argmax(credits: Tensor, frac: float) -> Tensor:
    # argmax returns the first of tied maxima.
    index = credits.argmax(-1)
    return torch.where((credits != 0).any(-1), index, -1)


#: The onset rules by name (iterating gives the names).
ONSET_RULES: Dict[str, Callable[[Tensor, float], Tensor]] = {
    "abs": _abs,
    "positive": _positive,
    "argmax": _argmax,
}

#: The rule :meth:`~captum_iglens.IGLensResult.onset` and the studies use when
#: none is given.
DEFAULT_ONSET_RULE = "abs"


def onset_layers(
    credits: Tensor, frac: float = 0.5, rule: str = DEFAULT_ONSET_RULE
) -> Tensor:
    r"""
    The onset layer of each row of per-layer credits, under ``rule``.

    Args:

        credits (Tensor): ``(..., k)`` per-layer credits (or any per-layer
                    score), real-valued.
        frac (float, optional): Fraction of the mass that defines the onset
                    of the cumulative rules (``"abs"``, ``"positive"``), in
                    ``(0, 1]``. Default: 0.5
        rule (str, optional): A name in :data:`ONSET_RULES`.
                    Default: :data:`DEFAULT_ONSET_RULE`

    Returns:
        *Tensor* of shape ``(...)``, long: a layer index in ``[0, k)``, or
        ``-1`` where the rule finds none (no credit at all; under
        ``"positive"``, no positive credit).

    Raises:
        ValueError: If ``rule`` is not a rule's name, or ``frac`` is not in
            ``(0, 1]``.
    """
    apply = registered(ONSET_RULES, rule, "rule")
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac: expected a number in (0, 1], got {frac}")
    return apply(credits, frac)
