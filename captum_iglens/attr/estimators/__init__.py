r"""The estimators of IG-Lens, by the name ``method=`` takes.

A new estimator is one module with an
:class:`~captum_iglens.attr.estimators.base.Estimator` and one line in
:data:`ESTIMATORS`.
"""

from typing import Dict

from captum_iglens._utils.registry import registered

from captum_iglens.attr.estimators.base import Estimator, Integration
from captum_iglens.attr.estimators.captum_rules import CaptumRule
from captum_iglens.attr.estimators.prediction_aware import PredictionAware

#: Estimators accepted by ``method=``, by name: ours first, then Captum's rules
#: (iterating gives the names).
ESTIMATORS: Dict[str, Estimator] = {
    estimator.name: estimator
    for estimator in (
        PredictionAware(),
        CaptumRule("riemann_left"),
        CaptumRule("riemann_right"),
        CaptumRule("riemann_middle"),
        CaptumRule("riemann_trapezoid"),
        CaptumRule("gausslegendre"),
    )
}


def estimator(method: str) -> Estimator:
    r"""
    The estimator named ``method``.

    Args:

        method (str): A name from :data:`ESTIMATORS`.

    Returns:
        *Estimator*: the registered object.

    Raises:
        ValueError: If no estimator has that name.
    """
    return registered(ESTIMATORS, method, "method")


__all__ = [
    "ESTIMATORS",
    "CaptumRule",
    "Estimator",
    "Integration",
    "PredictionAware",
    "estimator",
]
