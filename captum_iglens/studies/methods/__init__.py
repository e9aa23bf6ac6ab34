r"""
The methods the studies run, shared by the comparison
(:mod:`~captum_iglens.studies.comparison`) and the validation and restoration
studies (:mod:`~captum_iglens.studies.validation`): the registry
(:mod:`~captum_iglens.studies.methods.registry`) and its runners over layers
(:mod:`~captum_iglens.studies.methods.runners`), over source tokens
(:mod:`~captum_iglens.studies.methods.source_runners`) and from each
corruption of the restoration study
(:mod:`~captum_iglens.studies.methods.traced_runners`). No study is imported
here.
"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.studies.methods.registry import (
        COMPARED_METHODS,
        LEARNED_METHODS,
        METHODS,
        SCORED_METHODS,
        SOURCE_METHODS,
        TRACED_METHODS,
        StudyMethod,
        outcome,
    )
    from captum_iglens.studies.methods.runners import Outcome, Work

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COMPARED_METHODS": "captum_iglens.studies.methods.registry",
        "LEARNED_METHODS": "captum_iglens.studies.methods.registry",
        "METHODS": "captum_iglens.studies.methods.registry",
        "SCORED_METHODS": "captum_iglens.studies.methods.registry",
        "SOURCE_METHODS": "captum_iglens.studies.methods.registry",
        "TRACED_METHODS": "captum_iglens.studies.methods.registry",
        "StudyMethod": "captum_iglens.studies.methods.registry",
        "outcome": "captum_iglens.studies.methods.registry",
        "Outcome": "captum_iglens.studies.methods.runners",
        "Work": "captum_iglens.studies.methods.runners",
    },
)

__all__ = [
    "COMPARED_METHODS",
    "LEARNED_METHODS",
    "METHODS",
    "SCORED_METHODS",
    "SOURCE_METHODS",
    "TRACED_METHODS",
    "Outcome",
    "StudyMethod",
    "Work",
    "outcome",
]
