r"""
What is not the attribution itself: IG-Lens compared with other methods
(:mod:`~captum_iglens.studies.comparison`), checked against causal ablation
(:mod:`~captum_iglens.studies.validation`), both over the methods of one
registry (:mod:`~captum_iglens.studies.methods`), and run over prompt sets
(:mod:`~captum_iglens.studies.batch`).
"""

from captum_iglens.studies.batch import (
    init_distributed,
    read_results,
    run_batch,
    to_result,
)
from captum_iglens.studies.comparison import ComparisonResult, compare, compare_text
from captum_iglens.studies.methods import COMPARED_METHODS, SCORED_METHODS
from captum_iglens.studies.prompts import read_prompts
from captum_iglens.studies.validation import (
    StudyOptions,
    ValidationResult,
    load_facts,
    run_validation,
)

__all__ = [
    "COMPARED_METHODS",
    "SCORED_METHODS",
    "ComparisonResult",
    "StudyOptions",
    "ValidationResult",
    "compare",
    "compare_text",
    "init_distributed",
    "load_facts",
    "read_prompts",
    "read_results",
    "run_batch",
    "run_validation",
    "to_result",
]
