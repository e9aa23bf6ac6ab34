r"""The result of the validation study: per-token drops, scores and agreement,
with the summary table; checked, saved and loaded like every result."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from captum_iglens._utils.serialization import JsonDocument, plain
from captum_iglens.studies.validation.facts import Fact
from captum_iglens.studies.validation.stats import METRICS, bootstrap_mean


def _cell(stats: Dict[str, float], signed: bool) -> str:
    if stats["n"] == 0:
        return "-"
    form = "+.3f" if signed else ".3f"
    return f"{stats['mean']:{form}} [{stats['lo']:{form}}, {stats['hi']:{form}}]"


@dataclass
class ValidationResult(JsonDocument):
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

    KIND = "ValidationResult"

    def __post_init__(self) -> None:
        n, k = len(self.facts), len(self.layer_names)
        for name in ("generated", "correct", "target_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: expected {n} entries, one per prompt")
        shapes = {
            "model_prob": (n,),
            "drops": (n, k),
            "trajectory": (n, k + 1),
            "nonmonotone_depth": (n,),
        }
        for name, shape in shapes.items():
            if np.shape(getattr(self, name)) != shape:
                found = np.shape(getattr(self, name))
                raise ValueError(f"{name}: expected shape {shape}, got {found}")
        for method in self.methods:
            if np.shape(self.scores.get(method)) != (n, k):
                raise ValueError(f"scores.{method}: expected shape {(n, k)}")
        for group, members in self.groups.items():
            if np.shape(members) != (n,):
                raise ValueError(f"groups.{group}: expected shape {(n,)}")

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
                    aliases=list(fact.aliases),
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
        return plain(
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

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ValidationResult":
        """Inverse of :meth:`to_dict`; every field is checked."""
        required = {"mode", "methods", "layer_names", "summary", "settings", "tokens"}
        missing = required - set(data)
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")
        methods, tokens = data["methods"], data["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, dict) for t in tokens):
            raise ValueError("tokens: expected a list of per-token objects")
        n, k = len(tokens), len(data["layer_names"])
        try:
            facts = [
                Fact(
                    id=t["id"],
                    relation=t["relation"],
                    prompt=t["prompt"],
                    answer=t["answer"],
                    aliases=tuple(t.get("aliases", ())),
                )
                for t in tokens
            ]
            groups = {
                g: np.array([g in t["groups"] for t in tokens], dtype=bool)
                for g in dict.fromkeys(g for t in tokens for g in t["groups"])
            }
            groups.setdefault("all", np.ones(n, bool))
            groups.setdefault("correct", np.zeros(n, bool))
            groups.setdefault("non_monotone", np.zeros(n, bool))
            scores = {m: np.full((n, k), np.nan) for m in methods}
            values = {m: {} for m in methods}  # type: Dict[str, Dict[str, np.ndarray]]
            for i, t in enumerate(tokens):
                for m, row in t["scores"].items():
                    scores[m][i] = _floats(row, f"tokens[{i}].scores.{m}")
                for m, metrics in t["agreement"].items():
                    for metric, value in metrics.items():
                        column = values[m].setdefault(metric, np.full(n, np.nan))
                        column[i] = np.nan if value is None else value
            return cls(
                mode=data["mode"],
                methods=list(methods),
                layer_names=list(data["layer_names"]),
                facts=facts,
                generated=[t["generated"] for t in tokens],
                correct=[t["correct"] for t in tokens],
                target_tokens=[t["token"] for t in tokens],
                model_prob=_floats([t["model_prob"] for t in tokens], "model_prob"),
                drops=_floats([t["drops"] for t in tokens], "drops").reshape(n, k),
                trajectory=_floats(
                    [t["trajectory"] for t in tokens], "trajectory"
                ).reshape(n, k + 1),
                nonmonotone_depth=_floats(
                    [t["nonmonotone_depth"] for t in tokens], "nonmonotone_depth"
                ),
                scores=scores,
                values=values,
                groups=groups,
                summary=data["summary"],
                settings=data["settings"],
            )
        except KeyError as missing_key:
            raise ValueError(f"tokens: an entry lacks {missing_key}") from None

    def to_html(self, path: Union[str, Path]) -> None:
        r"""Writes the interactive viewer of this result, one self-contained HTML
        file (see :mod:`captum_iglens.viewer`)."""
        from captum_iglens.viewer import write_html

        write_html(self, path)

    def _repr_html_(self) -> str:
        from captum_iglens.viewer import notebook_html

        return notebook_html(self)

    def plot(
        self, examples: Optional[Sequence[int]] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        r"""Examples and agreement; see :func:`captum_iglens.plots.plot_validation`."""
        from captum_iglens.plots import plot_validation

        return plot_validation(self, examples)


def _floats(value: Any, name: str) -> np.ndarray:
    try:
        array = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers") from None
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: expected finite numbers")
    return array
