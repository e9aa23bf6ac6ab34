r"""``captum-iglens circuits``: MIB's circuit faithfulness (CPR, CMD) of edge
scoring methods on a task, offline (see :mod:`captum_iglens.studies.circuits`)."""

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from captum_iglens.cli.common import (
    CommandError,
    Job,
    check_outputs,
    claimed_folder,
    deferred,
    join_processes,
    load,
    model_parent,
)

from captum_iglens.graph.target import TARGETS

#: The methods run when ``--methods`` is not given.
DEFAULT_METHODS = "eap,eap-ig-inputs,random"


def _task_help() -> str:
    from captum_iglens.studies.circuits.generators import GENERATORS

    return (
        "a JSON Lines file of {clean, counterfactual, answer, foil}, or a shipped "
        f"task: {', '.join(GENERATORS)}"
    )


def _methods_help() -> str:
    from captum_iglens.studies.circuits.methods import SCORERS

    forms = []
    for name, scorer in SCORERS.items():
        form = f"{name}[:STEPS, default {scorer.steps}]" if scorer.steps else name
        form = f"{name}:PATH" if scorer.reads_file else form
        form = f"{name}:A+B[+C...]" if scorer.averages else form
        form = f"{name}:METHOD" if scorer.searches else form
        truth = ", a ground truth for rank correlations" if scorer.truth else ""
        forms.append(f"{form} ({scorer.summary}{truth})")
    return (
        f"comma-separated methods: {'; '.join(forms)} (default: {DEFAULT_METHODS}); "
        "mean's parts are two or more other methods, not ground truths or files "
        "(mean:eap+eap-ig-inputs:5): each part's scores ranked by |score| over "
        "the edges, as rank / edges (ties averaged) with their sign, averaged; "
        "search's METHOD is one such method (search:eap-ig-inputs:5), scored on "
        "the --train pairs, where the search improves CPR's and CMD's circuits "
        "against their faithfulness"
    )


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    parser = commands.add_parser(
        name,
        parents=[model_parent()],
        help="score edge-attribution methods by MIB's circuit faithfulness",
        description="Score edge-attribution methods on a task of prompt pairs by "
        "MIB's circuit-localization faithfulness: keep each method's top k%% of "
        "edges, patch every other edge to its counterfactual write, and read "
        "f(k) = (m(C) - m(0)) / (m(N) - m(0)); CPR is the area under f, CMD the "
        "area under |1 - f|, with bootstrap 95%% intervals over pairs. Pairs are "
        "kept where the model prefers the answer to the foil on the clean prompt. "
        "With --out, each method's record is written when done and a rerun "
        "resumes (the same task, model and options only).",
    )
    parser.add_argument(
        "--task",
        required=True,
        metavar="FILE|NAME",
        help=deferred(_task_help),
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=deferred(_methods_help),
    )
    parser.add_argument(
        "--metric",
        choices=TARGETS,
        metavar="METRIC",
        default="logit_diff",
        help="m, one of %(choices)s: the answer's probability, minus the foil's, "
        "or the answer's logit minus the foil's (MIB's) (default: %(default)s)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=100,
        help="pairs scored, after the filter (default: %(default)s)",
    )
    parser.add_argument(
        "--train",
        type=int,
        metavar="N",
        help="draw N training pairs by --seed from the filtered pairs after the "
        "scored ones, none sharing a prompt with a scored pair: every method "
        "finds its circuits on them and is evaluated on the scored pairs, as in "
        "MIB; search: methods need them (default: none, every method scored on "
        "the scored pairs)",
    )
    parser.add_argument(
        "--generate",
        type=int,
        default=300,
        help="pairs generated for a shipped task, before the filter "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="pairs per batch (default: %(default)s)",
    )
    for option, default, text in (
        ("--seed", 0, "seed of generation, sampling and the bootstrap"),
        ("--sample", 100, "edges patched one at a time by the patching method"),
        ("--bootstrap", 1000, "bootstrap resamples"),
    ):
        parser.add_argument(
            option, type=int, default=default, help=text + " (default: %(default)s)"
        )
    parser.add_argument("--out", help="a folder for resumable per-method records")
    parser.add_argument("--json", help="write the result as JSON")
    parser.add_argument("--png", help="write the curves as a PNG")
    parser.add_argument(
        "--html", help="write a page with the table, curves and best circuits"
    )
    parser.set_defaults(prepare=prepare)


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        if value < 1:
            raise CommandError(f"--{name}: expected an int >= 1, got {value}")


def _check_options(args: argparse.Namespace) -> List[str]:
    """The methods (a method's file exists and is readable), the counts and
    the output files, checked; the methods."""
    from captum_iglens.studies.circuits.methods import (
        SCORERS,
        method_identity,
        parse_method,
    )

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise CommandError("--methods: expected at least one method")
    if len(set(methods)) != len(methods):
        raise CommandError(f"--methods: a method is named twice in {args.methods!r}")
    parsed = {method: parse_method(method) for method in methods}
    seen: Dict[Any, str] = {}
    for method, found in parsed.items():
        twin = seen.setdefault(method_identity(found), method)
        if twin != method:
            raise CommandError(
                f"--methods: {twin!r} and {method!r} are one method in "
                f"{args.methods!r}; list it once"
            )
        path = found["path"]
        if path is not None and not (Path(path).is_file() and os.access(path, os.R_OK)):
            raise CommandError(f"--methods: {method}: no readable file {path!r}")
    _positive(args, "pairs", "generate", "batch-size", "sample", "bootstrap")
    searches = [m for m, found in parsed.items() if SCORERS[found["scorer"]].searches]
    if args.train is not None:
        _positive(args, "train")
    elif searches:
        raise CommandError(
            f"--methods: {searches[0]} searches on training pairs apart from the "
            "scored ones; add --train N"
        )
    check_outputs(args, "json", "png", "html")
    return methods


@dataclass
class _Prepared:
    """What the job runs on, made by :func:`prepare`."""

    args: argparse.Namespace
    methods: List[str]
    model: Any
    tokenizer: Any
    encoded: List[Any]
    counts: Dict[str, int]
    options: Dict[str, Any]
    identity: Dict[str, Any]
    out: Optional[Path]
    stages: Dict[str, float] = field(default_factory=dict)


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the methods, the task (every line), the options, the outputs and
    a resumed folder's method records, all before torch is imported; loads the
    model, reads the methods' files (checked against its graph), tokenizes
    every pair (equal lengths and the model's context checked) and checks the
    resumed folder's run and scores, all before the model's first forward;
    the job filters the pairs and scores the methods."""
    from captum_iglens._utils.output_paths import check_folder
    from captum_iglens.studies.circuits.generators import GENERATORS
    from captum_iglens.studies.circuits.methods import check_record
    from captum_iglens.studies.circuits.tasks import read_task

    methods = _check_options(args)
    shipped = args.task in GENERATORS and not Path(args.task).exists()
    if not shipped and not Path(args.task).exists():
        raise CommandError(
            f"--task: no such file: {args.task}; expected a JSON Lines file or a "
            f"shipped task: {', '.join(GENERATORS)}"
        )
    pairs = None if shipped else read_task(args.task)
    if args.train is not None:
        available = args.generate if pairs is None else len(pairs)
        if args.pairs + args.train > available:
            where = "--generate is" if pairs is None else "the task has"
            raise CommandError(
                f"--train: {args.train} training pairs apart from --pairs "
                f"{args.pairs} need {args.pairs + args.train} pairs, and {where} "
                f"{available}; {_more_pairs(args, pairs is None)}"
            )
    out = check_folder(args.out, "--out") if args.out else None
    if out is not None:
        for method in methods:
            check_record(out, method)
    return _load(args, methods, pairs, out)


def _load(
    args: argparse.Namespace, methods: List[str], pairs: Any, out: Optional[Path]
) -> Job:
    """The rest of :func:`prepare`, from loading the model on; with ``--out``,
    under the folder's lock, taken before the load and held until the job
    ends, so two runs never write one folder."""
    join_processes(args)  # under torchrun: the pairs' batches are shared
    if out is None:
        return _loaded(args, methods, pairs, None)
    lock, job = claimed_folder(out, lambda: _loaded(args, methods, pairs, out))

    def locked() -> int:
        try:
            return job()
        finally:
            lock.release()

    return locked


def _loaded(
    args: argparse.Namespace, methods: List[str], pairs: Any, out: Optional[Path]
) -> Job:
    """The model loaded, its methods' files and pairs checked, the folder's
    run checked."""
    from captum_iglens.studies.circuits.generators import generate
    from captum_iglens.studies.circuits.patching import CircuitModel
    from captum_iglens.studies.circuits.study import (
        check_folder_run,
        check_method_files,
        check_record_scores,
        run_identity,
    )
    from captum_iglens.studies.circuits.tasks import encode_pairs
    from captum_iglens.hf.checksum import weights_checksum
    from captum_iglens.settings import Settings

    shipped = pairs is None
    start = time.perf_counter()
    parts, tokenizer = load(args, Settings())
    stages = {"load": time.perf_counter() - start}
    model = CircuitModel(parts.model)  # refuses an unsupported block here
    check_method_files(model, tokenizer, methods, args.metric)
    counts: Dict[str, int] = {}
    if pairs is None:
        generated = generate(args.task, tokenizer, n=args.generate, seed=args.seed)
        pairs = generated.pairs
        counts.update({f"dropped ({k})": v for k, v in generated.dropped.items()})
        if not pairs:
            raise CommandError(f"--task: {args.task}: {_none_left(counts)}")
    context = getattr(parts.model.config, "max_position_embeddings", None)
    encoded = encode_pairs(pairs, tokenizer, context)
    options = dict(
        task=args.task,
        metric=args.metric,
        seed=args.seed,
        sample=args.sample,
        bootstrap=args.bootstrap,
        pairs=args.pairs,
        train=args.train,
        generate=args.generate if shipped else None,
        batch_size=args.batch_size,
        model=args.model or "smollm2",
        dtype=args.dtype,
    )
    if args.train is not None:  # a folder whose run trained searches alone lacks it
        options["circuits_found_on"] = "train"
    identity = run_identity(encoded, weights_checksum(parts.model), options)
    if out is not None:
        check_folder_run(out, identity, later=("split",))
        check_record_scores(out, methods, model.graph)
    prepared = _Prepared(
        args, methods, model, tokenizer, encoded, counts, options, identity, out, stages
    )
    return lambda: _run(prepared)


def _more_pairs(args: argparse.Namespace, shipped: bool) -> str:
    """How to get more pairs: generate more, or add to the task file."""
    if shipped:
        return f"raise --generate (now {args.generate}) or lower --pairs or --train"
    return "add pairs to the task file, or lower --pairs or --train"


def _split(job: "_Prepared", kept: List[Any]) -> Tuple[List[Any], List[Any], Any]:
    """The scored pairs, the training pairs and the split's record (None
    without ``--train``), the folder's run checked against the split."""
    from captum_iglens.studies.circuits.split import TooFewPairs, draw_split
    from captum_iglens.studies.circuits.study import check_folder_run

    args = job.args
    if args.train is None:
        return kept[: args.pairs], [], None
    try:
        split, test, train = draw_split(kept, args.pairs, args.train, args.seed)
    except TooFewPairs as error:
        shipped = job.options["generate"] is not None
        raise CommandError(f"--train: {error}; {_more_pairs(args, shipped)}") from None
    job.identity["split"] = split.to_dict()
    if job.out is not None:
        try:
            check_folder_run(job.out, job.identity)
        except ValueError as error:
            raise CommandError(str(error)) from None
    return test, train, split.to_dict()


def _none_left(counts: Dict[str, int]) -> str:
    """Why no pair is left to score, from the counts of those dropped
    (``"dropped (unequal lengths)"``) and filtered (``"prefers foil"``)."""
    why = {
        k.removeprefix("dropped (").removesuffix(")"): v
        for k, v in counts.items()
        if v and k.startswith("dropped (")
    }
    if counts.get("prefers foil"):
        why["the model prefers the foil on the clean prompt"] = counts["prefers foil"]
    total = counts.get("pairs", 0) + sum(
        v for k, v in counts.items() if k.startswith("dropped (")
    )
    reasons = ", ".join(f"{v} {reason}" for reason, v in why.items())
    return f"0 of {total} pairs left to score ({reasons}); use another task or model"


def _run(job: _Prepared) -> int:
    """Filters the pairs, scores every method, prints the table and writes
    the outputs."""
    from captum_iglens.studies.distributed import rank_and_world
    from captum_iglens.studies.circuits.batches import filter_pairs
    from captum_iglens.studies.circuits.study import gather, run_circuits
    from captum_iglens.cli.common import save_figure

    args, stages = job.args, job.stages
    lead = rank_and_world()[0] == 0  # under torchrun rank 0 prints and writes
    say = print if lead else _silent
    start = time.perf_counter()
    model = job.model
    kept, filtered = filter_pairs(model.model, job.encoded, args.batch_size)
    job.counts.update(filtered)
    stages["filter"] = time.perf_counter() - start
    if not kept:
        raise CommandError(f"--task: {args.task}: {_none_left(job.counts)}")
    if len(kept) < args.pairs:
        say(
            f"captum-iglens: warning: {len(kept)} pairs kept, "
            f"fewer than --pairs {args.pairs}",
            file=sys.stderr,
        )
    kept, train, split = _split(job, kept)
    job.counts["scored"] = len(kept)
    if train:
        job.counts["train"] = len(train)
    say(f"task {args.task}: " + ", ".join(f"{k} {v}" for k, v in job.counts.items()))
    say(f"graph: {model.graph.n_edges} edges; scoring {len(kept)} pairs", flush=True)
    start = time.perf_counter()
    records = run_circuits(
        model,
        job.tokenizer,
        kept,
        job.methods,
        train=train,
        metric=args.metric,
        batch_size=args.batch_size,
        seed=args.seed,
        sample=args.sample,
        n_boot=args.bootstrap,
        out=job.out,
        identity=job.identity,
        report=lambda line: say(line, file=sys.stderr, flush=True),
    )
    stages["methods"] = time.perf_counter() - start
    result = gather(
        records,
        model,
        task=args.task,
        model_name=job.options["model"],
        metric=args.metric,
        counts=job.counts,
        options=job.options,
        seconds=stages,
        split=split,
    )
    if not lead:
        return 0
    print(result.format_table())
    print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items()))
    if args.json:
        result.save(args.json)
    if args.png:
        save_figure(result.plot()[0], args.png)
    if args.html:
        result.to_html(args.html)
    return 0


def _silent(*args: Any, **kwargs: Any) -> None:
    """``print`` on a process that does not print (under torchrun, rank > 0)."""
