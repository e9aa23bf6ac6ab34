r"""The result of the validation study: per-token drops, scores and agreement,
with the summary table; checked, saved and loaded like every result."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from captum_iglens._utils.schema import (
    Array,
    Default,
    Flag,
    Integer,
    ListOf,
    MapOf,
    Maybe,
    Number,
    Record,
    Text,
    Texts,
)
from captum_iglens._utils.serialization import JsonDocument, plain
from captum_iglens.onset import ONSET_RULES
from captum_iglens.studies.validation.facts import Fact
from captum_iglens.studies.validation.page import restoration_page, validation_page
from captum_iglens.studies.validation.plot import plot_restoration, plot_validation
from captum_iglens.studies.validation.stats import (
    METRICS,
    ONSET_METRICS,
    bootstrap_mean,
)
from captum_iglens.viewer import Viewable


def _cell(stats: Dict[str, float], signed: bool) -> str:
    if stats["n"] == 0:
        return "-"
    form = "+.3f" if signed else ".3f"
    # An undefined value is NaN in memory and null in a saved file.
    mean, lo, hi = (
        float("nan") if stats[key] is None else stats[key]
        for key in ("mean", "lo", "hi")
    )
    return f"{mean:{form}} [{lo:{form}}, {hi:{form}}]"


#: The agreement statistics of one cell of a summary.
_STATS = Record(
    n=Integer(),
    n_undefined=Integer(),
    mean=Number(nullable=True),
    lo=Number(nullable=True),
    hi=Number(nullable=True),
)
#: A fact as saved (see :meth:`Fact.to_dict`).
_FACT = Record(
    id=Text(),
    relation=Text(),
    prompt=Text(),
    answer=Maybe(Text()),
    aliases=ListOf(Text()),
    subject=Maybe(Text()),
)
_GROUPS = ("all", "correct", "non_monotone", "conductance_subset")
_SUMMARY = MapOf(
    MapOf(MapOf(_STATS, keys=METRICS), keys="methods"), keys=_GROUPS, every=False
)
#: One prompt of a saved :class:`ValidationResult`, ``k`` blocks.
_TOKEN = _FACT.extended(
    generated=Text(),
    correct=Flag(nullable=True),
    token=Text(),
    model_prob=Number(),
    drops=Array("float", "k", numpy=True),
    trajectory=Array("float", "k+1", numpy=True),
    nonmonotone_depth=Number(),
    groups=ListOf(Text(_GROUPS), names="groups"),
    scores=MapOf(Array("float", "k", numpy=True), keys="methods", every=False),
    agreement=MapOf(
        MapOf(Number(nullable=True), keys=METRICS), keys="methods", every=False
    ),
)
#: What a saved :class:`ValidationResult` holds, one declaration per field (see
#: :mod:`captum_iglens._utils.schema`): ``N`` prompts, ``k`` blocks.
VALIDATION_SCHEMA = Record(
    mode=Text(),
    methods=ListOf(Text(), names="methods", nonempty=True, required=("ig_lens",)),
    layer_names=Texts("k", nonempty=True),
    tokens=ListOf(_TOKEN, "N", nonempty=True),
    # Written for readers of the file; recomputed on load.
    accuracy=Maybe(_STATS),
    summary=_SUMMARY,
    summary_without_first=Default(MapOf(_SUMMARY.value, keys=_GROUPS, every=False)),
    settings=Record(
        open=True,
        n_bootstrap=Integer(low=1),
        seed=Integer(),
        nonmonotone_threshold=Number(),
        notes=ListOf(Text()),
    ),
)


@dataclass
class ValidationResult(JsonDocument, Viewable):
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
        summary_without_first (dict): As ``summary``, with blocks 0 and 1 left
                    out of both the scores and the drops (empty with 3 blocks or
                    fewer).
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
    summary_without_first: Dict[str, Any] = field(default_factory=dict)

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
            if method not in self.scores or np.shape(self.scores[method]) != (n, k):
                raise ValueError(f"scores.{method}: expected shape {(n, k)}")
        for group, members in self.groups.items():
            if np.shape(members) != (n,):
                raise ValueError(f"groups.{group}: expected shape {(n,)}")
        for name in ("summary", "summary_without_first"):
            tables = getattr(self, name)
            if (tables or name == "summary") and set(tables) != set(self.groups):
                raise ValueError(
                    f"{name}: expected a table per group {sorted(self.groups)}, "
                    f"got {sorted(tables)}"
                )

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
        tables = [(g, self.summary, "") for g in names]
        if self.summary_without_first:
            tables.append(("all", self.summary_without_first, ", without blocks 0-1"))
        for group, summary, which in tables:
            size = int(self.groups[group].sum())
            lines += ["", f"[{group}{which}] {size} tokens"]
            lines.append(
                f"{'method':<20}{'n':>4}  "
                + "".join(f"{titles[m]:<26}" for m in METRICS)
            )
            for method in self.methods:
                row = summary[group][method]
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
                    **fact.to_dict(),
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
                summary_without_first=self.summary_without_first,
                settings=self.settings,
                tokens=tokens,
            )
        )

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ValidationResult":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`VALIDATION_SCHEMA`)."""
        found = VALIDATION_SCHEMA.load(data)
        methods, tokens = found["methods"], found["tokens"]
        n, k = len(tokens), len(found["layer_names"])
        groups = {g: np.zeros(n, bool) for g in ("all", "correct", "non_monotone")}
        scores = {m: np.full((n, k), np.nan) for m in methods}
        values: Dict[str, Dict[str, np.ndarray]] = {m: {} for m in methods}
        for i, t in enumerate(tokens):
            for g in t["groups"]:
                groups.setdefault(g, np.zeros(n, bool))[i] = True
            for m, row in t["scores"].items():
                scores[m][i] = row
            for m, metrics in t["agreement"].items():
                for metric, value in metrics.items():
                    values[m].setdefault(metric, np.full(n, np.nan))[i] = value
        return cls(
            mode=found["mode"],
            methods=methods,
            layer_names=found["layer_names"],
            facts=[Fact.from_dict(t) for t in tokens],
            generated=[t["generated"] for t in tokens],
            correct=[t["correct"] for t in tokens],
            target_tokens=[t["token"] for t in tokens],
            model_prob=np.array([t["model_prob"] for t in tokens], float),
            drops=np.array([t["drops"] for t in tokens], float).reshape(n, k),
            trajectory=np.array([t["trajectory"] for t in tokens], float).reshape(
                n, k + 1
            ),
            nonmonotone_depth=np.array([t["nonmonotone_depth"] for t in tokens], float),
            scores=scores,
            values=values,
            groups=groups,
            summary=found["summary"],
            settings=found["settings"],
            summary_without_first=found.get("summary_without_first", {}),
        )

    def plot(
        self, examples: Optional[Sequence[int]] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        r"""Examples and agreement; see
        :func:`~captum_iglens.studies.validation.plot_validation`."""
        return plot_validation(self, examples)

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this study's viewer page; see
        :func:`~captum_iglens.studies.validation.page.validation_page`."""
        return validation_page(self)


#: Column titles of the restoration table.
_ONSET_TITLES = {
    "onset_spearman": "onset Spearman",
    "mean_abs_diff": "mean |Δonset|",
    "median_abs_diff": "median |Δonset|",
    "within_1": "within ±1",
    "within_2": "within ±2",
    "mean_lateness": "mean lateness",
    "gain_spearman": "Spearman vs gains",
}


_CORRUPTIONS = ("noise", "counterfactual")
#: One method's onset agreement (files written before ``mean_lateness`` lack it).
_ONSET_ROW = MapOf(_STATS, keys=ONSET_METRICS, optional=("mean_lateness",))
#: The metrics of the table of onset rules.
_RULE_METRICS = ("within_2", "mean_abs_diff", "mean_lateness")
#: What a saved :class:`RestorationResult` holds, one declaration per field
#: (see :mod:`captum_iglens._utils.schema`): ``N`` facts, ``k`` blocks; null
#: numbers read as NaN (not traced, not run, no onset).
RESTORATION_SCHEMA = Record(
    corruptions=ListOf(Text(_CORRUPTIONS), names="corruptions", nonempty=True),
    methods=ListOf(Text(), names="methods", nonempty=True, required=("ig_lens",)),
    layer_names=Texts("k", nonempty=True),
    facts=ListOf(_FACT, "N", nonempty=True),
    target_tokens=Texts("N"),
    trajectory=Array("float", "N", "k+1", numpy=True, nullable=True),
    nonmonotone_depth=Array("float", "N", numpy=True, nullable=True),
    probs=MapOf(
        Array("float", "N", "k+2", numpy=True, nullable=True), keys="corruptions"
    ),
    # every method's but the traced ones' (checked on construction)
    scores=MapOf(
        Array("float", "N", "k", numpy=True, nullable=True),
        keys="methods",
        every=False,
    ),
    onsets=MapOf(
        Array("float", "N", numpy=True, nullable=True), keys="methods", every=False
    ),
    causal_onsets=MapOf(
        Array("float", "N", numpy=True, nullable=True), keys="corruptions"
    ),
    conductance=Array("bool", "N", numpy=True),
    summary=MapOf(
        MapOf(
            MapOf(_ONSET_ROW, keys="methods"),
            keys=("all", "monotone", "non_monotone", "conductance_subset"),
            every=False,
        ),
        keys="corruptions",
    ),
    # files written before the onset rules hold none (then {}, written back as {})
    rules=Default(
        MapOf(
            MapOf(
                MapOf(_ONSET_ROW, keys="methods", every=False),  # not the traced
                keys=tuple(ONSET_RULES),
            ),
            keys="corruptions",
            every=False,
        )
    ),
    # files written before the traced methods hold none (then {})
    traced_shares=Default(
        MapOf(
            MapOf(
                Array("float", "N", "k", numpy=True, nullable=True),
                keys="methods",
                every=False,
            ),
            keys="corruptions",
            every=False,
        )
    ),
    traced_onsets=Default(
        MapOf(
            MapOf(
                Array("float", "N", numpy=True, nullable=True),
                keys="methods",
                every=False,
            ),
            keys="corruptions",
            every=False,
        )
    ),
    settings=Record(
        open=True,
        n_bootstrap=Integer(low=1),
        recovery_threshold=Number(),
        onset_frac=Number(),
        min_effect=Number(),
        noise_scale=Number(),
        noise_std=Number(),
        noise_seeds=Integer(),
    ),
)


@dataclass
class RestorationResult(JsonDocument, Viewable):
    r"""
    The agreement of per-layer scores with restoration (causal tracing at the
    attributed position) over a set of facts, one attributed token per fact,
    ``N`` facts and ``k`` blocks (see :func:`run_restoration`).

    Attributes:

        corruptions (list[str]): The corruptions traced.
        methods (list[str]): The methods compared.
        layer_names (list[str]): The ``k`` restored blocks.
        facts (list[Fact]): The facts.
        target_tokens (list[str]): The attributed token (the model's greedy next
                    token) of each fact.
        trajectory (np.ndarray): ``(N, k + 1)`` logit-lens levels of the token.
        nonmonotone_depth (np.ndarray): ``(N,)``.
        probs (dict[str, np.ndarray]): ``(N, k + 2)`` per corruption: ``p_clean``,
                    ``p_corrupt``, then ``p`` with block ``L_j`` restored; NaN
                    rows where the corruption was not applied.
        scores (dict[str, np.ndarray]): ``(N, k)`` per method but the traced
                    ones, NaN rows where not run.
        onsets (dict[str, np.ndarray]): ``(N,)`` per method but the traced
                    ones, NaN where none.
        causal_onsets (dict[str, np.ndarray]): ``(N,)`` per corruption, NaN where
                    the corruption did not lower ``p`` enough.
        conductance (np.ndarray): ``(N,)`` bool: Layer Conductance's subset.
        summary (dict): ``summary[corruption][group][method][metric]``, as
                    :func:`~captum_iglens.studies.validation.stats.onset_agreement`,
                    of the onsets under ``settings["onset_rule"]``.
        settings (dict): How the study was run, and timings.
        rules (dict): ``rules[corruption][rule][method][metric]``: the same
                    agreement over all the tokens counted, under each onset
                    rule of :data:`~captum_iglens.onset.ONSET_RULES`; empty in
                    files written before it. Default: empty.
        traced_shares (dict): ``traced_shares[corruption][method]``: ``(N, k)``
                    per traced method
                    (:data:`~captum_iglens.studies.methods.registry.TRACED_METHODS`,
                    run from each corrupted start): the share of the clean
                    effect reached after each block, NaN rows where not
                    traced. Default: empty.
        traced_onsets (dict): ``traced_onsets[corruption][method]``: ``(N,)``,
                    the first block where that share reaches the recovery
                    threshold, NaN where none. Default: empty.
    """

    corruptions: List[str]
    methods: List[str]
    layer_names: List[str]
    facts: List[Fact]
    target_tokens: List[str]
    trajectory: np.ndarray
    nonmonotone_depth: np.ndarray
    probs: Dict[str, np.ndarray]
    scores: Dict[str, np.ndarray]
    onsets: Dict[str, np.ndarray]
    causal_onsets: Dict[str, np.ndarray]
    conductance: np.ndarray
    summary: Dict[str, Any]
    settings: Dict[str, Any]
    rules: Dict[str, Any] = field(default_factory=dict)
    traced_shares: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)
    traced_onsets: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)

    KIND = "RestorationResult"

    def __post_init__(self) -> None:
        n, k = len(self.facts), len(self.layer_names)
        if len(self.target_tokens) != n:
            raise ValueError(f"target_tokens: expected {n} entries, one per fact")
        shapes = {"trajectory": (n, k + 1), "nonmonotone_depth": (n,)}
        shapes["conductance"] = (n,)
        for c in self.corruptions:
            shapes[f"probs.{c}"] = (n, k + 2)
            shapes[f"causal_onsets.{c}"] = (n,)
        for m in self.methods:
            if m not in self.traced_methods:
                shapes[f"scores.{m}"] = (n, k)
                shapes[f"onsets.{m}"] = (n,)
            for c in self.corruptions if m in self.traced_methods else ():
                shapes[f"traced_shares.{c}.{m}"] = (n, k)
                shapes[f"traced_onsets.{c}.{m}"] = (n,)
        for name, shape in shapes.items():
            found = _shape(self, name)
            if found != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {found}")
        onsets = {f"onsets.{m}": v for m, v in self.onsets.items()}
        for tree in ("causal_onsets", "traced_onsets"):
            onsets.update(_leaves(getattr(self, tree), tree))
        for name, values in onsets.items():
            given = values[~np.isnan(values)]
            if ((given != np.round(given)) | (given < 0) | (given >= k)).any():
                raise ValueError(f"{name}: expected block indices in [0, {k}) or null")

    @property
    def traced_methods(self) -> List[str]:
        r"""The methods run from each corrupted start (those of
        ``traced_shares``), in the order of ``methods``."""
        traced = {m for by_method in self.traced_shares.values() for m in by_method}
        return [m for m in self.methods if m in traced]

    def recovery(self, corruption: str) -> np.ndarray:
        r"""``(N, k)`` recoveries ``r(L)`` under ``corruption`` (NaN where not
        traced)."""
        columns = self.probs[corruption]
        with np.errstate(divide="ignore", invalid="ignore"):
            return (columns[:, 2:] - columns[:, 1:2]) / (
                columns[:, :1] - columns[:, 1:2]
            )

    def format_table(self) -> str:
        r"""The agreement table: per corruption and group of tokens, a row per
        method, each cell ``value [95% CI]``."""
        k = len(self.layer_names)
        s = self.settings
        lines = [
            f"Per-layer scores vs restoration at the attributed position "
            f"({k} blocks, {len(self.facts)} facts with a subject, one token each)",
            f"causal onset: first block with recovery >= {s['recovery_threshold']}; "
            f"method onset: first block with {s['onset_frac']} of the cumulative "
            "|score|; tokens count when the corruption lowers p by >= "
            f"{s['min_effect']:.0%} of p_clean",
        ]
        unfound = s.get("subjects_not_found") or []
        if unfound:
            lines.append(
                f"{len(unfound)} facts left out, their subject not found in the "
                f"prompt: {', '.join(map(str, unfound))}"
            )
        for c in self.corruptions:
            columns = self.probs[c]
            traced = ~np.isnan(columns[:, 0])
            causal = self.causal_onsets[c]
            counted = ~np.isnan(causal)
            mean_recovery = (
                np.nanmean(self.recovery(c)[counted], 0) if counted.any() else []
            )
            what = (
                f"noise {s['noise_scale']}× embedding std "
                f"({s['noise_std']:.3g}), {s['noise_seeds']} seeds"
                if c == "noise"
                else "counterfactual subject of the same length and relation"
            )
            lines += [
                "",
                f"== corruption: {c} ({what}): {int(traced.sum())} traced, "
                f"{int(counted.sum())} counted",
                f"mean p_clean {np.nanmean(columns[traced, 0]):.3f}, mean p_corrupt "
                f"{np.nanmean(columns[traced, 1]):.3f}",
                "mean recovery by block: "
                + " ".join(f"{v:.2f}" for v in mean_recovery),
                "causal onset, most frequent: "
                + self._most_frequent(causal[counted].astype(int)),
                "IG-Lens onset, most frequent: "
                + self._most_frequent(
                    self.onsets["ig_lens"][
                        counted & ~np.isnan(self.onsets["ig_lens"])
                    ].astype(int)
                ),
            ]
            for group, rows in self.summary[c].items():
                size = rows["ig_lens"]["mean_abs_diff"]["n"]
                if not size:
                    continue
                lines += ["", f"[{c} / {group}] {size} tokens"]
                lines.append(
                    f"{'method':<20}{'n':>4}  "
                    + "".join(f"{_ONSET_TITLES[m]:<26}" for m in ONSET_METRICS)
                )
                for method in self.methods:
                    row = rows[method]
                    cells = [_onset_cell(row, m) for m in ONSET_METRICS]
                    lines.append(
                        f"{method:<20}{row['mean_abs_diff']['n']:>4}  "
                        + "".join(f"{cell:<26}" for cell in cells)
                    )
        lines += _rules_table(self)
        lines += [
            "",
            "gains: r(L) − r(L−1), r before block 0 = 0; 'Spearman vs gains' is the "
            "per-token rank correlation of a method's per-block scores with them, "
            "averaged over tokens. Intervals: BCa bootstrap over tokens, "
            f"{s['n_bootstrap']} resamples.",
        ]
        lines += _traced_lines(self)
        lines += _cost_lines(self)
        return "\n".join(lines)

    def _most_frequent(self, onsets: np.ndarray) -> str:
        counts = np.bincount(onsets, minlength=len(self.layer_names))
        order = np.argsort(-counts, kind="stable")[:5]
        return (
            ", ".join(f"L{self.layer_names[i]}×{counts[i]}" for i in order if counts[i])
            or "-"
        )

    def __str__(self) -> str:
        return self.format_table()

    def plot(
        self, examples: Optional[Sequence[int]] = None, corruption: Optional[str] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        r"""Recovery and IG-Lens trajectory of a few tokens; see
        :func:`~captum_iglens.studies.validation.plot_restoration`."""
        return plot_restoration(self, examples, corruption)

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this study's viewer page: recovery, IG-Lens share of the
        credit and onsets per fact; see
        :func:`~captum_iglens.studies.validation.page.restoration_page`."""
        return restoration_page(self)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary; NaN is written as null."""
        return plain(
            dict(
                corruptions=self.corruptions,
                methods=self.methods,
                layer_names=self.layer_names,
                facts=[f.to_dict() for f in self.facts],
                target_tokens=self.target_tokens,
                trajectory=_nulls(self.trajectory),
                nonmonotone_depth=_nulls(self.nonmonotone_depth),
                probs={c: _nulls(v) for c, v in self.probs.items()},
                scores={m: _nulls(v) for m, v in self.scores.items()},
                onsets={m: _nulls(v) for m, v in self.onsets.items()},
                causal_onsets={c: _nulls(v) for c, v in self.causal_onsets.items()},
                conductance=self.conductance.tolist(),
                summary=_nulls(self.summary),
                settings=self.settings,
                rules=_nulls(self.rules),
                traced_shares=_nulls(self.traced_shares),
                traced_onsets=_nulls(self.traced_onsets),
            )
        )

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "RestorationResult":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`RESTORATION_SCHEMA`)."""
        found = RESTORATION_SCHEMA.load(data)
        found["facts"] = [Fact.from_dict(f) for f in found["facts"]]
        return cls(**found)


def _onset_cell(row: Dict[str, Any], metric: str) -> str:
    """One method's ``metric`` as a table cell; ``-`` where the file lacks it."""
    if metric not in row:
        return "-"
    return _cell(row[metric], metric.endswith("spearman") or metric == "mean_lateness")


def closest_rule(rules: Dict[str, Any], method: str) -> Optional[str]:
    r"""
    The onset rule under which ``method``'s onsets fall within two blocks of
    the causal onset most often, under every corruption of ``rules`` (the
    ``rules`` of a :class:`RestorationResult`); None when no rule is the best
    under all of them (or ``method`` was not run).

    Args:

        rules (dict): ``rules[corruption][rule][method][metric]``.
        method (str): The method's name.

    Returns:
        *str* or None.
    """
    best = set()
    for by_rule in rules.values():
        shares = {
            rule: rows[method]["within_2"]["mean"]
            for rule, rows in by_rule.items()
            if method in rows and rows[method]["within_2"]["mean"] is not None
        }
        if not shares:
            return None
        top = max(shares.values())
        best.add(tuple(r for r, v in shares.items() if v == top))
    if len(best) != 1:
        return None
    (winners,) = best
    return winners[0] if len(winners) == 1 else None


def _rules_table(result: "RestorationResult") -> List[str]:
    """The table of onset rules: per corruption, a row per method, the share
    within two blocks, mean ``|Δonset|`` and mean lateness under each rule
    (with their intervals);
    then the rule closest to the causal onset for the joint path."""
    if not result.rules:
        return []
    lines: List[str] = []
    for c, by_rule in result.rules.items():
        lines += [
            "",
            f"[{c} / all] onset rules: "
            + ", ".join(_ONSET_TITLES[m] for m in _RULE_METRICS),
        ]
        lines.append(
            f"{'method':<20}{'rule':<10}"
            + "".join(f"{_ONSET_TITLES[m]:<26}" for m in _RULE_METRICS)
        )
        for method in result.methods:
            for rule, rows in by_rule.items():
                if method not in rows:  # a traced method: its onset has no rules
                    continue
                cells = [_onset_cell(rows[method], m) for m in _RULE_METRICS]
                lines.append(
                    f"{method:<20}{rule:<10}" + "".join(f"{c:<26}" for c in cells)
                )
    joint = "ig_lens_joint"
    if joint in result.methods:
        rule = closest_rule(result.rules, joint)
        kept = result.settings["onset_rule"]
        lines += [
            "",
            f"onset rule closest to the causal onset for {joint} (within ±2) on "
            "every corruption: "
            + (rule or f"none is on every corruption; the onsets above keep {kept}"),
        ]
    return lines


def _traced_lines(result: "RestorationResult") -> List[str]:
    """What a traced method's onset is, where one ran."""
    if not result.traced_methods:
        return []
    threshold = result.settings["recovery_threshold"]
    return [
        f"{', '.join(result.traced_methods)}: run from each corrupted start of "
        "each fact; onset: the first block where the share of the clean effect "
        "reached through the attributed position (pooled over the noise draws) "
        f"reaches {threshold}, as the causal onset's recovery does."
    ]


def _cost_lines(result: "RestorationResult") -> List[str]:
    """The study's cost: the IG-Lens pass with the methods run on it, each
    corruption's restoration and each traced method's runs beside it; none
    where the settings do not hold the figures (files written before the parts
    were timed)."""
    settings = result.settings
    parts = settings.get("seconds_by_part") or {}
    if not _numbers(parts, ["lens", *result.corruptions]) or not _numbers(
        settings, ["seconds"]
    ):
        return []
    restored = ", ".join(f"{c} {parts[c]:.1f} s" for c in result.corruptions)
    lines = [
        "",
        f"cost: {settings['seconds']:.1f} s; IG-Lens and the methods on "
        f"its pass {parts['lens']:.1f} s; restoration: {restored}",
    ]
    steps = settings.get("flow_steps")
    traced = settings.get("traced_runs")
    for m, by_corruption in (traced if isinstance(traced, dict) else {}).items():
        runs = by_corruption if isinstance(by_corruption, dict) else {}
        cells = [
            f"{c} {run['seconds']:.1f} s, {run['runs']} runs "
            f"({run['seconds'] / max(parts[c], 1e-9):.1f}× restoration)"
            for c, run in runs.items()
            if c in parts and _numbers(run, ["seconds", "runs"])
        ]
        lines.append(f"  {m} (n_steps={steps}): " + "; ".join(cells))
    return lines


def _numbers(record: Any, keys: List[str]) -> bool:
    """Whether ``record`` is a dict holding a number (not a bool) at each key."""
    return isinstance(record, dict) and all(
        isinstance(record.get(key), (int, float))
        and not isinstance(record.get(key), bool)
        for key in keys
    )


def _shape(result: "RestorationResult", name: str) -> Optional[Tuple[int, ...]]:
    """The shape of the array at the dotted ``name`` of ``result``, or None
    where there is none."""
    first, *keys = name.split(".")
    value = getattr(result, first)
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return None if value is None else np.shape(value)


def _leaves(tree: Dict[str, Any], at: str) -> Dict[str, np.ndarray]:
    """The arrays of a nested dict by their dotted names under ``at``."""
    out: Dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{at}.{key}"
        out.update(_leaves(value, name) if isinstance(value, dict) else {name: value})
    return out


def _nulls(value: Any) -> Any:
    """``value`` with NaN replaced by None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {key: _nulls(v) for key, v in value.items()}
    if isinstance(value, np.ndarray):
        return _nulls(value.tolist())
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    if isinstance(value, float) and np.isnan(value):
        return None
    return value
