r"""The validation studies' options and the names they take, without torch (the
command line's help and choices read them)."""

from dataclasses import dataclass
from typing import Tuple

from captum_iglens.attr.flow.options import DEFAULT_STEPS

#: Ablation modes accepted by
#: :func:`~captum_iglens.studies.validation.ablation.ablate`.
MODES: Tuple[str, ...] = ("skip", "mean", "zero-at-position")


@dataclass(frozen=True)
class StudyOptions:
    r"""
    How the validation study samples and aggregates (the run's own settings are a
    :class:`~captum_iglens.Settings`).

    Attributes:

        n_bootstrap (int): Bootstrap resamples. Default: 1000.
        seed (int): Seed of the random baseline, the conductance subset and the
                    bootstrap. Default: 0.
        batch_size (int): Prompts per batch. Default: 8.
        conductance_prompts (int): Prompts given to Layer Conductance.
                    Default: 16.
        conductance_steps (int): Its integration steps. Default: 8.
        nonmonotone_threshold (float): A token is non-monotone when its lens
                    trajectory rises and then falls by more than this
                    (:func:`~captum_iglens.studies.validation.stats.nonmonotone_depth`).
                    Default: 0.1.
        onset_frac (float): The onset fraction. Default: 0.5.
        noise_scale (float): Restoration: the noise's standard deviation, in
                    units of the embeddings' standard deviation over the
                    vocabulary. Default: 3.0.
        noise_seeds (int): Restoration: noise draws per prompt. Default: 3.
        min_effect (float): Restoration: a token counts for a corruption only
                    when it lowers ``p`` by at least this fraction of
                    ``p_clean`` (the recovery is a ratio of that effect).
                    Default: 0.2.
        recovery_threshold (float): Restoration: the causal onset is the first
                    block whose recovery reaches it. Default: 0.5.
        flow_steps (int): Restoration: the steps of each probability flow of
                    ``ig_lens_flow``. Default:
                    :data:`~captum_iglens.attr.flow.options.DEFAULT_STEPS`.
    """

    n_bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 8
    conductance_prompts: int = 16
    conductance_steps: int = 8
    nonmonotone_threshold: float = 0.1
    onset_frac: float = 0.5
    noise_scale: float = 3.0
    noise_seeds: int = 3
    min_effect: float = 0.2
    recovery_threshold: float = 0.5
    flow_steps: int = DEFAULT_STEPS

    def __post_init__(self) -> None:
        for name in (
            "n_bootstrap",
            "batch_size",
            "conductance_steps",
            "noise_seeds",
            "flow_steps",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        for name in ("seed", "conductance_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        if not 0.0 < self.onset_frac <= 1.0:
            raise ValueError(f"onset_frac: expected (0, 1], got {self.onset_frac!r}")
        for name in ("noise_scale", "min_effect", "recovery_threshold"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name}: expected a number > 0, got {getattr(self, name)!r}"
                )
        if not self.nonmonotone_threshold >= 0:
            raise ValueError(
                "nonmonotone_threshold: expected a number >= 0, got "
                f"{self.nonmonotone_threshold!r}"
            )
