r"""
Does the IG-Lens onset predict where causal ablation hurts most?

If IG-Lens says block ``L`` is where token ``y`` is decided, removing block ``L``'s
update in a full forward pass should lower the model's real ``p(y)`` more than
removing blocks with lower scores. This module measures that, for IG-Lens and for
the alternatives, over a prompt set:

- :func:`captum_iglens.ablation.ablate` measures the drop in ``p(y)`` when one
  block's update is removed.
- :func:`run_validation`: the study: the model's greedy answer to each prompt,
  its ablation drops, every method's per-layer scores, their agreement
  (:mod:`captum_iglens._utils.stats`) and bootstrap confidence intervals, in a
  :class:`ValidationResult`.
- :func:`load_prompts`: the shipped prompt set of short factual completions.
"""

import json
import textwrap
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.nn import Module
from tqdm import tqdm

from captum_iglens._utils.stats import (
    METRICS,
    agreement,
    bootstrap_mean,
    nonmonotone_depth,
    summarize,
)
from captum_iglens.ablation import (
    MODES,
    ablate,
    chosen_blocks,
    mean_updates,
)
from captum_iglens.comparison import compare
from captum_iglens.hf import encode_prompt, left_pad, stop_token_ids

#: Methods compared with the ablation, in the order of the table.
METHODS: Tuple[str, ...] = (
    "ig_lens",
    "ig_lens_abs",
    "logit_lens",
    "logit_lens_diff",
    "dla",
    "layer_conductance",
    "random",
)
_PUNCTUATION = ".,;:!?\"'()[]«»“”‘’"


@dataclass(frozen=True)
class Fact:
    r"""
    One prompt of the validation set: a raw-text completion whose next word is the
    answer, e.g. ``"The capital of France is"`` → ``"Paris"``.

    Attributes:

        id (str): A unique name, e.g. ``"capital-01"``.
        relation (str): The kind of fact, e.g. ``"capital"``.
        prompt (str): The text to complete.
        answer (str, optional): The expected next word(s); None if unchecked.
        aliases (tuple[str, ...]): Other accepted spellings of the answer.
    """

    id: str
    relation: str
    prompt: str
    answer: Optional[str] = None
    aliases: Tuple[str, ...] = ()

    def is_answered_by(self, text: str) -> Optional[bool]:
        r"""
        Whether a continuation starts with the answer (or an alias), word by word,
        case-insensitively, ignoring surrounding punctuation.

        Returns:
            *bool*, or None when the fact has no answer.
        """
        if self.answer is None:
            return None
        said = _words(text)
        expected = [_words(a) for a in (self.answer, *self.aliases)]
        return any(words and said[: len(words)] == words for words in expected)


def _words(text: str) -> List[str]:
    return [w.strip(_PUNCTUATION).lower() for w in text.split()]


def load_prompts(path: Optional[Union[str, Path]] = None) -> List[Fact]:
    r"""
    Read a prompt set: JSON lines with ``prompt`` and optionally ``id``,
    ``relation``, ``answer`` and ``aliases`` (a list of strings).

    Args:

        path (str or Path, optional): A ``.jsonl`` file. Default: the set shipped
                    with the package (``captum_iglens/data/facts.jsonl``).

    Returns:
        *list[Fact]*, in file order.
    """
    source = (
        resources.files("captum_iglens").joinpath("data/facts.jsonl")
        if path is None
        else Path(path)
    )
    facts = []
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}:{number}: not valid JSON ({error})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ValueError(
                f"{source}:{number}: expected an object with a 'prompt' string"
            )
        facts.append(
            Fact(
                id=str(record.get("id", number)),
                relation=str(record.get("relation", "")),
                prompt=record["prompt"],
                answer=record.get("answer"),
                aliases=tuple(record.get("aliases", ())),
            )
        )
    if not facts:
        raise ValueError(f"{source}: no prompts")
    return facts


# ----------------------------------------------------------------------- ablation


def _plain(value: Any) -> Any:
    """JSON-ready: arrays as lists, NaN as None."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def _cell(stats: Dict[str, float], signed: bool) -> str:
    if stats["n"] == 0:
        return "-"
    form = "+.3f" if signed else ".3f"
    return f"{stats['mean']:{form}} [{stats['lo']:{form}}, {stats['hi']:{form}}]"


@dataclass
class ValidationResult:
    r"""
    The agreement of per-layer scores with ablation drops over a prompt set, one
    attributed token (the first token of the model's greedy answer) per prompt,
    ``N`` prompts and ``k`` layers (see :func:`run_validation`).

    Attributes:

        mode (str): The ablation mode.
        methods (list[str]): The methods compared.
        layer_names (list[str]): The ``k`` ablated blocks.
        facts (list[Fact]): The prompts.
        generated (list[str]): The model's greedy continuation of each prompt.
        correct (list[bool or None]): Whether it starts with the answer.
        target_tokens (list[str]): The attributed token of each prompt, as text.
        model_prob (np.ndarray): ``(N,)``: the model's probability of it.
        drops (np.ndarray): ``(N, k)``: the ablation drops ``p − p_ablated``.
        trajectory (np.ndarray): ``(N, k + 1)``: the logit-lens levels
                    ``f(h_0), f(h_{L_1}), ..., p`` of the token.
        nonmonotone_depth (np.ndarray): ``(N,)``: how far the trajectory rises
                    and then falls
                    (:func:`~captum_iglens._utils.stats.nonmonotone_depth`).
        scores (dict[str, np.ndarray]): ``(N, k)`` per method, NaN rows where
                    the method was not run.
        values (dict): ``values[method][metric]``: ``(N,)`` per-token agreement,
                    NaN where undefined or not run.
        groups (dict[str, np.ndarray]): ``(N,)`` booleans per group of tokens:
                    ``"all"``, ``"correct"``, ``"non_monotone"`` and, when Layer
                    Conductance ran, ``"conductance_subset"``.
        summary (dict): ``summary[group][method][metric]``: mean, 95% bootstrap
                    interval (``lo``, ``hi``), ``n`` and ``n_undefined``.
        settings (dict): How the study was run, timings and sanity checks.
    """

    mode: str
    methods: List[str]
    layer_names: List[str]
    facts: List[Fact]
    generated: List[str]
    correct: List[Optional[bool]]
    target_tokens: List[str]
    model_prob: np.ndarray
    drops: np.ndarray
    trajectory: np.ndarray
    nonmonotone_depth: np.ndarray
    scores: Dict[str, np.ndarray]
    values: Dict[str, Dict[str, np.ndarray]]
    groups: Dict[str, np.ndarray]
    summary: Dict[str, Dict[str, Dict[str, Dict[str, float]]]]
    settings: Dict[str, Any]

    def accuracy(self) -> Dict[str, float]:
        """The share of checked prompts answered correctly, with its bootstrap CI."""
        checked = np.array([np.nan if c is None else float(c) for c in self.correct])
        return bootstrap_mean(
            checked, self.settings["n_bootstrap"], self.settings["seed"]
        )

    def format_table(self, groups: Optional[Sequence[str]] = None) -> str:
        r"""
        The agreement table: one block per group of tokens, a row per method, a
        column per metric, each ``mean [95% CI]``.

        Args:

            groups (list[str], optional): Which groups. Default: every non-empty
                        group.

        Returns:
            *str*.
        """
        k = len(self.layer_names)
        acc = self.accuracy()
        threshold = self.settings["nonmonotone_threshold"]
        lines = [
            f"Per-layer scores vs causal ablation (mode={self.mode!r}, {k} blocks, "
            f"{len(self.facts)} prompts, one token each)",
            (
                f"model correct on {sum(c is True for c in self.correct)}/{acc['n']} "
                f"checked prompts: {_cell(acc, False)}"
                if acc["n"]
                else "no answers to check"
            ),
            f"non-monotone tokens (lens rises, then falls, by > {threshold}): "
            f"{int(self.groups['non_monotone'].sum())}",
        ]
        titles = {
            "spearman": "Spearman",
            "top1": "top-1 hit",
            "top3": "top-3 hit",
            "onset_distance": "|onset−peak|",
            "peak_distance": "|argmax−peak|",
        }
        names = [g for g in (groups or self.groups) if self.groups[g].any()]
        for group in names:
            lines += ["", f"[{group}] {int(self.groups[group].sum())} tokens"]
            lines.append(
                f"{'method':<20}{'n':>4}  "
                + "".join(f"{titles[m]:<26}" for m in METRICS)
            )
            for method in self.methods:
                row = self.summary[group][method]
                cells = [_cell(row[m], m == "spearman") for m in METRICS]
                lines.append(
                    f"{method:<20}{row['top1']['n']:>4}  "
                    + "".join(f"{c:<26}" for c in cells)
                )
        undefined = {
            m: self.summary["all"][m]["spearman"]["n_undefined"] for m in self.methods
        }
        peaks = np.bincount(self.drops.argmax(1), minlength=k)
        credits = np.bincount(self.scores["ig_lens"].argmax(1), minlength=k)
        lines += [
            "",
            f"chance: Spearman 0, top-1 {1 / k:.3f}, top-3 {min(3, k) / k:.3f}. "
            "Spearman undefined (constant vector), excluded: "
            + (", ".join(f"{m} {n}" for m, n in undefined.items() if n) or "none"),
            f"ablation peak layer, most frequent: {self._most_frequent(peaks)}",
            f"IG-Lens argmax layer, most frequent: {self._most_frequent(credits)}",
        ]
        lines += [f"note: {note}" for note in self.settings["notes"]]
        return "\n".join(lines)

    def _most_frequent(self, counts: np.ndarray) -> str:
        order = np.argsort(-counts, kind="stable")[:5]
        return ", ".join(
            f"L{self.layer_names[i]}×{counts[i]}" for i in order if counts[i]
        )

    def __str__(self) -> str:
        return self.format_table()

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary (per-token records, summary, settings)."""
        tokens = []
        for i, fact in enumerate(self.facts):
            tokens.append(
                dict(
                    id=fact.id,
                    relation=fact.relation,
                    prompt=fact.prompt,
                    answer=fact.answer,
                    generated=self.generated[i],
                    correct=self.correct[i],
                    token=self.target_tokens[i],
                    model_prob=float(self.model_prob[i]),
                    drops=self.drops[i],
                    trajectory=self.trajectory[i],
                    nonmonotone_depth=float(self.nonmonotone_depth[i]),
                    groups=[g for g, members in self.groups.items() if members[i]],
                    scores={
                        m: s[i]
                        for m, s in self.scores.items()
                        if not np.isnan(s[i]).all()
                    },
                    agreement={
                        m: {metric: float(v[i]) for metric, v in metrics.items()}
                        for m, metrics in self.values.items()
                        if not np.isnan(self.scores[m][i]).all()
                    },
                )
            )
        return _plain(
            dict(
                mode=self.mode,
                methods=self.methods,
                layer_names=self.layer_names,
                accuracy=self.accuracy(),
                summary=self.summary,
                settings=self.settings,
                tokens=tokens,
            )
        )

    def save(self, path: Union[str, Path]) -> None:
        """Write :meth:`to_dict` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1))

    def plot(
        self, examples: Optional[Sequence[int]] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        r"""
        Top: for a few tokens, the ablation drop and the IG-Lens credit of every
        layer (both in probability). Bottom: every method's mean Spearman
        correlation and top-1 hit rate with their 95% intervals, over all tokens
        and over the non-monotone ones. Works headless.

        Args:

            examples (list[int], optional): Indices of the tokens to show.
                        Default: three, spread over the prompt set.

        Returns:
            2-element tuple of **figure**, **axes**: a dict with ``"example 0"``,
            ..., ``"spearman"`` and ``"top1"``.
        """
        import matplotlib.pyplot as plt

        from captum_iglens.plots import DOWN_COLOR, UP_COLOR

        n = len(self.facts)
        picks = (
            sorted(set(np.linspace(0, n - 1, min(3, n)).round().astype(int).tolist()))
            if examples is None
            else list(examples)
        )
        cols = max(len(picks), 2)
        fig = plt.figure(figsize=(5.0 * cols, 8.5), layout="constrained")
        fig.set_facecolor("white")
        grid = fig.add_gridspec(2, cols)
        bottom = grid[1, :].subgridspec(1, 2)
        axes: Dict[str, Any] = {}
        layers = np.arange(len(self.layer_names))
        for col, i in enumerate(picks):
            ax = fig.add_subplot(grid[0, col])
            credit = self.scores["ig_lens"][i]
            ax.bar(
                layers,
                credit,
                color=np.where(credit >= 0, UP_COLOR, DOWN_COLOR),
                label="IG-Lens credit",
            )
            ax.plot(
                layers, self.drops[i], "k.-", linewidth=1, label=f"{self.mode} drop"
            )
            ax.axhline(0, color="grey", linewidth=0.5)
            ax.set_title(
                textwrap.fill(f"{self.facts[i].prompt} → {self.target_tokens[i]!r}", 50)
                + f"\np = {self.model_prob[i]:.3f}",
                fontsize=9,
            )
            ax.set_xlabel("block", fontsize=8)
            ax.set_ylabel("probability", fontsize=8)
            ax.legend(fontsize=7)
            axes[f"example {col}"] = ax
        groups = [g for g in ("all", "non_monotone") if self.groups[g].any()]
        x = np.arange(len(self.methods))
        for col, metric in enumerate(("spearman", "top1")):
            ax = fig.add_subplot(bottom[0, col])
            width = 0.8 / len(groups)
            for g, group in enumerate(groups):
                cells = [self.summary[group][m][metric] for m in self.methods]
                mean = np.array([c["mean"] for c in cells], dtype=float)
                err = np.abs(
                    np.array([[c["lo"], c["hi"]] for c in cells], dtype=float).T - mean
                )
                ax.bar(
                    x + (g - (len(groups) - 1) / 2) * width,
                    mean,
                    width,
                    yerr=err,
                    capsize=3,
                    label=f"{group} tokens ({int(self.groups[group].sum())})",
                )
            chance = 0.0 if metric == "spearman" else 1 / len(self.layer_names)
            ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label="chance")
            ax.set_xticks(
                x,
                [
                    f"{m.replace('_', ' ')} (n={self.summary['all'][m][metric]['n']})"
                    for m in self.methods
                ],
                rotation=30,
                ha="right",
                fontsize=8,
            )
            ax.set_title(
                f"{'Spearman ρ' if metric == 'spearman' else 'top-1 hit rate'} with "
                f"the {self.mode} drops (95% bootstrap CI)",
                fontsize=9,
            )
            ax.legend(fontsize=7)
            axes[metric] = ax
        return fig, axes


def _greedy(
    model: Module,
    tokenizer: Any,
    ids: Tensor,
    mask: Tensor,
    stops: List[int],
    pad_id: int,
    max_new_tokens: int,
) -> Tuple[Tensor, List[str]]:
    """The first greedy token ``(B, 1)`` and the greedy continuations as text."""
    with torch.inference_mode():
        continuation = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stops,
            pad_token_id=pad_id,
        )[:, ids.shape[1] :]
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in continuation]
    return continuation[:, :1], texts


def _lens_scores(
    model: Module,
    ids: Tensor,
    mask: Tensor,
    position: List[int],
    targets: Tensor,
    layers: Optional[Sequence[int]],
    methods: Sequence[str],
) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """
    ``(B, k)`` scores of IG-Lens (signed and absolute), the logit lens, and the
    lens differences and DLA when asked for, from :func:`compare`; and the lens
    trajectory ``f(h_0), f(h_{L_1}), ..., p`` ``(B, k + 1)``.
    """
    wanted = ["ig_lens", "logit_lens"]
    wanted += [m for m in ("logit_lens_diff", "dla") if m in methods]
    found = compare(
        model,
        ids,
        mask,
        positions=position,
        target=targets,
        layers=layers,
        methods=wanted,
    ).methods
    scores = {name: found[name].scores[:, 0].numpy() for name in wanted}
    scores["ig_lens_abs"] = np.abs(scores["ig_lens"])
    levels = scores["logit_lens"]
    base = levels[:, -1] - found["logit_lens"].prob_change[:, 0].numpy()
    return scores, np.concatenate([base[:, None], levels], 1)


def run_validation(
    model: Module,
    tokenizer: Any,
    prompts: Sequence[Union[Fact, str]],
    *,
    mode: str = "skip",
    methods: Sequence[str] = METHODS,
    layers: Optional[Sequence[int]] = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
    progress: bool = True,
    batch_size: int = 8,
    conductance_prompts: int = 16,
    conductance_steps: int = 8,
    nonmonotone_threshold: float = 0.1,
    onset_frac: float = 0.5,
    max_new_tokens: int = 8,
    chat: bool = False,
) -> ValidationResult:
    r"""
    Does a per-layer score predict where causal ablation hurts most?

    For each prompt, the model's greedy continuation is generated and its first
    token ``y`` (at the prompt's last position) is attributed: the drop in the
    model's real ``p(y)`` when each block is ablated
    (:func:`~captum_iglens.ablation.ablate`), beside each method's per-layer
    score of the same token, on the same blocks. Agreement per token
    (:func:`~captum_iglens._utils.stats.agreement`) is aggregated with percentile
    bootstrap intervals.

    Methods (:data:`METHODS`): ``"ig_lens"`` (signed credits) and
    ``"ig_lens_abs"`` (their magnitudes); ``"logit_lens"`` (levels ``f(h_L)``);
    ``"logit_lens_diff"``, ``"dla"`` and ``"layer_conductance"`` from
    :func:`captum_iglens.comparison.compare` (Layer Conductance on a seeded random
    subset of ``conductance_prompts`` prompts with ``conductance_steps`` steps, as
    it costs a forward and backward pass per step and block); ``"random"``
    (standard normal scores, seeded).

    With a subset of ``layers``, the segment scores (IG-Lens, lens differences,
    DLA) of block ``L_j`` cover every block after ``L_{j-1}`` up to ``L_j``, while
    the ablation removes ``L_j`` alone: use all blocks (the default) to compare
    like with like.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompts (list[Fact or str]): The prompts, e.g. :func:`load_prompts`.
        mode (str, optional): The ablation, one of :data:`MODES`; ``"mean"``
                    uses the mean updates over all ``prompts``. Default: ``"skip"``.
        methods (list[str], optional): Names from :data:`METHODS`.
                    Default: all of them.
        layers (list[int], optional): Block indices; the last block is always
                    added. Default: all blocks.
        n_bootstrap (int, optional): Bootstrap resamples. Default: 1000.
        seed (int, optional): Seed of the random baseline, the conductance subset
                    and the bootstrap. Default: 0.
        progress (bool, optional): Progress bar on stderr. Default: True.
        batch_size (int, optional): Prompts per batch. Default: 8.
        conductance_prompts (int, optional): Prompts given to Layer Conductance.
                    Default: 16.
        conductance_steps (int, optional): Its integration steps. Default: 8.
        nonmonotone_threshold (float, optional): A token is non-monotone when its
                    lens trajectory rises and then falls by more than this
                    (:func:`~captum_iglens._utils.stats.nonmonotone_depth`).
                    Default: 0.1.
        onset_frac (float, optional): The onset fraction. Default: 0.5.
        max_new_tokens (int, optional): Length of the greedy continuation used to
                    check the answer. Default: 8.
        chat (bool, optional): Wrap prompts in the chat template instead of raw
                    completion. Default: False.

    Returns:
        :class:`ValidationResult`; print it for the table.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(
            f"methods: expected names from {list(METHODS)}, got {list(methods)}"
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
    _, chosen = chosen_blocks(model, layers)
    n, k = len(facts), len(chosen)
    device = next(model.parameters()).device
    encoded = [encode_prompt(tokenizer, f.prompt, chat=chat)[0] for f in facts]
    stops = stop_token_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    means = (
        mean_updates(model, encoded, layers=layers, pad_id=pad_id)
        if mode == "mean"
        else None
    )
    rng = np.random.default_rng(seed)
    conductance = np.zeros(n, bool)
    if "layer_conductance" in methods:
        conductance[rng.choice(n, min(conductance_prompts, n), replace=False)] = True
    generated, target_ids = [], []
    model_prob, drops, trajectory = np.zeros(n), np.zeros((n, k)), np.zeros((n, k + 1))
    scores = {m: np.full((n, k), np.nan) for m in methods}
    largest_prob_gap, conductance_delta, conductance_seconds = 0.0, [], 0.0
    batches = range(0, n, batch_size)
    for start in tqdm(batches, desc=f"validation ({mode})", disable=not progress):
        rows = np.arange(start, min(n, start + batch_size))
        ids, mask = left_pad([encoded[i] for i in rows], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        position = [ids.shape[1] - 1]
        targets, texts = _greedy(
            model, tokenizer, ids, mask, stops, pad_id, max_new_tokens
        )
        generated += texts
        target_ids += targets[:, 0].tolist()
        ablation = ablate(
            model,
            ids,
            mask,
            positions=position,
            targets=targets,
            layers=layers,
            mode=mode,
            means=means,
        )
        drops[rows] = ablation.drop[:, 0].numpy()
        model_prob[rows] = ablation.clean[:, 0].numpy()
        found, trajectory[rows] = _lens_scores(
            model, ids, mask, position, targets, layers, methods
        )
        gap = np.abs(trajectory[rows, -1] - model_prob[rows]).max()
        largest_prob_gap = max(largest_prob_gap, float(gap))
        for m in methods:
            if m in found:
                scores[m][rows] = found[m]
        subset = np.flatnonzero(conductance[rows])
        if len(subset):
            clock = time.perf_counter()
            picked = torch.as_tensor(subset, device=device)
            result = compare(
                model,
                ids[picked],
                mask[picked],
                positions=position,
                target=targets[picked],
                layers=layers,
                methods=["layer_conductance"],
                n_steps=conductance_steps,
            ).methods["layer_conductance"]
            scores["layer_conductance"][rows[subset]] = result.scores[:, 0].numpy()
            conductance_delta += result.delta[:, 0].abs().amax(-1).tolist()
            conductance_seconds += time.perf_counter() - clock
    if "random" in methods:
        scores["random"] = rng.standard_normal((n, k))
    correct = [f.is_answered_by(g) for f, g in zip(facts, generated)]
    values = {m: {metric: np.full(n, np.nan) for metric in METRICS} for m in methods}
    for m in methods:
        for i in np.flatnonzero(~np.isnan(scores[m]).all(1)):
            for metric, value in agreement(scores[m][i], drops[i], onset_frac).items():
                values[m][metric][i] = value
    depth = np.array([nonmonotone_depth(t) for t in trajectory])
    groups = {
        "all": np.ones(n, bool),
        "correct": np.array([c is True for c in correct]),
        "non_monotone": depth > nonmonotone_threshold,
    }
    if conductance.any():
        groups["conductance_subset"] = conductance
    computed = {m: ~np.isnan(scores[m]).all(1) for m in methods}
    notes = [
        "drop = p(y) − p(y | block ablated), the model's real probability; the "
        "ablation peak is the block with the largest drop.",
        "onset: the earliest block where the cumulative |score| reaches "
        f"{onset_frac} of the total (IG-Lens's rule, applied to every method); "
        "ties in an argmax are broken at random, in expectation.",
    ]
    if "logit_lens_diff" in methods and "ig_lens" in methods:
        notes.append("logit_lens_diff equals ig_lens by construction (baseline h_0).")
    if conductance.any():
        notes.append(
            f"layer_conductance on a random subset of {int(conductance.sum())} "
            f"prompts, {conductance_steps} steps (max |convergence delta| per "
            f"token, median {np.median(conductance_delta):.2e}); compare within "
            "[conductance_subset]."
        )
    settings = dict(
        model=getattr(getattr(model, "config", None), "_name_or_path", "")
        or type(model).__name__,
        n_prompts=n,
        layers=chosen,
        n_bootstrap=n_bootstrap,
        seed=seed,
        chat=chat,
        conductance_prompts=int(conductance.sum()),
        conductance_steps=conductance_steps,
        nonmonotone_threshold=nonmonotone_threshold,
        onset_frac=onset_frac,
        max_new_tokens=max_new_tokens,
        notes=notes,
        max_gap_lens_vs_ablation_clean_prob=largest_prob_gap,
        conductance_seconds=conductance_seconds,
        seconds=time.perf_counter() - started,
    )
    return ValidationResult(
        mode=mode,
        methods=methods,
        layer_names=[str(i) for i in chosen],
        facts=facts,
        generated=generated,
        correct=correct,
        target_tokens=[tokenizer.decode([t]) for t in target_ids],
        model_prob=model_prob,
        drops=drops,
        trajectory=trajectory,
        nonmonotone_depth=depth,
        scores=scores,
        values=values,
        groups=groups,
        summary=summarize(values, groups, computed, n_bootstrap, seed),
        settings=settings,
    )
