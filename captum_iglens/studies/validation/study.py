r"""
The skeleton the validation studies share: per batch of prompts, one IG-Lens pass
gives the work every scored method runs on
(:func:`~captum_iglens.studies.validation.scoring.study_work`), the costly
methods run on a seeded subset, and the study's own causal test
(:class:`CausalTest`: ablation in
:mod:`~captum_iglens.studies.validation.ablation_study`, restoration in
:mod:`~captum_iglens.studies.validation.restoration_study`) measures the same
batch; :func:`score_prompts` runs that loop and returns the :class:`Scores`.
"""

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.nn import Module
from tqdm import tqdm

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import left_pad
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.methods.registry import (
    LEARNED_METHODS,
    METHODS,
    SCORED_METHODS,
    TRACED_METHODS,
)
from captum_iglens.studies.methods.runners import Work, default_baseline_token
from captum_iglens.studies.validation.scoring import (
    method_scores,
    study_work,
    subset_scores,
)
from captum_iglens.studies.validation.options import StudyOptions
from captum_iglens.studies.validation.stats import nonmonotone_depth

#: The study's defaults for the run settings; raw completion, short answers.
STUDY_SETTINGS = Settings(chat=False, max_new_tokens=8)


def check_arguments(
    settings: Optional[Settings],
    options: Dict[str, Any],
    methods: Sequence[str],
    study: StudyOptions,
    what: str,
    learned: bool = False,
    traced: bool = False,
) -> Tuple[Settings, List[str]]:
    r"""
    The checks both studies make.

    Args:

        settings (Settings, optional): The study's settings, None for
                    :data:`STUDY_SETTINGS`.
        options (dict): Fields of :class:`Settings` that override them.
        methods (list[str]): Names from :data:`SCORED_METHODS`.
        study (StudyOptions): The sampling and aggregation.
        what (str): Why the settings must be per block and for the answer.
        learned (bool, optional): A learned readout is given, so the methods of
                    :data:`LEARNED_METHODS` may be asked for too. Default: False
        traced (bool, optional): The study traces corruptions (restoration),
                    so the methods of :data:`TRACED_METHODS` may be asked for
                    too. Default: False

    Returns:
        2-element tuple of the settings and the methods without repeats.
    """
    settings = Settings.resolve(
        STUDY_SETTINGS if settings is None else settings, options
    )
    if settings.granularity != "block" or settings.positions != "answer":
        raise ValueError(
            f"settings: {what} for the answer's first token; use "
            "granularity='block' and positions='answer'"
        )
    if not isinstance(study, StudyOptions):
        raise TypeError(f"study: expected a StudyOptions, got {type(study).__name__}")
    known = (
        SCORED_METHODS
        + (LEARNED_METHODS if learned else ())
        + (TRACED_METHODS if traced else ())
    )
    unknown = [m for m in methods if m not in known]
    if unknown or not methods or isinstance(methods, str):
        needs = [m for m in unknown if m in LEARNED_METHODS]
        hint = f" ({', '.join(needs)} need a fitted lens: lens=)" if needs else ""
        restoration = [m for m in unknown if m in TRACED_METHODS]
        if restoration:
            hint += f" ({', '.join(restoration)}: only run_restoration runs them)"
        raise ValueError(
            f"methods: expected names from {list(known)}, got {methods!r}{hint}"
        )
    return settings, list(dict.fromkeys(methods))


class CausalTest(ABC):
    r"""
    What a study sets the scores against: a causal measurement of each batch of
    prompts, kept by the test, made after the batch's IG-Lens pass.
    """

    #: The progress bar's label.
    desc: str

    @abstractmethod
    def measure(self, rows: np.ndarray, ids: Tensor, mask: Tensor, work: Work) -> None:
        r"""
        Measures one batch.

        Args:

            rows (ndarray): ``(B,)`` the prompts' indices in the study.
            ids (Tensor): ``(B, T)`` their token ids, left-padded, on the
                        model's device.
            mask (Tensor): ``(B, T)``, zeros at padding.
            work (Work): The batch's work: its ``targets`` ``(B, 1)`` are the
                        model's greedy next tokens at the last position.
        """


@dataclass
class Scores:
    r"""
    What the common loop collects over ``n`` prompts and ``k`` blocks.

    Attributes:

        layer_names (list[str]): The ``k`` blocks' names.
        trajectory (ndarray): ``(n, k + 1)``: ``f(h_0), f(h_{L_1}), ..., p``.
        scores (dict[str, ndarray]): Per method, ``(n, k)``, NaN where not
                    computed.
        target_ids (list[int]): The ``n`` attributed tokens.
        conductance (ndarray): ``(n,)`` bool: the costly methods' subset.
        conductance_delta (list[float]): Their largest ``|convergence delta|``
                    per token of the subset.
        seconds (dict[str, float]): ``"lens"``: the scoring (costly methods
                    included); ``"conductance"``: the costly methods.
    """

    layer_names: List[str]
    trajectory: np.ndarray
    scores: Dict[str, np.ndarray]
    target_ids: List[int]
    conductance: np.ndarray
    conductance_delta: List[float]
    seconds: Dict[str, float]

    def nonmonotone_depth(self) -> np.ndarray:
        r"""``(n,)``: each trajectory's depth
        (:func:`~captum_iglens.studies.validation.stats.nonmonotone_depth`)."""
        return np.array([nonmonotone_depth(t) for t in self.trajectory])

    def run_settings(
        self, model: Module, settings: Settings, study: StudyOptions, **more: Any
    ) -> Dict[str, Any]:
        r"""The run's record: provenance, prompts, blocks, bootstrap and seed, then
        ``more``."""
        return dict(
            provenance(model, settings),
            n_prompts=len(self.trajectory),
            layers=[int(name) for name in self.layer_names],
            n_bootstrap=study.n_bootstrap,
            seed=study.seed,
            **more,
        )


def score_prompts(
    parts: ModelParts,
    ig_lens: LayerIGLens,
    encoded: Sequence[Tensor],
    pad_id: int,
    methods: List[str],
    settings: Settings,
    study: StudyOptions,
    test: CausalTest,
    progress: bool,
    learned: Optional[LayerIGLens] = None,
) -> Scores:
    r"""
    The common loop: every method's scores of each prompt's greedy next token,
    batch by batch, each batch then measured by ``test``. The seeded draws come
    in a fixed order: the costly methods' subset first, the random scores last.

    Args:

        parts (ModelParts): The causal LM's parts.
        ig_lens (LayerIGLens): IG-Lens on the study's blocks.
        encoded (list[Tensor]): Each prompt's ``(T_i,)`` token ids.
        pad_id (int): The padding token.
        methods (list[str]): Names from :data:`SCORED_METHODS`.
        settings (Settings): IG-Lens's settings.
        study (StudyOptions): Seed, batch size, the costly methods' subset.
        test (CausalTest): The study's causal measurement.
        progress (bool): Progress bar on stderr.
        learned (LayerIGLens, optional): The lens under a learned readout, for
                    the fitted-lens methods. Default: None

    Returns:
        :class:`Scores`.
    """
    n, k = len(encoded), len(ig_lens.layer_names)
    device = next(parts.model.parameters()).device
    rng = np.random.default_rng(study.seed)
    costly = [m for m in methods if METHODS[m].costly]
    scored = Scores(
        layer_names=list(ig_lens.layer_names),
        trajectory=np.zeros((n, k + 1)),
        scores={m: np.full((n, k), np.nan) for m in methods},
        target_ids=[],
        conductance=np.zeros(n, bool),
        conductance_delta=[],
        seconds={"lens": 0.0, "conductance": 0.0},
    )
    if costly:
        picked = rng.choice(n, min(study.conductance_prompts, n), replace=False)
        scored.conductance[picked] = True
    baseline_token = default_baseline_token(parts.model)
    if baseline_token is None:
        raise ValueError(
            "model: its config has neither pad_token_id nor bos_token_id, the "
            "token of Captum's baseline input in the study"
        )
    batches = range(0, n, study.batch_size)
    for start in tqdm(batches, desc=test.desc, disable=not progress):
        rows = np.arange(start, min(n, start + study.batch_size))
        ids, mask = left_pad([encoded[i] for i in rows], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        tick = time.perf_counter()
        work, trajectory = study_work(
            parts, ig_lens, ids, mask, settings, baseline_token, learned
        )
        scored.trajectory[rows] = trajectory.cpu().numpy()
        for m in methods:
            if METHODS[m].run is not None and not METHODS[m].costly:
                scored.scores[m][rows] = method_scores(work, m)
        _score_subset(scored, costly, rows, work, study.conductance_steps)
        scored.seconds["lens"] += time.perf_counter() - tick
        scored.target_ids += work.targets[:, 0].tolist()
        test.measure(rows, ids, mask, work)
    for m in methods:
        if METHODS[m].run is None:  # drawn, not run: "random"
            scored.scores[m] = rng.standard_normal((n, k))
    return scored


def _score_subset(
    scored: Scores, costly: List[str], rows: np.ndarray, work: Work, n_steps: int
) -> None:
    """The costly methods' scores of the batch ``rows``'s prompts in their subset."""
    subset = np.flatnonzero(scored.conductance[rows])
    if not len(subset):
        return
    clock = time.perf_counter()
    picked = torch.as_tensor(subset, device=work.input_ids.device)
    for m in costly:
        values, delta = subset_scores(work, m, picked, n_steps)
        scored.scores[m][rows[subset]] = values.numpy()
        scored.conductance_delta += delta.tolist()
    scored.seconds["conductance"] += time.perf_counter() - clock
