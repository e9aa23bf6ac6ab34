r"""
What is not the attribution itself: IG-Lens compared with other methods
(:mod:`~captum_iglens.studies.comparison`), checked against causal ablation
(:mod:`~captum_iglens.studies.validation`), both over the methods of one
registry (:mod:`~captum_iglens.studies.methods`), and run over prompt sets and
pair files (:mod:`~captum_iglens.studies.batch`), shared across processes under
``torchrun`` (:mod:`~captum_iglens.studies.distributed`).
"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.studies.batch import (
        graph_pairs,
        read_results,
        run_batch,
        to_result,
    )
    from captum_iglens.studies.distributed import init_distributed
    from captum_iglens.studies.comparison import ComparisonResult, compare, compare_text
    from captum_iglens.studies.methods import COMPARED_METHODS, SCORED_METHODS
    from captum_iglens.studies.pair_file import read_pairs
    from captum_iglens.studies.prompts import read_prompts
    from captum_iglens.studies.validation import (
        StudyOptions,
        ValidationResult,
        load_facts,
        run_validation,
    )

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "graph_pairs": "captum_iglens.studies.batch",
        "init_distributed": "captum_iglens.studies.distributed",
        "read_results": "captum_iglens.studies.batch",
        "run_batch": "captum_iglens.studies.batch",
        "to_result": "captum_iglens.studies.batch",
        "ComparisonResult": "captum_iglens.studies.comparison",
        "compare": "captum_iglens.studies.comparison",
        "compare_text": "captum_iglens.studies.comparison",
        "COMPARED_METHODS": "captum_iglens.studies.methods",
        "SCORED_METHODS": "captum_iglens.studies.methods",
        "read_pairs": "captum_iglens.studies.pair_file",
        "read_prompts": "captum_iglens.studies.prompts",
        "StudyOptions": "captum_iglens.studies.validation",
        "ValidationResult": "captum_iglens.studies.validation",
        "load_facts": "captum_iglens.studies.validation",
        "run_validation": "captum_iglens.studies.validation",
    },
)

__all__ = [
    "COMPARED_METHODS",
    "SCORED_METHODS",
    "ComparisonResult",
    "StudyOptions",
    "ValidationResult",
    "compare",
    "compare_text",
    "graph_pairs",
    "init_distributed",
    "load_facts",
    "read_pairs",
    "read_prompts",
    "read_results",
    "run_batch",
    "run_validation",
    "to_result",
]
