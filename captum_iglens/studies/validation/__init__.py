r"""Does the IG-Lens onset predict where causal ablation hurts most, and where
restoring the attributed position recovers the answer?"""

from captum_iglens.studies.methods.registry import SCORED_METHODS
from captum_iglens.studies.validation.ablation import (
    MODES,
    Ablation,
    ablate,
    mean_updates,
)
from captum_iglens.studies.validation.ablation_study import run_validation
from captum_iglens.studies.validation.facts import Fact, load_facts
from captum_iglens.studies.validation.plot import plot_restoration, plot_validation
from captum_iglens.studies.validation.restoration import (
    CORRUPTIONS,
    Restoration,
    embedding_std,
    restore,
)
from captum_iglens.studies.validation.restoration_study import run_restoration
from captum_iglens.studies.validation.result import (
    RestorationResult,
    ValidationResult,
)
from captum_iglens.studies.validation.study import STUDY_SETTINGS, StudyOptions

__all__ = [
    "CORRUPTIONS",
    "MODES",
    "SCORED_METHODS",
    "STUDY_SETTINGS",
    "Ablation",
    "Fact",
    "Restoration",
    "RestorationResult",
    "StudyOptions",
    "ValidationResult",
    "ablate",
    "embedding_std",
    "load_facts",
    "mean_updates",
    "plot_restoration",
    "plot_validation",
    "restore",
    "run_restoration",
    "run_validation",
]
