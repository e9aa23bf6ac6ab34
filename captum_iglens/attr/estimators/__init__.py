r"""The estimators of IG-Lens, by the name ``method=`` takes.

A new estimator is one module with an
:class:`~captum_iglens.attr.estimators.base.Estimator` and one line in
:data:`ESTIMATORS`.
"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports
from captum_iglens._utils.registry import Home, Registry, registered

if TYPE_CHECKING:
    from captum_iglens.attr.estimators.adaptive import Adaptive
    from captum_iglens.attr.estimators.base import (
        Estimator,
        Integration,
        Segments,
        SplitChains,
    )
    from captum_iglens.attr.estimators.captum_rules import CaptumRule
    from captum_iglens.attr.estimators.prediction_aware import PredictionAware

#: Estimators accepted by ``method=``, by name: ours first, then Captum's rules
#: (iterating gives the names, importing nothing).
ESTIMATORS: "Registry[Estimator]" = Registry(
    __name__,
    {
        "prediction_aware": Home("prediction_aware:PREDICTION_AWARE"),
        "adaptive": Home("adaptive:ADAPTIVE"),
        "riemann_left": Home("captum_rules:RIEMANN_LEFT"),
        "riemann_right": Home("captum_rules:RIEMANN_RIGHT"),
        "riemann_middle": Home("captum_rules:RIEMANN_MIDDLE"),
        "riemann_trapezoid": Home("captum_rules:RIEMANN_TRAPEZOID"),
        "gausslegendre": Home("captum_rules:GAUSSLEGENDRE"),
    },
)


def estimator(method: str) -> "Estimator":
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


# Each class is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Adaptive": "captum_iglens.attr.estimators.adaptive",
        "Estimator": "captum_iglens.attr.estimators.base",
        "Integration": "captum_iglens.attr.estimators.base",
        "Segments": "captum_iglens.attr.estimators.base",
        "SplitChains": "captum_iglens.attr.estimators.base",
        "CaptumRule": "captum_iglens.attr.estimators.captum_rules",
        "PredictionAware": "captum_iglens.attr.estimators.prediction_aware",
    },
)

__all__ = [
    "ESTIMATORS",
    "Adaptive",
    "CaptumRule",
    "Estimator",
    "Integration",
    "PredictionAware",
    "Segments",
    "SplitChains",
    "estimator",
]
