r"""
Does the IG-Lens onset predict where causal ablation hurts most?

If IG-Lens says block ``L`` is where token ``y`` is decided, removing block ``L``'s
update in a full forward pass should lower the model's real ``p(y)`` more than
removing blocks with lower scores. :func:`run_validation` measures that, for
IG-Lens and for the alternatives, over a prompt set: the model's greedy answer to
each prompt, its ablation drops (:mod:`~captum_iglens.studies.validation.ablation`),
every method's per-layer scores (:mod:`~captum_iglens.studies.validation.scoring`),
their agreement (:mod:`~captum_iglens.studies.validation.stats`) and bootstrap
confidence intervals, in a :class:`ValidationResult`, on the common loop of
:mod:`~captum_iglens.studies.validation.study`.
"""

import time
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.estimators import estimator
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import encode_prompt, generate, pad_token_id
from captum_iglens.settings import Settings
from captum_iglens.studies.methods.registry import SCORED_METHODS
from captum_iglens.studies.methods.runners import Work
from captum_iglens.studies.validation.ablation import ablate, mean_updates
from captum_iglens.studies.validation.facts import Fact
from captum_iglens.studies.validation.options import MODES
from captum_iglens.studies.validation.result import ValidationResult
from captum_iglens.studies.validation.stats import METRICS, agreement, summarize
from captum_iglens.studies.validation.study import (
    CausalTest,
    Scores,
    StudyOptions,
    check_arguments,
    score_prompts,
)


class Ablations(CausalTest):
    r"""
    Each prompt's greedy answer, and the drop in ``p(y)`` when each block is
    ablated (:func:`~captum_iglens.studies.validation.ablation.ablate`).

    Args:

        parts (ModelParts): The causal LM's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        encoded (list[Tensor]): Each prompt's token ids.
        mode (str): The ablation, one of :data:`MODES`.
        means (Tensor, optional): ``(k, 2, d)``, the ``"mean"`` mode's updates
                    (:func:`~captum_iglens.studies.validation.ablation.mean_updates`).
        settings (Settings): The blocks and the answers' length.
        k (int): The number of blocks.
    """

    def __init__(
        self,
        parts: ModelParts,
        tokenizer: Any,
        encoded: Sequence[Tensor],
        mode: str,
        means: Optional[Tensor],
        settings: Settings,
        k: int,
    ) -> None:
        self.parts, self.tokenizer, self.encoded = parts, tokenizer, encoded
        self.mode, self.means, self.settings = mode, means, settings
        self.desc = f"validation ({mode})"
        self.generated: List[str] = []
        self.model_prob = np.zeros(len(encoded))
        self.drops = np.zeros((len(encoded), k))

    def measure(self, rows: np.ndarray, ids: Tensor, mask: Tensor, work: Work) -> None:
        answers = generate(
            self.parts.model,
            self.tokenizer,
            [self.encoded[i] for i in rows],
            max_new_tokens=self.settings.max_new_tokens,
        )
        self.generated += [
            self.tokenizer.decode(a, skip_special_tokens=True) for a in answers
        ]
        ablation = ablate(
            self.parts,
            ids,
            mask,
            positions=[ids.shape[1] - 1],
            targets=work.targets,
            layers=self.settings.layers,
            mode=self.mode,
            means=self.means,
        )
        self.drops[rows] = ablation.drop[:, 0].numpy()
        self.model_prob[rows] = ablation.clean[:, 0].numpy()


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
    aggregated with BCa bootstrap intervals (:func:`scipy.stats.bootstrap`).

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
    settings, methods = check_arguments(
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
    ig_lens = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    encoded = [encode_prompt(tokenizer, f.prompt, chat=settings.chat)[0] for f in facts]
    pad_id = pad_token_id(tokenizer)
    means = (
        mean_updates(parts, encoded, layers=settings.layers, pad_id=pad_id)
        if mode == "mean"
        else None
    )
    test = Ablations(
        parts, tokenizer, encoded, mode, means, settings, len(ig_lens.layer_names)
    )
    scored = score_prompts(
        parts, ig_lens, encoded, pad_id, methods, settings, study, test, progress
    )
    run = scored.run_settings(
        model,
        settings,
        study,
        chat=settings.chat,
        conductance_prompts=int(scored.conductance.sum()),
        conductance_steps=study.conductance_steps,
        nonmonotone_threshold=study.nonmonotone_threshold,
        onset_frac=study.onset_frac,
        max_new_tokens=settings.max_new_tokens,
        notes=_notes(methods, settings, scored, study),
        max_gap_lens_vs_ablation_clean_prob=float(
            np.abs(scored.trajectory[:, -1] - test.model_prob).max()
        ),
        conductance_seconds=scored.seconds["conductance"],
        seconds=time.perf_counter() - started,
    )
    return _result(tokenizer, facts, mode, methods, study, scored, test, run)


def _result(
    tokenizer: Any,
    facts: List[Fact],
    mode: str,
    methods: List[str],
    study: StudyOptions,
    scored: Scores,
    test: Ablations,
    run: Dict[str, Any],
) -> ValidationResult:
    """The result: every method's agreement with the drops, with and without the
    first two blocks, summarised over the groups of tokens."""
    drops, scores = test.drops, scored.scores
    correct = [f.is_answered_by(g) for f, g in zip(facts, test.generated)]
    depth = scored.nonmonotone_depth()
    groups = {
        "all": np.ones(len(facts), bool),
        "correct": np.array([c is True for c in correct]),
        "non_monotone": depth > study.nonmonotone_threshold,
    }
    if scored.conductance.any():
        groups["conductance_subset"] = scored.conductance
    values = _agreement(scores, drops, study.onset_frac)
    # Removing block 0 or 1 breaks nearly everything; the same agreement without
    # them shows whether the scores order the later blocks.
    late = {m: rows[:, 2:] for m, rows in scores.items()}
    late_values = (
        _agreement(late, drops[:, 2:], study.onset_frac) if drops.shape[1] > 3 else {}
    )
    computed = {m: ~np.isnan(scores[m]).all(1) for m in methods}
    return ValidationResult(
        mode=mode,
        methods=methods,
        layer_names=scored.layer_names,
        facts=facts,
        generated=test.generated,
        correct=correct,
        target_tokens=decode_tokens(tokenizer, scored.target_ids),
        model_prob=test.model_prob,
        drops=drops,
        trajectory=scored.trajectory,
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
    methods: List[str], settings: Settings, scored: Scores, study: StudyOptions
) -> List[str]:
    notes = [
        "drop = p(y) − p(y | block ablated), the model's real probability; the "
        "ablation peak is the block with the largest drop.",
        "onset: the earliest block where the cumulative |score| reaches "
        f"{study.onset_frac} of the total (IG-Lens's rule, applied to every "
        "method); ties in an argmax are broken at random, in expectation.",
    ]
    exact_h0 = settings.baselines is None and estimator(settings.estimator).exact
    if "logit_lens_diff" in methods and "ig_lens" in methods and exact_h0:
        notes.append("logit_lens_diff equals ig_lens by construction (baseline h_0).")
    if scored.conductance.any():
        notes.append(
            f"layer_conductance on a random subset of {int(scored.conductance.sum())} "
            f"prompts, {study.conductance_steps} steps (max |convergence delta| per "
            f"token, median {np.median(scored.conductance_delta):.2e}); compare "
            "within [conductance_subset]."
        )
    return notes
