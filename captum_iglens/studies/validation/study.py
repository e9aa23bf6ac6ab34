r"""
Does the IG-Lens onset predict where causal ablation hurts most?

If IG-Lens says block ``L`` is where token ``y`` is decided, removing block ``L``'s
update in a full forward pass should lower the model's real ``p(y)`` more than
removing blocks with lower scores. :func:`run_validation` measures that, for
IG-Lens and for the alternatives, over a prompt set: the model's greedy answer to
each prompt, its ablation drops (:mod:`~captum_iglens.studies.validation.ablation`),
every method's per-layer scores (:mod:`~captum_iglens.studies.validation.scoring`),
their agreement (:mod:`~captum_iglens.studies.validation.stats`) and bootstrap
confidence intervals, in a :class:`ValidationResult`.
"""

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch.nn import Module
from tqdm import tqdm

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.text import (
    decode_tokens,
    encode_prompt,
    generate,
    left_pad,
    pad_token_id,
)
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.validation.ablation import MODES, ablate, mean_updates
from captum_iglens.studies.validation.facts import Fact
from captum_iglens.studies.validation.result import ValidationResult
from captum_iglens.studies.validation.scoring import (
    SCORED_METHODS,
    conductance_scores,
    lens_scores,
)
from captum_iglens.studies.validation.stats import (
    METRICS,
    agreement,
    nonmonotone_depth,
    summarize,
)

#: The study's defaults for the run settings: raw completion, short answers.
STUDY_SETTINGS = Settings(chat=False, max_new_tokens=8)


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
    """

    n_bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 8
    conductance_prompts: int = 16
    conductance_steps: int = 8
    nonmonotone_threshold: float = 0.1
    onset_frac: float = 0.5

    def __post_init__(self) -> None:
        for name in ("n_bootstrap", "batch_size", "conductance_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        for name in ("seed", "conductance_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        if not 0.0 < self.onset_frac <= 1.0:
            raise ValueError(f"onset_frac: expected (0, 1], got {self.onset_frac!r}")
        if not self.nonmonotone_threshold >= 0:
            raise ValueError(
                "nonmonotone_threshold: expected a number >= 0, got "
                f"{self.nonmonotone_threshold!r}"
            )


def run_validation(
    model: Module,
    tokenizer: Any,
    prompts: Sequence[Union[Fact, str]],
    *,
    mode: str = "skip",
    methods: Sequence[str] = SCORED_METHODS,
    settings: Optional[Settings] = None,
    study: StudyOptions = StudyOptions(),
    progress: bool = True,
    **options: Any,
) -> ValidationResult:
    r"""
    Does a per-layer score predict where causal ablation hurts most?

    For each prompt, the model's greedy continuation is generated and its first
    token ``y`` (at the prompt's last position) is attributed: the drop in the
    model's real ``p(y)`` when each block is ablated
    (:func:`~captum_iglens.studies.validation.ablation.ablate`), beside each
    method's per-layer score of the same token, on the same blocks. Agreement per
    token (:func:`~captum_iglens.studies.validation.stats.agreement`) is
    aggregated with percentile bootstrap intervals.

    Methods (:data:`SCORED_METHODS`): ``"ig_lens"`` (signed credits, with the
    settings' estimator and baseline) and ``"ig_lens_abs"`` (their magnitudes);
    ``"logit_lens"`` (levels ``f(h_L)``) and ``"logit_lens_diff"`` (their
    differences from ``f(h_0)``), from the same pass; ``"dla"``;
    ``"layer_conductance"`` (on a seeded random subset of
    ``study.conductance_prompts`` prompts with ``study.conductance_steps`` steps,
    as it costs a forward and backward pass per step and block); ``"random"``
    (standard normal scores, seeded).

    With a subset of ``layers``, the segment scores (IG-Lens, lens differences,
    DLA) of block ``L_j`` cover every block after ``L_{j-1}`` up to ``L_j``, while
    the ablation removes ``L_j`` alone: use all blocks (the default) to compare
    like with like.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompts (list[Fact or str]): The prompts, e.g.
                    :func:`~captum_iglens.studies.load_facts`.
        mode (str, optional): The ablation, one of :data:`MODES`; ``"mean"``
                    uses the mean updates over all ``prompts``. Default: ``"skip"``.
        methods (list[str], optional): Names from :data:`SCORED_METHODS`.
                    Default: all of them.
        settings (Settings, optional): Layers, IG-Lens's estimator and
                    baseline, the chat template and the continuation length
                    used to check the answer. ``granularity`` must be
                    ``"block"`` and ``positions`` ``"answer"`` (the ablation
                    removes whole blocks; the study attributes the answer's
                    first token). Default: :data:`STUDY_SETTINGS` (raw
                    completion, 8 new tokens).
        study (StudyOptions, optional): Bootstrap, seed, batch size, Layer
                    Conductance subset, thresholds. Default: ``StudyOptions()``.
        progress (bool, optional): Progress bar on stderr. Default: True.
        **options (Any): Fields of :class:`Settings` that override ``settings``.

    Returns:
        :class:`ValidationResult`; print it for the table.
    """
    settings = Settings.resolve(
        STUDY_SETTINGS if settings is None else settings, options
    )
    if settings.granularity != "block" or settings.positions != "answer":
        raise ValueError(
            "settings: the validation study ablates whole blocks and attributes the "
            "answer's first token; use granularity='block' and positions='answer'"
        )
    if not isinstance(study, StudyOptions):
        raise TypeError(f"study: expected a StudyOptions, got {type(study).__name__}")
    unknown = [m for m in methods if m not in SCORED_METHODS]
    if unknown or not methods or isinstance(methods, str):
        raise ValueError(
            f"methods: expected names from {list(SCORED_METHODS)}, got {methods!r}"
        )
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    methods = list(dict.fromkeys(methods))
    facts = [
        p if isinstance(p, Fact) else Fact(str(i), "", p) for i, p in enumerate(prompts)
    ]
    if not facts:
        raise ValueError("prompts: expected at least one prompt")
    started = time.perf_counter()
    lens = LayerIGLens.from_model(
        model, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    chosen = [int(name) for name in lens.layer_names]  # from_model's block indices
    n, k = len(facts), len(chosen)
    device = next(model.parameters()).device
    encoded = [encode_prompt(tokenizer, f.prompt, chat=settings.chat)[0] for f in facts]
    pad_id = pad_token_id(tokenizer)
    means = (
        mean_updates(model, encoded, layers=settings.layers, pad_id=pad_id)
        if mode == "mean"
        else None
    )
    rng = np.random.default_rng(study.seed)
    conductance = np.zeros(n, bool)
    if "layer_conductance" in methods:
        picked = rng.choice(n, min(study.conductance_prompts, n), replace=False)
        conductance[picked] = True
    generated: List[str] = []
    target_ids: List[int] = []
    model_prob, drops, trajectory = np.zeros(n), np.zeros((n, k)), np.zeros((n, k + 1))
    scores = {m: np.full((n, k), np.nan) for m in methods}
    largest_prob_gap, conductance_delta, conductance_seconds = 0.0, [], 0.0
    batches = range(0, n, study.batch_size)
    for start in tqdm(batches, desc=f"validation ({mode})", disable=not progress):
        rows = np.arange(start, min(n, start + study.batch_size))
        answers = generate(
            model,
            tokenizer,
            [encoded[i] for i in rows],
            max_new_tokens=settings.max_new_tokens,
        )
        generated += [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
        ids, mask = left_pad([encoded[i] for i in rows], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        found, trajectory[rows], work = lens_scores(
            model, lens, ids, mask, settings, methods
        )
        target_ids += work.targets[:, 0].tolist()
        ablation = ablate(
            model,
            ids,
            mask,
            positions=[ids.shape[1] - 1],
            targets=work.targets,
            layers=settings.layers,
            mode=mode,
            means=means,
        )
        drops[rows] = ablation.drop[:, 0].numpy()
        model_prob[rows] = ablation.clean[:, 0].numpy()
        gap = np.abs(trajectory[rows, -1] - model_prob[rows]).max()
        largest_prob_gap = max(largest_prob_gap, float(gap))
        for m in methods:
            if m in found:
                scores[m][rows] = found[m]
        subset = np.flatnonzero(conductance[rows])
        if len(subset):
            clock = time.perf_counter()
            chosen_rows = torch.as_tensor(subset, device=device)
            values, delta = conductance_scores(
                work, chosen_rows, study.conductance_steps
            )
            scores["layer_conductance"][rows[subset]] = values.numpy()
            conductance_delta += delta.tolist()
            conductance_seconds += time.perf_counter() - clock
    if "random" in methods:
        scores["random"] = rng.standard_normal((n, k))
    correct = [f.is_answered_by(g) for f, g in zip(facts, generated)]
    values = _agreement(scores, drops, study.onset_frac)
    depth = np.array([nonmonotone_depth(t) for t in trajectory])
    groups = {
        "all": np.ones(n, bool),
        "correct": np.array([c is True for c in correct]),
        "non_monotone": depth > study.nonmonotone_threshold,
    }
    if conductance.any():
        groups["conductance_subset"] = conductance
    computed = {m: ~np.isnan(scores[m]).all(1) for m in methods}
    run = dict(
        provenance(model, settings),
        n_prompts=n,
        layers=chosen,
        n_bootstrap=study.n_bootstrap,
        seed=study.seed,
        chat=settings.chat,
        conductance_prompts=int(conductance.sum()),
        conductance_steps=study.conductance_steps,
        nonmonotone_threshold=study.nonmonotone_threshold,
        onset_frac=study.onset_frac,
        max_new_tokens=settings.max_new_tokens,
        notes=_notes(methods, settings, conductance, conductance_delta, study),
        max_gap_lens_vs_ablation_clean_prob=largest_prob_gap,
        conductance_seconds=conductance_seconds,
        seconds=time.perf_counter() - started,
    )
    return ValidationResult(
        mode=mode,
        methods=methods,
        layer_names=list(lens.layer_names),
        facts=facts,
        generated=generated,
        correct=correct,
        target_tokens=decode_tokens(tokenizer, target_ids),
        model_prob=model_prob,
        drops=drops,
        trajectory=trajectory,
        nonmonotone_depth=depth,
        scores=scores,
        values=values,
        groups=groups,
        summary=summarize(values, groups, computed, study.n_bootstrap, study.seed),
        settings=run,
    )


def _agreement(
    scores: Dict[str, np.ndarray], drops: np.ndarray, onset_frac: float
) -> Dict[str, Dict[str, np.ndarray]]:
    """Per-token agreement of each method's scores with the drops; NaN where not
    computed."""
    n = len(drops)
    values = {m: {metric: np.full(n, np.nan) for metric in METRICS} for m in scores}
    for m, rows in scores.items():
        for i in np.flatnonzero(~np.isnan(rows).all(1)):
            for metric, value in agreement(rows[i], drops[i], onset_frac).items():
                values[m][metric][i] = value
    return values


def _notes(
    methods: List[str],
    settings: Settings,
    conductance: np.ndarray,
    conductance_delta: List[float],
    study: StudyOptions,
) -> List[str]:
    notes = [
        "drop = p(y) − p(y | block ablated), the model's real probability; the "
        "ablation peak is the block with the largest drop.",
        "onset: the earliest block where the cumulative |score| reaches "
        f"{study.onset_frac} of the total (IG-Lens's rule, applied to every "
        "method); ties in an argmax are broken at random, in expectation.",
    ]
    exact_h0 = settings.baselines is None and settings.method == "prediction_aware"
    if "logit_lens_diff" in methods and "ig_lens" in methods and exact_h0:
        notes.append("logit_lens_diff equals ig_lens by construction (baseline h_0).")
    if conductance.any():
        notes.append(
            f"layer_conductance on a random subset of {int(conductance.sum())} "
            f"prompts, {study.conductance_steps} steps (max |convergence delta| per "
            f"token, median {np.median(conductance_delta):.2e}); compare within "
            "[conductance_subset]."
        )
    return notes
