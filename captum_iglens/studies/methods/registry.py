r"""
The one registry of the methods the studies score: :func:`compare` runs those
marked ``compared`` (by default those over layers; those over source tokens on
request), the validation and restoration studies those marked ``scored``, and
the restoration study those with a ``traced`` runner on request. A method is
one :class:`StudyMethod` entry; a new one is a runner in
:mod:`~captum_iglens.studies.methods.runners` (or
:mod:`~captum_iglens.studies.methods.source_runners`, or
:mod:`~captum_iglens.studies.methods.traced_runners`) and one line here.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

from captum_iglens._utils.registry import imported

if TYPE_CHECKING:
    import numpy as np

    from captum_iglens.studies.methods.runners import Outcome, Work
    from captum_iglens.studies.methods.traced_runners import Trace

#: A runner or a check: the function, or where it lives, ``"module:function"``
#: under :mod:`captum_iglens.studies.methods`, imported when it is first called
#: (so that the names and flags of :data:`METHODS` cost no import).
Function = Union[str, Callable[..., object]]

#: The IG-Lens granularity of ``ig_lens_sources``.
SOURCE_GRANULARITY = "source"


@dataclass(frozen=True)
class StudyMethod:
    r"""
    A method the studies score.

    Attributes:

        name (str): Its name in tables, results and ``--methods``.
        runner (str or Callable[[Work], Outcome], optional): Its token-by-layer
                    score of a
                    :class:`~captum_iglens.studies.methods.runners.Work`, or
                    where that function lives (:data:`Function`); None for
                    ``"random"``, which the studies draw from their seed.
        compared (bool): :func:`~captum_iglens.studies.compare` runs it.
        scored (bool): The validation and restoration studies score it.
        costly (bool): It costs a forward and backward pass per step and block,
                    so the studies run it on a seeded subset of
                    ``StudyOptions.conductance_prompts`` prompts with
                    ``StudyOptions.conductance_steps`` steps. Default: False.
        learned (bool): It reads a learned readout per layer (a fitted lens):
                    the restoration study scores it when given a lens.
                    Default: False.
        axis (str): What its columns are: ``"layers"`` (the chosen blocks or
                    their parts) or ``"sources"`` (the ``T`` source positions
                    of each attributed token). Default: ``"layers"``.
        missing (str or Callable[[], str or None], optional): Why it cannot
                    run in this version (None when it can), asked before any
                    work; or where that function lives. Default: None (it
                    always can).
        granularity (str, optional): The IG-Lens granularity it runs at, whose
                    needs (consecutive blocks) are checked before any method
                    runs. Default: None (the settings' own).
        traced (str or Callable[[Trace], ndarray], optional): Restoration
                    only: the share of the clean effect reached after each
                    block ``(k,)``, of one fact under one corruption (a
                    :class:`~captum_iglens.studies.methods.traced_runners.Trace`),
                    or where that function lives; the study runs it from each
                    corrupted start instead of ``runner`` (None), and its onset
                    is the first block where the share reaches the recovery
                    threshold, as the causal onset's. Default: None
    """

    name: str
    runner: Optional[Function]
    compared: bool
    scored: bool
    costly: bool = False
    learned: bool = False
    axis: str = "layers"
    missing: Optional[Function] = None
    granularity: Optional[str] = None
    traced: Optional[Function] = None

    @property
    def run(self) -> Optional[Callable[["Work"], "Outcome"]]:
        r"""Its runner (imported on first use), or None for ``"random"`` and
        the traced methods."""
        return _function(self.runner)

    @property
    def trace(self) -> Optional[Callable[["Trace"], "np.ndarray"]]:
        r"""Its traced runner (imported on first use), or None."""
        return _function(self.traced)

    def why_not(self) -> Optional[str]:
        r"""Why the method cannot run in this version, or None."""
        missing = _function(self.missing)
        return None if missing is None else missing()


def _function(function: Optional[Function]) -> Optional[Callable[..., Any]]:
    if isinstance(function, str):
        return imported(__package__ or "", function)
    return function


def outcome(work: "Work", name: str) -> "Outcome":
    r"""
    Method ``name``'s outcome on ``work``, run once: kept in ``work.outcomes``
    (where a study may already have put one read from its own pass).

    Args:

        work (Work): The inputs, targets, positions and blocks.
        name (str): A name from :data:`METHODS` with a runner.

    Returns:
        :class:`~captum_iglens.studies.methods.runners.Outcome`.
    """
    if name not in work.outcomes:
        run = METHODS[name].run
        if run is None:
            raise ValueError(f"name: {name!r} is drawn by the study, not run")
        work.outcomes[name] = run(work)
    return work.outcomes[name]


def _ig_lens_abs(work: "Work") -> "Outcome":
    """IG-Lens's credits' magnitudes, from its (shared) outcome."""
    signed = outcome(work, "ig_lens")
    note = "|credits| of: " + signed.note
    return replace(signed, scores=signed.scores.abs(), note=note)


#: Every method, in the order of the tables.
METHODS: Dict[str, StudyMethod] = {
    m.name: m
    for m in (
        StudyMethod("ig_lens", "runners:ig_lens", compared=True, scored=True),
        StudyMethod("ig_lens_abs", _ig_lens_abs, compared=False, scored=True),
        StudyMethod(
            "ig_lens_joint", "runners:ig_lens_joint", compared=True, scored=True
        ),
        StudyMethod("logit_lens", "runners:logit_lens", compared=True, scored=True),
        StudyMethod(
            "logit_lens_diff", "runners:logit_lens_diff", compared=True, scored=True
        ),
        StudyMethod("dla", "runners:dla", compared=True, scored=True),
        StudyMethod("dla_prob", "runners:dla_prob", compared=True, scored=False),
        StudyMethod(
            "layer_conductance",
            "runners:layer_conductance",
            compared=True,
            scored=True,
            costly=True,
        ),
        StudyMethod(
            "layer_integrated_gradients",
            "runners:layer_integrated_gradients",
            compared=True,
            scored=False,
        ),
        StudyMethod(
            "layer_integrated_gradients_multilayer",
            "runners:layer_integrated_gradients_multilayer",
            compared=True,
            scored=False,
        ),
        StudyMethod("random", None, compared=False, scored=True),
        StudyMethod(
            "ig_lens_sources",
            "source_runners:ig_lens_sources",
            compared=True,
            scored=False,
            axis="sources",
            missing="source_runners:source_granularity_missing",
            granularity=SOURCE_GRANULARITY,
        ),
        StudyMethod(
            "lig_embeddings",
            "source_runners:lig_embeddings",
            compared=True,
            scored=False,
            axis="sources",
        ),
        StudyMethod(
            "attention_rollout",
            "source_runners:attention_rollout",
            compared=True,
            scored=False,
            axis="sources",
        ),
        StudyMethod(
            "ig_lens_fitted",
            "runners:ig_lens_fitted",
            compared=False,
            scored=False,
            learned=True,
        ),
        StudyMethod(
            "ig_lens_fitted_block",
            "runners:ig_lens_fitted_block",
            compared=False,
            scored=False,
            learned=True,
        ),
        StudyMethod(
            "fitted_lens",
            "runners:fitted_lens",
            compared=False,
            scored=False,
            learned=True,
        ),
        StudyMethod(
            "ig_lens_flow",
            None,
            compared=False,
            scored=False,
            traced="traced_runners:ig_lens_flow",
        ),
    )
}

#: The methods :func:`~captum_iglens.studies.compare` runs by default, over
#: layers, in the order of its table.
COMPARED_METHODS: Tuple[str, ...] = tuple(
    n for n, m in METHODS.items() if m.compared and m.axis == "layers"
)

#: The source-token methods :func:`~captum_iglens.studies.compare` runs on
#: request: a score per source position of each attributed token.
SOURCE_METHODS: Tuple[str, ...] = tuple(
    n for n, m in METHODS.items() if m.compared and m.axis == "sources"
)

#: The methods the validation and restoration studies score, in the order of
#: their tables.
SCORED_METHODS: Tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.scored)

#: The methods that read a learned readout per layer, which the restoration
#: study scores beside :data:`SCORED_METHODS` when given a lens.
LEARNED_METHODS: Tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.learned)

#: The methods the restoration study runs from each corrupted start, on
#: request (the probability flow's onset): neither the validation study nor
#: :func:`~captum_iglens.studies.compare` runs them.
TRACED_METHODS: Tuple[str, ...] = tuple(
    n for n, m in METHODS.items() if m.traced is not None
)
