r"""
The methods the studies run, shared by the comparison
(:mod:`~captum_iglens.studies.comparison`) and the validation and restoration
studies (:mod:`~captum_iglens.studies.validation`): the registry
(:mod:`~captum_iglens.studies.methods.registry`) and its runners over layers
(:mod:`~captum_iglens.studies.methods.runners`) and over source tokens
(:mod:`~captum_iglens.studies.methods.source_runners`). No study is imported
here.
"""

from captum_iglens.studies.methods.registry import (
    COMPARED_METHODS,
    LEARNED_METHODS,
    METHODS,
    SCORED_METHODS,
    SOURCE_METHODS,
    StudyMethod,
    outcome,
)
from captum_iglens.studies.methods.runners import Outcome, Work

__all__ = [
    "COMPARED_METHODS",
    "LEARNED_METHODS",
    "METHODS",
    "SCORED_METHODS",
    "SOURCE_METHODS",
    "Outcome",
    "StudyMethod",
    "Work",
    "outcome",
]
