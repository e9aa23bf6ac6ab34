r"""
Does the IG-Lens onset agree with the causal onset found by restoring the
attributed position? :func:`run_restoration` traces each fact's answer under two
corruptions (:mod:`~captum_iglens.studies.validation.restoration`) and compares
the causal onsets and per-block recovery gains with every method's onset and
scores, on the common loop of :mod:`~captum_iglens.studies.validation.study`;
the traced methods (:data:`TRACED_METHODS`, the probability flow's onset) run
from each corrupted start of each fact, beside its restoration.
"""

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.subject_noise import embedding_std, subject_mask
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import encode_prompt, left_pad, pad_token_id
from captum_iglens.onset import DEFAULT_ONSET_RULE, ONSET_RULES
from captum_iglens.readout.layer_readout import LensType, readout_record
from captum_iglens.settings import Settings
from captum_iglens.studies.methods.registry import (
    LEARNED_METHODS,
    METHODS,
    SCORED_METHODS,
    TRACED_METHODS,
)
from captum_iglens.studies.methods.runners import Work
from captum_iglens.studies.methods.traced_runners import Trace
from captum_iglens.studies.validation.facts import Fact
from captum_iglens.studies.validation.restoration import (
    CORRUPTIONS,
    Restoration,
    restore,
)
from captum_iglens.studies.validation.result import RestorationResult
from captum_iglens.studies.validation.stats import (
    causal_onset,
    onset_agreement,
    onset_index,
    recovery_gains,
    spearman,
)
from captum_iglens.studies.validation.study import (
    CausalTest,
    Scores,
    StudyOptions,
    check_arguments,
    score_prompts,
)


class Restorations(CausalTest):
    r"""
    Each fact's clean, corrupted and restored probabilities of its answer under
    each corruption (:func:`~captum_iglens.studies.validation.restoration.restore`),
    and the traced methods' shares from the same corruptions.

    Args:

        parts (ModelParts): The causal LM's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        corruptions (list[str]): From :data:`CORRUPTIONS`.
        subjects (list[Tensor]): Per fact, ``(T_i,)`` bool: its subject's tokens.
        swaps (list[Tensor or None]): Per fact, its counterfactual ids, or None.
        noise_std (float): The noise's standard deviation.
        settings (Settings): The blocks.
        study (StudyOptions): The seed and number of noise draws, the flow's
                    steps.
        layers (list[int]): The study's blocks.
        traced (list[str]): The methods of :data:`TRACED_METHODS` to run.
    """

    desc = "restoration"

    def __init__(
        self,
        parts: ModelParts,
        tokenizer: Any,
        corruptions: List[str],
        subjects: Sequence[Tensor],
        swaps: Sequence[Optional[Tensor]],
        noise_std: float,
        settings: Settings,
        study: StudyOptions,
        layers: List[int],
        traced: List[str],
    ) -> None:
        self.parts, self.tokenizer = parts, tokenizer
        self.subjects, self.swaps = subjects, swaps
        self.noise_std, self.settings, self.study = noise_std, settings, study
        self.layers = layers
        n, k = len(subjects), len(layers)
        # Per corruption, (n, k + 2): clean, corrupted, restored at each block.
        self.probs = {c: np.full((n, k + 2), np.nan) for c in corruptions}
        self.seconds = {c: 0.0 for c in CORRUPTIONS}
        # Per corruption and traced method, (n, k): its shares.
        self.shares = {
            c: {m: np.full((n, k), np.nan) for m in traced} for c in corruptions
        }
        # Per traced method and corruption, its time and corrupted starts.
        self.runs = {
            m: {c: {"seconds": 0.0, "runs": 0} for c in corruptions} for m in traced
        }

    def measure(self, rows: np.ndarray, ids: Tensor, mask: Tensor, work: Work) -> None:
        targets = work.targets[:, 0]
        if "noise" in self.probs:
            tick = time.perf_counter()
            where, _ = left_pad([self.subjects[i].long() for i in rows], 0)
            traced = restore(
                self.parts,
                ids,
                mask,
                targets=targets,
                subject_mask=where.bool(),
                noise_std=self.noise_std,
                seeds=range(self.study.seed, self.study.seed + self.study.noise_seeds),
                layers=self.settings.layers,
            )
            self.probs["noise"][rows] = _columns(traced)
            self.seconds["noise"] += time.perf_counter() - tick
        swapped = [r for r in range(len(rows)) if self.swaps[rows[r]] is not None]
        if "counterfactual" in self.probs and swapped:
            tick = time.perf_counter()
            picked = rows[swapped]
            other = ids[swapped].clone()  # same left padding: aligned at the end
            for r, i in enumerate(picked):
                other[r, -len(self.swaps[i]) :] = self.swaps[i]
            traced = restore(
                self.parts,
                ids[swapped],
                mask[swapped],
                targets=targets[swapped],
                corrupted_ids=other,
                layers=self.settings.layers,
            )
            self.probs["counterfactual"][picked] = _columns(traced)
            self.seconds["counterfactual"] += time.perf_counter() - tick
        for c in self.shares:
            self._trace(c, rows, ids, mask, targets)

    def _trace(
        self,
        corruption: str,
        rows: np.ndarray,
        ids: Tensor,
        mask: Tensor,
        targets: Tensor,
    ) -> None:
        """Each traced method's shares of the batch's facts under ``corruption``."""
        for r, i in enumerate(rows):
            trace = fact_trace(
                self.parts,
                self.tokenizer,
                ids[r, mask[r].bool()],
                int(targets[r]),
                self.subjects[i],
                self.swaps[i],
                corruption,
                self.layers,
                self.study,
            )
            if trace is None:
                continue
            for m, shares in self.shares[corruption].items():
                tick = time.perf_counter()
                shares[i] = METHODS[m].trace(trace)  # type: ignore[misc]
                record = self.runs[m][corruption]
                record["seconds"] += time.perf_counter() - tick
                record["runs"] += trace.runs


def fact_trace(
    parts: ModelParts,
    tokenizer: Any,
    ids: Tensor,
    target: int,
    subject: Tensor,
    swap: Optional[Tensor],
    corruption: str,
    layers: List[int],
    study: StudyOptions,
) -> Optional[Trace]:
    r"""
    One fact under one of the study's corruptions, as the traced methods run it:
    the study's noise draws on its subject, or its counterfactual subject.

    Args:

        parts (ModelParts): The causal LM's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        ids (Tensor): ``(T,)`` the fact's prompt (:func:`subject_tokens`).
        target (int): Its attributed token.
        subject (Tensor): ``(T,)`` bool: its subject's tokens.
        swap (Tensor, optional): ``(T,)`` its counterfactual prompt
                    (:func:`counterfactual_subjects`), None where none fits.
        corruption (str): From :data:`CORRUPTIONS`.
        layers (list[int]): The study's blocks.
        study (StudyOptions): The noise's scale, seed and draws; the flow's
                    steps.

    Returns:
        :class:`~captum_iglens.studies.methods.traced_runners.Trace`, or None
        where the corruption is counterfactual and no counterfactual fits.
    """
    if corruption == "counterfactual" and swap is None:
        return None
    device = next(parts.model.parameters()).device
    counterfactual = (
        None if corruption == "noise" or swap is None else swap[None].to(device)
    )
    return Trace(
        parts,
        tokenizer,
        ids[None].to(device),
        target,
        layers,
        study.flow_steps,
        subject,
        study.noise_scale,
        range(study.seed, study.seed + study.noise_seeds),
        counterfactual,
    )


def share_onsets(shares: np.ndarray, threshold: float) -> np.ndarray:
    r"""
    A traced method's onsets: the first block where its share reaches the
    recovery threshold, as the causal onset is the first where the recovery
    does.

    Args:

        shares (np.ndarray): ``(N, k)`` shares, NaN rows where not traced.
        threshold (float): The study's ``recovery_threshold``.

    Returns:
        *np.ndarray* ``(N,)``: NaN where not traced or never reached.
    """
    out = np.full(len(shares), np.nan)
    for i, row in enumerate(shares):
        if not np.isnan(row).any():
            onset = causal_onset(row, threshold)
            out[i] = np.nan if onset < 0 else onset
    return out


def share_gains(shares: np.ndarray) -> np.ndarray:
    r"""``(N, k)``: a traced method's per-block gains of its ``(N, k)`` shares,
    the share before block 0 being 0 (as the recovery's gains)."""
    return np.diff(shares, axis=1, prepend=0.0)


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
    lens: LensType = None,
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
    (``study.noise_scale`` times
    :func:`~captum_iglens.attr.subject_noise.embedding_std`, ``study.noise_seeds``
    draws), and a counterfactual subject of the same token length from the same
    relation (the next such fact in file order whose subject differs). The
    recovery ``r(L)`` of restoring block ``L``'s output at the last position
    gives the causal onset (the first block with ``r >= study.recovery_threshold``)
    and the per-block gains ``r(L) − r(L−1)``, compared with every method's onset
    and per-block scores
    (:func:`~captum_iglens.studies.validation.stats.onset_agreement`).

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture.
        tokenizer (PreTrainedTokenizerBase): Its (fast) tokenizer.
        prompts (list[Fact]): The facts, e.g. :func:`load_facts`; those whose
                    subject is not found (:meth:`Fact.subject_span`) are left
                    out, and named in ``settings["subjects_not_found"]`` and
                    the table.
        corruptions (list[str], optional): From :data:`CORRUPTIONS`.
                    Default: both.
        methods (list[str], optional): As in :func:`run_validation`, and
                    those of :data:`TRACED_METHODS` (``"ig_lens_flow"``: the
                    probability flow from each of the fact's corrupted starts,
                    ``study.flow_steps`` steps; its onset is the first block
                    where the share of ``Δp`` crossing the attributed
                    position reaches ``study.recovery_threshold``); so are
                    ``settings``, ``study``, ``progress`` and ``**options``
                    (``settings.chat`` must be False: the subject is found in the
                    raw prompt).
        lens (str, Path, Translators or LayerwiseReadout, optional): A
                    learned readout per layer (a fitted lens: a tuned-lens
                    folder, translators or a readout object), checked
                    against the model before any forward. Its methods
                    (:data:`LEARNED_METHODS`: IG-Lens under it, whole terms and
                    block parts, and its own levels) are scored beside the
                    default methods, or where ``methods`` names them.
                    Default: None

    Returns:
        :class:`RestorationResult`; print it for the table.
    """
    if lens is not None and tuple(methods) == SCORED_METHODS:
        methods = SCORED_METHODS + LEARNED_METHODS
    settings, methods = check_arguments(
        settings,
        options,
        methods,
        study,
        "restoration restores whole blocks' outputs",
        learned=lens is not None,
        traced=True,
    )
    facts = traced_facts(prompts, corruptions, methods, settings)
    started = time.perf_counter()
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    learned = _learned_lens(parts, lens, settings)
    ig_lens = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    encoded, subjects = zip(*(subject_tokens(tokenizer, f) for f in facts))
    noise_std = study.noise_scale * embedding_std(model)
    test = Restorations(
        parts,
        tokenizer,
        list(corruptions),
        subjects,
        counterfactual_subjects(facts, encoded, subjects),
        noise_std,
        settings,
        study,
        [int(name) for name in ig_lens.layer_names],
        [m for m in methods if m in TRACED_METHODS],
    )
    scored = score_prompts(
        parts,
        ig_lens,
        encoded,
        pad_token_id(tokenizer),
        [m for m in methods if m not in TRACED_METHODS],
        settings,
        study,
        test,
        progress,
        learned,
    )
    run = _run_record(model, settings, study, scored, test, started, learned)
    return _restoration_result(
        tokenizer, prompts, facts, list(corruptions), methods, scored, test, run
    )


def _restoration_result(
    tokenizer: Any,
    prompts: Sequence[Fact],
    facts: List[Fact],
    corruptions: List[str],
    methods: List[str],
    scored: Scores,
    test: Restorations,
    run: Dict[str, Any],
) -> RestorationResult:
    """Every method's onsets beside the causal ones under each corruption, with
    the table's summary; ``run`` gets the ids of the facts left out."""
    by_rule = {
        rule: {
            m: np.array([_onset(row, test.study.onset_frac, rule) for row in rows])
            for m, rows in scored.scores.items()
        }
        for rule in ONSET_RULES
    }
    onsets = by_rule[DEFAULT_ONSET_RULE]
    traced_onsets = {
        c: {
            m: share_onsets(shares, test.study.recovery_threshold)
            for m, shares in by_method.items()
        }
        for c, by_method in test.shares.items()
    }
    depth = scored.nonmonotone_depth()
    summary, causal = _summary(
        test, scored, methods, onsets, traced_onsets, depth, test.study
    )
    rules = _rule_summary(test.probs, scored, by_rule, causal, test.study)
    run["onset_rule"] = DEFAULT_ONSET_RULE
    run["subjects_not_found"] = [
        f.id for f in prompts if isinstance(f, Fact) and not f.subject_span()
    ]
    return RestorationResult(
        corruptions=corruptions,
        methods=methods,
        layer_names=scored.layer_names,
        facts=facts,
        target_tokens=decode_tokens(tokenizer, scored.target_ids),
        trajectory=scored.trajectory,
        nonmonotone_depth=depth,
        probs=test.probs,
        scores=scored.scores,
        onsets={m: v.astype(float) for m, v in onsets.items()},
        causal_onsets=causal,
        conductance=scored.conductance,
        summary=summary,
        settings=run,
        rules=rules,
        traced_shares=test.shares,
        traced_onsets=traced_onsets,
    )


def _run_record(
    model: Module,
    settings: Settings,
    study: StudyOptions,
    scored: Scores,
    test: Restorations,
    started: float,
    learned: Optional[LayerIGLens],
) -> Dict[str, Any]:
    """The run's settings: the study's, the noise's, timings and the readout."""
    return scored.run_settings(
        model,
        settings,
        study,
        noise_scale=study.noise_scale,
        noise_std=test.noise_std,
        noise_seeds=study.noise_seeds,
        min_effect=study.min_effect,
        recovery_threshold=study.recovery_threshold,
        onset_frac=study.onset_frac,
        nonmonotone_threshold=study.nonmonotone_threshold,
        conductance_prompts=int(scored.conductance.sum()),
        conductance_steps=study.conductance_steps,
        seconds=time.perf_counter() - started,
        seconds_by_part=dict(lens=scored.seconds["lens"], **test.seconds),
        readout=_readout_record(learned),
        flow_steps=study.flow_steps,
        traced_runs=test.runs,
    )


def _learned_lens(
    parts: ModelParts, lens: LensType, settings: Settings
) -> Optional[LayerIGLens]:
    """IG-Lens under the learned readout ``lens``; None without one. Its
    readout is checked against the model before any forward."""
    if lens is None:
        return None
    return LayerIGLens.from_model(
        parts,
        settings.layers,
        max_chunk_bytes=settings.max_chunk_bytes,
        lens=lens,
    )


def _readout_record(learned: Optional[LayerIGLens]) -> Dict[str, Any]:
    """The learned readout of the run's settings: kind and checksum."""
    return readout_record(None if learned is None else learned.readout)


def traced_facts(
    prompts: Sequence[Fact],
    corruptions: Sequence[str],
    methods: List[str],
    settings: Settings,
) -> List[Fact]:
    r"""
    The facts whose subject can be found, once the arguments that only
    restoration needs are checked (the CLI calls it before the model loads).

    Raises:
        ValueError: Naming the argument: chat prompts, ``ig_lens`` not among
            ``methods``, an unknown corruption, or no fact with a subject.
    """
    if settings.chat:
        raise ValueError("settings: restoration needs raw prompts; use chat=False")
    if "ig_lens" not in methods:
        raise ValueError(f"methods: restoration needs ig_lens, got {methods!r}")
    if not corruptions or any(c not in CORRUPTIONS for c in corruptions):
        raise ValueError(
            f"corruptions: expected names from {list(CORRUPTIONS)}, got {corruptions!r}"
        )
    facts = [f for f in prompts if isinstance(f, Fact) and f.subject_span()]
    if not facts:
        raise ValueError("prompts: expected facts whose subject can be found")
    return facts


def _summary(
    test: Restorations,
    scored: Scores,
    methods: List[str],
    onsets: Dict[str, np.ndarray],
    traced_onsets: Dict[str, Dict[str, np.ndarray]],
    depth: np.ndarray,
    study: StudyOptions,
) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """Per corruption, the onset agreement of each method (traced ones by their
    shares under it) with the causal onsets, over the groups of tokens the
    corruption affects; and those causal onsets."""
    monotone = depth <= study.nonmonotone_threshold
    summary, causal = {}, {}
    for c, columns in test.probs.items():
        recovery, effective = _recovery(columns), _effective(columns, study)
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
        if scored.conductance.any():
            groups["conductance_subset"] = effective & scored.conductance
        onset = {**onsets, **traced_onsets[c]}
        score = {**scored.scores}
        score.update({m: share_gains(v) for m, v in test.shares[c].items()})
        summary[c] = {
            g: {
                m: onset_agreement(
                    np.where(members, onset[m], np.nan),
                    causal[c],
                    gain_spearman(score[m], recovery, members),
                    study.n_bootstrap,
                    study.seed,
                )
                for m in methods
            }
            for g, members in groups.items()
        }
    return summary, causal


def _rule_summary(
    probs: Dict[str, np.ndarray],
    scored: Scores,
    by_rule: Dict[str, Dict[str, np.ndarray]],
    causal: Dict[str, np.ndarray],
    study: StudyOptions,
) -> Dict[str, Any]:
    """Per corruption and onset rule, every method's onset agreement with the
    causal onsets over the tokens the corruption affects (those with a causal
    onset)."""
    out: Dict[str, Any] = {}
    for c, columns in probs.items():
        recovery, members = _recovery(columns), _effective(columns, study)
        gains = {
            m: gain_spearman(scored.scores[m], recovery, members) for m in scored.scores
        }
        out[c] = {
            rule: {
                m: onset_agreement(
                    np.where(members, onsets[m], np.nan),
                    causal[c],
                    gains[m],
                    study.n_bootstrap,
                    study.seed,
                )
                for m in onsets
            }
            for rule, onsets in by_rule.items()
        }
    return out


def subject_tokens(tokenizer: Any, fact: Fact) -> Tuple[Tensor, Tensor]:
    r"""
    A fact's prompt as the study runs it, and where its subject is.

    Args:

        tokenizer (PreTrainedTokenizerBase): The model's tokenizer.
        fact (Fact): A fact with a subject.

    Returns:
        *tuple* of ``(T,)`` prompt ids (as :func:`encode_prompt` without chat)
        and a ``(T,)`` bool mask of the tokens that overlap the subject's
        characters.

    Raises:
        ValueError: If no token covers the subject.
    """
    ids = encode_prompt(tokenizer, fact.prompt, chat=False)[0]
    span = fact.subject_span()
    assert span is not None  # the study keeps facts with a subject
    where = subject_mask(tokenizer, fact.prompt, span, len(ids))
    if not where.any():
        raise ValueError(f"tokenizer: no token covers the subject of {fact.id}")
    return ids, where


def counterfactual_subjects(
    facts: Sequence[Fact], encoded: Sequence[Tensor], subjects: Sequence[Tensor]
) -> List[Optional[Tensor]]:
    r"""
    The study's counterfactual prompts: per fact, its ids with the subject
    tokens of the next fact (in order, cyclically) of the same relation whose
    subject has as many tokens, other ids and another answer.

    Args:

        facts (Sequence[Fact]): The study's facts.
        encoded (Sequence[Tensor]): Per fact, its ``(T,)`` prompt ids
                    (:func:`subject_tokens`).
        subjects (Sequence[Tensor]): Per fact, its ``(T,)`` subject mask.

    Returns:
        *list* of ``(T,)`` ids per fact, None where no fact fits.
    """
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


def _effective(columns: np.ndarray, study: StudyOptions) -> np.ndarray:
    """``(N,)``: the corruption lowered ``p`` by at least ``study.min_effect``
    of ``p_clean``."""
    clean, corrupt = columns[:, 0], columns[:, 1]
    return clean - corrupt >= study.min_effect * clean


def _recovery(columns: np.ndarray) -> np.ndarray:
    gap = columns[:, :1] - columns[:, 1:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (columns[:, 2:] - columns[:, 1:2]) / gap


def _onset(row: np.ndarray, frac: float, rule: str) -> float:
    if np.isnan(row).any():
        return np.nan
    onset = onset_index(row, frac, rule)
    return np.nan if onset < 0 else float(onset)


def gain_spearman(
    scores: np.ndarray, recovery: np.ndarray, members: np.ndarray
) -> np.ndarray:
    r"""
    Per token, the Spearman correlation of its per-block scores with its
    recovery gains (:func:`~captum_iglens.studies.validation.stats.recovery_gains`).

    Args:

        scores (np.ndarray): ``(N, k)`` scores, NaN rows where not run.
        recovery (np.ndarray): ``(N, k)`` recoveries.
        members (np.ndarray): ``(N,)`` bool: the tokens to correlate.

    Returns:
        *np.ndarray* ``(N,)``: NaN outside ``members`` and where a row is not
        finite.
    """
    out = np.full(len(scores), np.nan)
    for i in np.flatnonzero(members):
        if not np.isnan(scores[i]).any() and np.isfinite(recovery[i]).all():
            out[i] = spearman(scores[i], recovery_gains(recovery[i]))
    return out
