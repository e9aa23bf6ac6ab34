r"""IG-Lens beside the alternatives on the same tokens and layers."""

from captum_iglens.studies.comparison.compare import compare, compare_text
from captum_iglens.studies.comparison.heads import (
    format_head_agreement,
    head_rank_agreement,
)
from captum_iglens.studies.comparison.joint import (
    format_joint_agreement,
    joint_agreement,
)
from captum_iglens.studies.methods.registry import (
    COMPARED_METHODS,
    METHODS,
    SCORED_METHODS,
    SOURCE_METHODS,
    StudyMethod,
)
from captum_iglens.studies.comparison.plot import plot_comparison
from captum_iglens.studies.comparison.result import ComparisonResult, MethodResult
from captum_iglens.studies.comparison.sources import (
    format_source_agreement,
    source_rank_agreement,
)

__all__ = [
    "COMPARED_METHODS",
    "METHODS",
    "SCORED_METHODS",
    "SOURCE_METHODS",
    "ComparisonResult",
    "MethodResult",
    "StudyMethod",
    "compare",
    "compare_text",
    "format_head_agreement",
    "format_joint_agreement",
    "format_source_agreement",
    "head_rank_agreement",
    "joint_agreement",
    "plot_comparison",
    "source_rank_agreement",
]
