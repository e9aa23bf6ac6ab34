r"""
One task on one model, every method scored: the scorers of
:data:`~captum_iglens.studies.circuits.scorers.SCORERS` run on the filtered pairs, each
scoring's circuits evaluated by edge patching, and the curves, CPR, CMD,
intervals, rank correlations with exact patching and costs gathered in a
:class:`CircuitsResult`.

With an output folder the run resumes: ``run.json`` records what defines the
run (the task's pairs, the model's weights, the metric and every option), a
rerun with anything else is refused, and each method's record
(``methods/STEM.json`` and its scores ``methods/STEM.pt``,
:func:`~captum_iglens.studies.circuits.methods.method_stem`) is written as
soon as it is done and reused by a rerun.

Each method is scored once per run (:func:`method_scores`): an average's parts
(``mean:eap+eap-ig-inputs:5``) reuse the scores of the same methods scored or
resumed in the run, and a method listed after an average reuses its part's.

With training pairs apart from the scored ones
(:mod:`~captum_iglens.studies.circuits.split`) the run follows MIB's protocol:
every method finds its circuits on the training pairs (its edge scores, a
search's improvements, a ground truth's patching), and every circuit is
evaluated on the scored pairs, which no method sees. A search
(``search:eap-ig-inputs:5``, :mod:`~captum_iglens.studies.circuits.search`)
needs them; without them every method is scored on the pairs it is evaluated
on.
"""

import json
import pickle
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.studies.distributed import from_rank_zero, rank_and_world
from captum_iglens._utils.schema import (
    Default,
    Integer,
    Json,
    ListOf,
    MapOf,
    Maybe,
    Number,
    Record,
    Text,
)
from captum_iglens._utils.serialization import (
    JsonDocument,
    parse_json,
    plain,
    write_atomic,
)
from captum_iglens.studies.circuits.batches import make_batches
from captum_iglens.studies.circuits.faithfulness import (
    PERCENTS,
    Curve,
    circuits,
    curve,
    patched_metrics,
    ranking,
)
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.methods import (
    CURVE,
    SCORERS,
    method_key,
    parse_method,
    record_error,
    record_paths,
)
from captum_iglens.studies.circuits.split import SPLIT, check_disjoint, pairs_sha256
from captum_iglens.studies.circuits.tasks import Encoded
from captum_iglens.graph.circuit import circuit_edges, scores_from_dict, top_edges
from captum_iglens.graph.model_graph import ModelGraph

#: The record of what a folder's run is.
RUN_RECORD = "run.json"


def check_method_files(
    model: CircuitModel, tokenizer: Any, methods: Sequence[str], metric: str
) -> None:
    r"""
    Reads the file of every method that reads one and checks it against the
    model, before any forward: each such scorer is called on a context
    without pairs (:class:`~captum_iglens.studies.circuits.scorers.Scorer`).

    Args:
        model (CircuitModel): The bound model.
        tokenizer (Any): Its tokenizer.
        methods (list[str]): Method texts (:func:`parse_method`).
        metric (str): The name of ``m``.

    Raises:
        ValueError: ``--methods:`` and the scorer's message (the file and
            the field that does not match the model).
    """
    for text in methods:
        method = parse_method(text)
        if method["path"] is None:
            continue
        context = ScoringContext(model, tokenizer, [], 0, metric, path=method["path"])
        try:
            SCORERS[method["scorer"]].function(context)
        except ValueError as error:
            raise ValueError(f"--methods: {error}") from None


#: What a saved :class:`CircuitsResult` holds, one declaration per field (see
#: :mod:`captum_iglens._utils.schema`), checked when a file loads.
CIRCUITS_SCHEMA = Record(
    task=Text(nonempty=True),
    model=Text(nonempty=True),
    metric=Text(nonempty=True),
    counts=MapOf(Integer(low=0)),
    n_edges=Integer(low=1),
    percents=ListOf(Number(low=0), "K", nonempty=True),
    curves=ListOf(CURVE),
    correlations=Default(MapOf(MapOf(Number()))),
    seconds=Default(MapOf(Number(low=0))),
    best=Default(MapOf(ListOf(Text()))),
    options=Default(Json()),
    split=Maybe(SPLIT),
)


@dataclass
class CircuitsResult(JsonDocument):
    r"""
    The circuits of one task on one model.

    Attributes:

        task (str): The task's name or file.
        model (str): The model.
        metric (str): The name of ``m``.
        counts (dict[str, int]): The filter's counts (``pairs``, ``kept``,
                    ``prefers foil``, and for shipped tasks what the
                    generator dropped).
        n_edges (int): The graph's edges.
        percents (list[float]): The circuit sizes, percent of edges.
        curves (list[Curve]): One per circuit method.
        correlations (dict[str, dict[str, float]]): Per ground-truth
                    scorer that was run, Spearman's rank
                    correlation of each method's scores with its scores, as
                    its record's ``truth`` compares them
                    (:class:`~captum_iglens.studies.circuits.scorers.Scorer`).
        seconds (dict[str, float]): Wall time per stage.
        best (dict[str, list[str]]): Per method, the edges of its circuit
                    (absolute ranking) at its :func:`best_size`.
        options (dict[str, Any]): The run's options.
        split (dict[str, Any], optional): Where the methods found their
                    circuits
                    (:meth:`~captum_iglens.studies.circuits.split.Split.to_dict`:
                    the scored and training pairs' indices in the filtered
                    pairs, the sha256 of each, the seed), or None.
    """

    KIND = "captum_iglens.studies.circuits"

    task: str
    model: str
    metric: str
    counts: Dict[str, int]
    n_edges: int
    percents: List[float]
    curves: List[Curve]
    correlations: Dict[str, Dict[str, float]] = field(default_factory=dict)
    seconds: Dict[str, float] = field(default_factory=dict)
    best: Dict[str, List[str]] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)
    split: Optional[Dict[str, Any]] = None

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        return plain(asdict(self))

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "CircuitsResult":
        """The result from :meth:`to_dict`'s dict, every field checked
        (:data:`CIRCUITS_SCHEMA`)."""
        data = CIRCUITS_SCHEMA.load(data)
        for i, saved in enumerate(data["curves"]):
            if len(saved["cpr_ci"]) != 2:
                raise ValueError(f"curves[{i}]: expected intervals of 2 numbers")
        data["curves"] = [Curve(**c) for c in data["curves"]]
        for c in data["curves"]:
            c.cpr_ci, c.cmd_ci = tuple(c.cpr_ci), tuple(c.cmd_ci)
        return cls(**data)

    def plot(self) -> Tuple[Any, Any]:
        """The curves (:func:`~captum_iglens.studies.circuits.page.plot`):
        ``(fig, axes)``."""
        from captum_iglens.studies.circuits.page import plot

        return plot(self)

    def to_html(self, path: str) -> None:
        """Writes the page (:func:`~captum_iglens.studies.circuits.page.to_html`)."""
        from captum_iglens.studies.circuits.page import to_html

        to_html(self, path)

    def describe_split(self) -> str:
        """The pairs scored and, with training pairs, where every method
        found its circuits."""
        scored = f"{self.counts.get('scored', 0)} pairs scored"
        if self.split is None:
            return scored
        train, seed = self.split["train"], self.split["seed"]
        return (
            f"{scored} (the first filtered); every method found its circuits on "
            f"{len(train)} training pairs drawn by seed {seed}, none sharing a "
            f"prompt with a scored one (train sha256 "
            f"{self.split['train_sha256'][:12]}, scored "
            f"{self.split['test_sha256'][:12]})"
        )

    def format_table(self) -> str:
        """The per-method table the command prints."""
        width = max([20, *(len(c.method) + 1 for c in self.curves)])
        head = f"{'method':<{width}}" + " ".join(f"{p:>6g}%" for p in self.percents)
        lines = [self.describe_split()]
        lines += [f"f(k), {self.metric}, edges ranked by signed score:", head]
        for c in self.curves:
            lines.append(f"{c.method:<{width}}" + " ".join(f"{v:7.3f}" for v in c.f))
        lines.append("")
        lines.append(
            f"{'method':<{width - 1}} {'CPR':>7} {'95% CI':>17} {'CMD':>7} "
            f"{'95% CI':>17}  cost"
        )
        for c in self.curves:
            cost = ", ".join(f"{k} {v:.1f}s" for k, v in c.seconds.items())
            lines.append(
                f"{c.method:<{width - 1}} {c.cpr:7.3f} "
                f"[{c.cpr_ci[0]:6.3f}, {c.cpr_ci[1]:6.3f}] "
                f"{c.cmd:7.3f} [{c.cmd_ci[0]:6.3f}, {c.cmd_ci[1]:6.3f}]  {cost}"
            )
        for truth, by_method in self.correlations.items():
            for name, rho in by_method.items():
                lines.append(f"Spearman with {truth}: {name} {rho:+.3f}")
        return "\n".join(lines)


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (average ranks for ties)."""

    def ranks(x: Tensor) -> Tensor:
        order = torch.argsort(x, stable=True)
        r = torch.empty(len(x), dtype=torch.float64)
        r[order] = torch.arange(len(x), dtype=torch.float64)
        for value in torch.unique(x):  # ties share their mean rank
            tied = x == value
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def run_identity(
    pairs: Sequence[Encoded], weights: str, options: Dict[str, Any]
) -> Dict[str, Any]:
    """What defines a run: the pairs' token ids, the weights' checksum and
    the options (a folder never mixes runs)."""
    return dict(
        pairs_sha256=pairs_sha256(pairs),
        weights_checksum=weights,
        **options,
    )


def check_folder_run(
    out: Path, identity: Dict[str, Any], later: Sequence[str] = ()
) -> None:
    r"""
    Refuses a folder written by another run.

    Args:
        out (Path): The folder.
        identity (dict): :func:`run_identity`.
        later (list[str]): Fields not yet known (the split, known once the
                    pairs are filtered), checked by a later call. Default: none

    Raises:
        ValueError: Naming the first field that differs.
    """
    path = out / RUN_RECORD
    if not path.exists():
        if (out / "methods").exists():
            raise ValueError(f"--out: {out} holds method records but no {RUN_RECORD}")
        return
    recorded = parse_json(path.read_text(encoding="utf-8"), path)
    for key in sorted((set(recorded) | set(identity)) - set(later)):
        if recorded.get(key) != plain(identity.get(key)):
            raise ValueError(
                f"--out: {out} holds a run with another {key} "
                f"({recorded.get(key)!r}, this run {plain(identity.get(key))!r}); "
                "use another folder"
            )


def check_record_scores(out: Path, methods: Sequence[str], graph: ModelGraph) -> None:
    r"""
    Refuses a method's record in the resumable folder ``out`` whose scores
    are not an ``(S, R)`` tensor of ``graph``'s shape (a search's
    ``(2, S, R)``), before any forward (the
    files are checked before the model loads,
    :func:`~captum_iglens.studies.circuits.methods.check_record`).

    Raises:
        ValueError: Naming the file and to delete it.
    """
    for text in methods:
        method = parse_method(text)
        saved, path = record_paths(out, method)
        if not saved.exists():
            continue
        shape = tuple(graph.legal.shape)
        if SCORERS[method["scorer"]].searches:
            shape = (2, *shape)
        try:
            scores = torch.load(path, weights_only=True)
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as error:
            problem = f"not a torch file of scores ({str(error).splitlines()[0]})"
            raise record_error(path, problem, text) from None
        found = tuple(scores.shape) if isinstance(scores, Tensor) else None
        if found != shape:
            problem = f"expected scores of shape {shape} for this model, got {found}"
            raise record_error(path, problem, text)


#: Scores a run has computed, by
#: :func:`~captum_iglens.studies.circuits.methods.method_key`: each method's
#: ``(S, R)`` float64 scores and the seconds they took.
Scored = Dict[Tuple[str, int, Optional[str]], Tuple[Tensor, float]]


def method_scores(
    base: ScoringContext, method: Dict[str, Any], scored: Scored
) -> Tuple[Tensor, float]:
    r"""
    A method's scores, computed once per run: a method that is not an average
    is taken from ``scored`` where the run has scored it, else scored and
    added; an average's parts are found so first and given to it in
    ``context.parts``, and its seconds are its parts' and its own (what it
    costs alone, whatever the run reused). With training pairs
    (``base.train``) every method is scored there, never on the scored
    pairs, and a search starts from its method's scores there.

    Args:

        base (ScoringContext): The run's context; the method's step count,
                    file and parts replace those of ``base``.
        method (dict): :func:`parse_method`'s dict.
        scored (Scored): The run's scores so far (updated).

    Returns:
        2-element tuple of **scores** ``(S, R)`` (a search's ``(2, S, R)``)
        float64 and **seconds**.

    Raises:
        ValueError: For a search in a run without training pairs.
    """
    if base.train is not None:
        base = base.train
    elif SCORERS[method["scorer"]].searches:
        raise ValueError(
            f"--methods: {method['name']} searches on training pairs; add --train"
        )
    key = method_key(method)
    if not method["parts"] and key in scored:
        return scored[key]
    parts = [method_scores(base, part, scored) for part in method["parts"]]
    context = replace(
        base,
        steps=method["steps"],
        path=method["path"],
        parts=tuple(scores for scores, _ in parts),
    )
    start = time.perf_counter()
    found = SCORERS[method["scorer"]].function(context)
    if isinstance(found, Tensor):
        scores = found.double().cpu()
    else:
        scores = scores_from_dict(base.model.graph, found, method["name"])
    seconds = time.perf_counter() - start + sum(took for _, took in parts)
    if not method["parts"]:
        scored[key] = (scores, seconds)
    return scores, seconds


def score_method(
    base: ScoringContext, method: Dict[str, Any], n_boot: int, scored: Scored
) -> Dict[str, Any]:
    r"""
    One method's scores (:func:`method_scores`) and, unless it is ground
    truth, its curves.

    Args:

        base (ScoringContext): The run's context.
        method (dict): :func:`parse_method`'s dict (its text is its name in
                    the result).
        n_boot (int): Bootstrap resamples.
        scored (Scored): The run's scores so far (updated).

    Returns:
        *dict*: ``name``, ``curve`` (a :class:`Curve` as a dict, or None),
        ``scores`` (``(S, R)`` float64) and ``seconds``.
    """
    model, graph, n = base.model, base.model.graph, base.n_pairs
    text = method["name"]
    scores, took = method_scores(base, method, scored)
    seconds = {"score": took}
    record: Dict[str, Any] = dict(name=text, curve=None, seconds=seconds)
    if SCORERS[method["scorer"]].truth is None:
        start = time.perf_counter()
        signed, absolute = circuits(graph, scores, False), circuits(graph, scores, True)
        keeps = signed + absolute
        full, empty, m = patched_metrics(model, base.batches, keeps, base.metric, n)
        k = len(PERCENTS)
        found_curve = curve(text, signed, full, empty, m[:k], m[k:], n_boot, base.seed)
        seconds["evaluate"] = time.perf_counter() - start
        found_curve.seconds = seconds
        record["curve"] = asdict(found_curve)
    record["scores"] = scores
    return record


def run_circuits(
    model: CircuitModel,
    tokenizer: Any,
    pairs: Sequence[Encoded],
    methods: Sequence[str],
    *,
    train: Sequence[Encoded] = (),
    metric: str = "logit_diff",
    batch_size: int = 8,
    seed: int = 0,
    sample: int = 100,
    n_boot: int = 1000,
    out: Optional[Path] = None,
    identity: Optional[Dict[str, Any]] = None,
    report: Callable[[str], None] = lambda line: None,
) -> List[Dict[str, Any]]:
    r"""
    Scores every method, on the training pairs if any (else on the pairs),
    and evaluates its circuits on the pairs.

    Under ``torchrun`` (:func:`~captum_iglens.studies.distributed.init_distributed`)
    every process calls it alike: the scorers and the patched runs share the
    batches (:func:`~captum_iglens.studies.circuits.batches.batch_sum`), every
    process gets one process's records to the last bit, and rank 0 writes
    ``out`` and decides which records resume.

    Args:

        model (CircuitModel): The bound model.
        tokenizer (Any): Its tokenizer.
        pairs (list[Encoded]): The scored pairs.
        methods (list[str]): Method texts (:func:`parse_method`).
        train (list[Encoded]): Training pairs, sharing no prompt with
                    ``pairs``: every method is scored on them (MIB's
                    protocol), a search needs them. Default: none (every
                    method scored on ``pairs``)
        metric (str): The name of ``m``. Default: ``"logit_diff"``
        batch_size (int): Pairs per batch. Default: 8
        seed (int): Seed of random scores, subsamples and the bootstrap.
                    Default: 0
        sample (int): Edges exactly patched by ``patching``. Default: 100
        n_boot (int): Bootstrap resamples. Default: 1000
        out (Path, optional): The resumable folder (it must exist), with
                    ``identity`` written to its ``run.json``. Default: None
        identity (dict, optional): :func:`run_identity`. Default: None
        report (callable): Takes a progress line per method.

    Returns:
        *list[dict]*: one record per method: ``name``, ``curve`` (a
        :class:`Curve` as a dict, or None for ground truth), ``scores``
        (``(S, R)`` tensor) and ``seconds``.

    Raises:
        ValueError: If a training pair shares a prompt with a scored pair.
    """
    check_disjoint(pairs, train)
    device = next(model.model.parameters()).device
    batches = make_batches(pairs, batch_size, device)
    rank, _ = rank_and_world()  # under torchrun rank 0 writes, all score
    if out is not None and rank == 0:
        (out / "methods").mkdir(exist_ok=True)
        write_atomic(out / RUN_RECORD, json.dumps(plain(identity or {})))
    training = None
    if train:
        train_batches = make_batches(train, batch_size, device)
        training = ScoringContext(
            model,
            tokenizer,
            train_batches,
            len(train),
            metric,
            seed=seed,
            sample=sample,
        )
    base = ScoringContext(
        model,
        tokenizer,
        batches,
        len(pairs),
        metric,
        seed=seed,
        sample=sample,
        train=training,
    )
    scored: Scored = {}
    records: List[Dict[str, Any]] = []
    for text in methods:
        method = parse_method(text)
        saved = None if out is None else record_paths(out, method)
        if saved is not None and from_rank_zero(saved[0].exists):
            resumed = json.loads(saved[0].read_text(encoding="utf-8"))
            resumed["scores"] = torch.load(saved[1], weights_only=True)
            if not method["parts"]:  # an average's parts may reuse it
                scored[method_key(method)] = (
                    resumed["scores"],
                    resumed["seconds"]["score"],
                )
            records.append(resumed)
            report(f"{text}: resumed from {saved[0].parent}")
            continue
        record = score_method(base, method, n_boot, scored)
        seconds = record["seconds"]
        if saved is not None and rank == 0:
            torch.save(record["scores"], saved[1])
            kept = {k: v for k, v in record.items() if k != "scores"}
            write_atomic(saved[0], json.dumps(plain(kept)))
        records.append(record)
        report(f"{text}: " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()))
    return records


#: How near 1 the best circuit's ``f`` must be (:func:`best_size`).
BEST_WITHIN = 0.2


def best_size(f: Sequence[float]) -> float:
    r"""
    The best circuit size of a curve: the smallest ``k`` below 100% whose
    ``|1 - f(k)|`` is at most :data:`BEST_WITHIN`, else the ``k`` below 100%
    whose ``f`` is nearest 1 (at 100% the circuit is the model).

    Args:

        f (list[float]): ``f`` at :data:`PERCENTS` (NaN allowed).

    Returns:
        *float*: the size, in percent.
    """
    gaps = [abs(1 - v) if v == v else float("inf") for v in f]
    for k, gap in zip(PERCENTS[:-1], gaps):
        if gap <= BEST_WITHIN:
            return k
    return PERCENTS[gaps.index(min(gaps[:-1]))]


def gather(
    records: Sequence[Dict[str, Any]],
    model: CircuitModel,
    *,
    task: str,
    model_name: str,
    metric: str,
    counts: Dict[str, int],
    options: Dict[str, Any],
    seconds: Dict[str, float],
    split: Optional[Dict[str, Any]] = None,
) -> CircuitsResult:
    r"""The result of :func:`run_circuits`' records: curves, the rank
    correlations with exact patching (but for a search, whose rankings are
    its circuits' nesting, not edge scores), and each method's best
    circuit."""
    graph = model.graph
    curves = [Curve(**r["curve"]) for r in records if r["curve"] is not None]
    correlations: Dict[str, Dict[str, float]] = {}
    for truth in (r for r in records if r["curve"] is None):
        compared = SCORERS[parse_method(truth["name"])["scorer"]].truth
        assert compared is not None  # a record without a curve is a ground truth
        correlations[truth["name"]] = {
            r["name"]: spearman(*compared(graph, r["scores"], truth["scores"]))
            for r in records
            if r["curve"] is not None and r["scores"].dim() == 2
        }
    best: Dict[str, List[str]] = {}
    for r in records:
        if r["curve"] is None:
            continue
        k = best_size(r["curve"]["f_abs"])
        absolute = ranking(r["scores"], True)
        keep = top_edges(graph, absolute, int(k / 100 * graph.n_edges), True)
        best[r["name"]] = circuit_edges(graph, keep)
    return CircuitsResult(
        task=task,
        model=model_name,
        metric=metric,
        counts=counts,
        n_edges=graph.n_edges,
        percents=list(PERCENTS),
        curves=curves,
        correlations=correlations,
        seconds=seconds,
        best=best,
        options=options,
        split=split,
    )
