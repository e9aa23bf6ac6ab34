r"""Does the IG-Lens onset predict where causal ablation hurts most, and where
restoring the attributed position recovers the answer?"""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.studies.methods.registry import SCORED_METHODS
    from captum_iglens.studies.validation.ablation import (
        Ablation,
        ablate,
        mean_updates,
    )
    from captum_iglens.studies.validation.ablation_study import run_validation
    from captum_iglens.studies.validation.facts import Fact, load_facts
    from captum_iglens.studies.validation.flow_onset import FlowOnsets, flow_onsets
    from captum_iglens.studies.validation.plot import plot_restoration, plot_validation
    from captum_iglens.attr.subject_noise import embedding_std
    from captum_iglens.studies.validation.restoration import (
        CORRUPTIONS,
        Restoration,
        restore,
    )
    from captum_iglens.studies.validation.restoration_study import run_restoration
    from captum_iglens.studies.validation.result import (
        RestorationResult,
        ValidationResult,
    )
    from captum_iglens.studies.validation.options import MODES, StudyOptions
    from captum_iglens.studies.validation.study import STUDY_SETTINGS

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SCORED_METHODS": "captum_iglens.studies.methods.registry",
        "MODES": "captum_iglens.studies.validation.options",
        "Ablation": "captum_iglens.studies.validation.ablation",
        "ablate": "captum_iglens.studies.validation.ablation",
        "mean_updates": "captum_iglens.studies.validation.ablation",
        "run_validation": "captum_iglens.studies.validation.ablation_study",
        "Fact": "captum_iglens.studies.validation.facts",
        "load_facts": "captum_iglens.studies.validation.facts",
        "FlowOnsets": "captum_iglens.studies.validation.flow_onset",
        "flow_onsets": "captum_iglens.studies.validation.flow_onset",
        "plot_restoration": "captum_iglens.studies.validation.plot",
        "plot_validation": "captum_iglens.studies.validation.plot",
        "CORRUPTIONS": "captum_iglens.studies.validation.restoration",
        "Restoration": "captum_iglens.studies.validation.restoration",
        "embedding_std": "captum_iglens.attr.subject_noise",
        "restore": "captum_iglens.studies.validation.restoration",
        "run_restoration": "captum_iglens.studies.validation.restoration_study",
        "RestorationResult": "captum_iglens.studies.validation.result",
        "ValidationResult": "captum_iglens.studies.validation.result",
        "STUDY_SETTINGS": "captum_iglens.studies.validation.study",
        "StudyOptions": "captum_iglens.studies.validation.options",
    },
)

__all__ = [
    "CORRUPTIONS",
    "MODES",
    "SCORED_METHODS",
    "STUDY_SETTINGS",
    "Ablation",
    "Fact",
    "FlowOnsets",
    "Restoration",
    "RestorationResult",
    "StudyOptions",
    "ValidationResult",
    "ablate",
    "embedding_std",
    "flow_onsets",
    "load_facts",
    "mean_updates",
    "plot_restoration",
    "plot_validation",
    "restore",
    "run_restoration",
    "run_validation",
]
