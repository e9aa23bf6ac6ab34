r"""Does the IG-Lens onset predict where causal ablation hurts most?"""

from captum_iglens.studies.validation.ablation import (
    MODES,
    Ablation,
    ablate,
    mean_updates,
)
from captum_iglens.studies.validation.facts import Fact, load_facts
from captum_iglens.studies.validation.result import ValidationResult
from captum_iglens.studies.validation.scoring import SCORED_METHODS
from captum_iglens.studies.validation.study import (
    STUDY_SETTINGS,
    StudyOptions,
    run_validation,
)

__all__ = [
    "MODES",
    "SCORED_METHODS",
    "STUDY_SETTINGS",
    "Ablation",
    "Fact",
    "StudyOptions",
    "ValidationResult",
    "ablate",
    "load_facts",
    "mean_updates",
    "run_validation",
]
