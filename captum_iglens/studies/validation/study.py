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
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.nn import Module
from tqdm import tqdm

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
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
from captum_iglens.studies.validation.restoration import (
    CORRUPTIONS,
    Restoration,
    embedding_std,
    restore,
)
from captum_iglens.studies.validation.result import (
    RestorationResult,
    ValidationResult,
)
from captum_iglens.studies.validation.scoring import (
    SCORED_METHODS,
    conductance_scores,
    lens_scores,
)
from captum_iglens.studies.validation.stats import (
    METRICS,
    agreement,
    causal_onset,
    nonmonotone_depth,
    onset_agreement,
    onset_index,
    recovery_gains,
    spearman,
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

    def __post_init__(self) -> None:
        for name in ("n_bootstrap", "batch_size", "conductance_steps", "noise_seeds"):
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


def _study_arguments(
    settings: Optional[Settings],
    options: Dict[str, Any],
    methods: Sequence[str],
    study: StudyOptions,
    what: str,
) -> Tuple[Settings, List[str]]:
    """The checks both studies make: their settings (``what`` says why they must be
    per block and for the answer), the methods (without repeats) and ``study``."""
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
    unknown = [m for m in methods if m not in SCORED_METHODS]
    if unknown or not methods or isinstance(methods, str):
        raise ValueError(
            f"methods: expected names from {list(SCORED_METHODS)}, got {methods!r}"
        )
    return settings, list(dict.fromkeys(methods))


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

        model (PreTrainedModel): A causal LM of a supported architecture;
                    a wrapper of one (TransformerLens bridge, nnsight model,
                    ``nn.DataParallel``), or its
                    :func:`~captum_iglens.hf.model_parts`.
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
    settings, methods = _study_arguments(
        settings, options, methods, study, "the validation study ablates whole blocks"
    )
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    facts = [
        p if isinstance(p, Fact) else Fact(str(i), "", p) for i, p in enumerate(prompts)
    ]
    if not facts:
        raise ValueError("prompts: expected at least one prompt")
    started = time.perf_counter()
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    lens = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    chosen = [int(name) for name in lens.layer_names]  # from_model's block indices
    n, k = len(facts), len(chosen)
    device = next(model.parameters()).device
    encoded = [encode_prompt(tokenizer, f.prompt, chat=settings.chat)[0] for f in facts]
    pad_id = pad_token_id(tokenizer)
    means = (
        mean_updates(parts, encoded, layers=settings.layers, pad_id=pad_id)
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
            parts, lens, ids, mask, settings, methods
        )
        target_ids += work.targets[:, 0].tolist()
        ablation = ablate(
            parts,
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
    # Removing block 0 or 1 breaks nearly everything; the same agreement without
    # them shows whether the scores order the later blocks.
    late = {m: rows[:, 2:] for m, rows in scores.items()}
    late_values = _agreement(late, drops[:, 2:], study.onset_frac) if k > 3 else {}
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
        summary_without_first=(
            summarize(late_values, groups, computed, study.n_bootstrap, study.seed)
            if late_values
            else {}
        ),
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


def run_restoration(
    model: Module,
    tokenizer: Any,
    prompts: Sequence[Fact],
    *,
    corruptions: Sequence[str] = CORRUPTIONS,
    methods: Sequence[str] = SCORED_METHODS,
    settings: Optional[Settings] = None,
    study: StudyOptions = StudyOptions(),
    progress: bool = True,
    **options: Any,
) -> RestorationResult:
    r"""
    Does the IG-Lens onset agree with the causal onset found by restoring the
    attributed position (causal tracing, in the style of Meng et al. 2022)?

    For each fact with a subject (:meth:`Fact.subject_span`), the model's greedy
    next token ``y`` at the prompt's last position is attributed, and its
    probability is traced
    (:func:`~captum_iglens.studies.validation.restoration.restore`) under two
    corruptions: Gaussian noise on the subject's embeddings
    (``study.noise_scale`` times :func:`embedding_std`, ``study.noise_seeds``
    draws), and a counterfactual subject of the same token length from the same
    relation (the next such fact in file order whose subject differs). The
    recovery ``r(L)`` of restoring block ``L``'s output at the last position
    gives the causal onset (the first block with ``r >= study.recovery_threshold``)
    and the per-block gains ``r(L) − r(L−1)``, compared with every method's onset
    and per-block scores
    (:func:`~captum_iglens.studies.validation.stats.onset_agreement`).

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture;
                    a wrapper of one (TransformerLens bridge, nnsight model,
                    ``nn.DataParallel``), or its
                    :func:`~captum_iglens.hf.model_parts`.
        tokenizer (PreTrainedTokenizerBase): Its (fast) tokenizer.
        prompts (list[Fact]): The facts, e.g. :func:`load_facts`; those without
                    a subject are left out.
        corruptions (list[str], optional): From :data:`CORRUPTIONS`.
                    Default: both.
        methods, settings, study, progress, **options: As in
                    :func:`run_validation` (``settings.chat`` must be False:
                    the subject is found in the raw prompt).

    Returns:
        :class:`RestorationResult`; print it for the table.
    """
    settings, methods = _study_arguments(
        settings, options, methods, study, "restoration restores whole blocks' outputs"
    )
    if settings.chat:
        raise ValueError("settings: restoration needs raw prompts; use chat=False")
    if "ig_lens" not in methods:
        raise ValueError(f"methods: restoration needs ig_lens, got {methods!r}")
    if not corruptions or any(c not in CORRUPTIONS for c in corruptions):
        raise ValueError(
            f"corruptions: expected names from {list(CORRUPTIONS)}, got "
            f"{corruptions!r}"
        )
    corruptions = list(corruptions)
    facts = [f for f in prompts if isinstance(f, Fact) and f.subject_span()]
    if not facts:
        raise ValueError("prompts: expected facts whose subject can be found")
    started = time.perf_counter()
    clock: Dict[str, float] = {"lens": 0.0, "noise": 0.0, "counterfactual": 0.0}
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    lens = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    n, k = len(facts), len(lens.layer_names)
    device = next(model.parameters()).device
    encoded, subjects = zip(*(_subject_tokens(tokenizer, f) for f in facts))
    swaps = _counterfactuals(facts, encoded, subjects)
    pad_id = pad_token_id(tokenizer)
    noise_std = study.noise_scale * embedding_std(model)
    rng = np.random.default_rng(study.seed)
    conductance = np.zeros(n, bool)
    if "layer_conductance" in methods:
        conductance[rng.choice(n, min(study.conductance_prompts, n), False)] = True
    target_ids: List[int] = []
    trajectory = np.zeros((n, k + 1))
    probs = {c: np.full((n, k + 2), np.nan) for c in corruptions}  # clean, corrupt, r
    scores = {m: np.full((n, k), np.nan) for m in methods}
    batches = range(0, n, study.batch_size)
    for start in tqdm(batches, desc="restoration", disable=not progress):
        rows = np.arange(start, min(n, start + study.batch_size))
        ids, mask = left_pad([encoded[i] for i in rows], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        tick = time.perf_counter()
        found, trajectory[rows], work = lens_scores(
            parts, lens, ids, mask, settings, methods
        )
        for m in methods:
            if m in found:
                scores[m][rows] = found[m]
        subset = np.flatnonzero(conductance[rows])
        if len(subset):
            values, _ = conductance_scores(
                work, torch.as_tensor(subset, device=device), study.conductance_steps
            )
            scores["layer_conductance"][rows[subset]] = values.numpy()
        clock["lens"] += time.perf_counter() - tick
        targets = work.targets[:, 0]
        target_ids += targets.tolist()
        if "noise" in corruptions:
            tick = time.perf_counter()
            where, _ = left_pad([subjects[i].long() for i in rows], 0)
            traced = restore(
                parts,
                ids,
                mask,
                targets=targets,
                subject_mask=where.bool(),
                noise_std=noise_std,
                seeds=range(study.seed, study.seed + study.noise_seeds),
                layers=settings.layers,
            )
            probs["noise"][rows] = _columns(traced)
            clock["noise"] += time.perf_counter() - tick
        swapped = [r for r in range(len(rows)) if swaps[rows[r]] is not None]
        if "counterfactual" in corruptions and swapped:
            tick = time.perf_counter()
            picked = rows[swapped]
            other = ids[swapped].clone()  # same left padding: aligned at the end
            for r, i in enumerate(picked):
                other[r, -len(swaps[i]) :] = swaps[i]
            traced = restore(
                parts,
                ids[swapped],
                mask[swapped],
                targets=targets[swapped],
                corrupted_ids=other,
                layers=settings.layers,
            )
            probs["counterfactual"][picked] = _columns(traced)
            clock["counterfactual"] += time.perf_counter() - tick
    if "random" in methods:
        scores["random"] = rng.standard_normal((n, k))
    depth = np.array([nonmonotone_depth(t) for t in trajectory])
    monotone = depth <= study.nonmonotone_threshold
    onsets = {
        m: np.array([_onset(row, study.onset_frac) for row in scores[m]])
        for m in methods
    }
    summary, causal = {}, {}
    for c in corruptions:
        clean, corrupt, recovery = probs[c][:, 0], probs[c][:, 1], _recovery(probs[c])
        effective = clean - corrupt >= study.min_effect * clean
        causal[c] = np.array(
            [
                causal_onset(r, study.recovery_threshold) if ok else np.nan
                for r, ok in zip(recovery, effective)
            ],
            dtype=float,
        )
        groups = {
            "all": effective,
            "monotone": effective & monotone,
            "non_monotone": effective & ~monotone,
        }
        if conductance.any():
            groups["conductance_subset"] = effective & conductance
        summary[c] = {
            g: {
                m: onset_agreement(
                    np.where(members, onsets[m], np.nan),
                    causal[c],
                    _gain_spearman(scores[m], recovery, members),
                    study.n_bootstrap,
                    study.seed,
                )
                for m in methods
            }
            for g, members in groups.items()
        }
    run = dict(
        provenance(model, settings),
        n_prompts=n,
        layers=[int(name) for name in lens.layer_names],
        n_bootstrap=study.n_bootstrap,
        seed=study.seed,
        noise_scale=study.noise_scale,
        noise_std=noise_std,
        noise_seeds=study.noise_seeds,
        min_effect=study.min_effect,
        recovery_threshold=study.recovery_threshold,
        onset_frac=study.onset_frac,
        nonmonotone_threshold=study.nonmonotone_threshold,
        conductance_prompts=int(conductance.sum()),
        conductance_steps=study.conductance_steps,
        seconds=time.perf_counter() - started,
        seconds_by_part=clock,
    )
    return RestorationResult(
        corruptions=corruptions,
        methods=methods,
        layer_names=list(lens.layer_names),
        facts=facts,
        target_tokens=decode_tokens(tokenizer, target_ids),
        trajectory=trajectory,
        nonmonotone_depth=depth,
        probs=probs,
        scores=scores,
        onsets={m: v.astype(float) for m, v in onsets.items()},
        causal_onsets=causal,
        conductance=conductance,
        summary=summary,
        settings=run,
    )


def _subject_tokens(tokenizer: Any, fact: Fact) -> Tuple[Tensor, Tensor]:
    """The prompt's ids (as :func:`encode_prompt` without chat) and a ``(T,)``
    bool mask of the tokens that overlap the subject's characters."""
    ids = encode_prompt(tokenizer, fact.prompt, chat=False)[0]
    offsets = tokenizer(fact.prompt, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) != len(ids):
        raise ValueError(f"tokenizer: offsets of {fact.prompt!r} do not match its ids")
    start, end = fact.subject_span()  # type: ignore[misc]
    where = torch.tensor([a < end and b > start and b > a for a, b in offsets])
    if not where.any():
        raise ValueError(f"tokenizer: no token covers the subject of {fact.id}")
    return ids, where


def _counterfactuals(
    facts: Sequence[Fact], encoded: Sequence[Tensor], subjects: Sequence[Tensor]
) -> List[Optional[Tensor]]:
    """Per fact, its ids with the subject tokens of the next fact (in order,
    cyclically) of the same relation whose subject has as many tokens, other
    ids and another answer; None where there is none."""
    out: List[Optional[Tensor]] = []
    n = len(facts)
    for i, fact in enumerate(facts):
        mine = encoded[i][subjects[i]]
        swap = None
        for step in range(1, n):
            j = (i + step) % n
            theirs = encoded[j][subjects[j]]
            if (
                facts[j].relation == fact.relation
                and len(theirs) == len(mine)
                and not torch.equal(theirs, mine)
                and facts[j].answer != fact.answer
            ):
                swap = encoded[i].clone()
                swap[subjects[i]] = theirs
                break
        out.append(swap)
    return out


def _columns(traced: Restoration) -> np.ndarray:
    """``(B, k + 2)``: clean, corrupted and restored probabilities."""
    return torch.cat(
        [traced.clean[:, None], traced.corrupt[:, None], traced.restored], 1
    ).numpy()


def _recovery(columns: np.ndarray) -> np.ndarray:
    gap = columns[:, :1] - columns[:, 1:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (columns[:, 2:] - columns[:, 1:2]) / gap


def _onset(row: np.ndarray, frac: float) -> float:
    if np.isnan(row).any():
        return np.nan
    onset = onset_index(row, frac)
    return np.nan if onset < 0 else float(onset)


def _gain_spearman(
    scores: np.ndarray, recovery: np.ndarray, members: np.ndarray
) -> np.ndarray:
    out = np.full(len(scores), np.nan)
    for i in np.flatnonzero(members):
        if not np.isnan(scores[i]).any() and np.isfinite(recovery[i]).all():
            out[i] = spearman(scores[i], recovery_gains(recovery[i]))
    return out
