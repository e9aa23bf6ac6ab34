r"""``captum-iglens graph``: the probability flow between a counterfactual (or
baseline) and the prompt, as a graph of edges that add up exactly to the
change of the target (see
:class:`~captum_iglens.attr.flow.ProbabilityFlow`)."""

import argparse
from typing import TYPE_CHECKING, Any, Callable

from captum_iglens.cli.common import (
    CommandError,
    Job,
    _device,
    _device_map,
    add_budget_options,
    at_least,
    check_outputs,
    model_parent,
    load_model_of,
    prompt_parent,
    read_prompt,
)
from captum_iglens.attr.flow.options import (
    BASELINES,
    DEFAULT_STEPS,
    FLOW_METHODS,
    MAX_STEPS,
    SCORES,
)
from captum_iglens.cli.graph_options import (
    GRAPH_OUTPUTS,
    as_options,
    check_receiver_positions,
    check_shared_options,
    flow_options,
)
from captum_iglens.graph.target import TARGETS, check_foil

if TYPE_CHECKING:  # imported when the graph is computed, after the checks
    from captum_iglens.attr.flow.graph import FlowGraph


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    graph = commands.add_parser(
        name,
        parents=[prompt_parent(), model_parent(), graph_options_parent()],
        help="probability flow: edges between embeddings, heads and MLPs that add "
        "up exactly to the change of the target",
        description="The probability flow from a counterfactual prompt of the same "
        "token length (or the prompt with its subject noised, or a baseline) to "
        "the prompt: edge credits that add up "
        "exactly to the change of the target, conserved at every node.",
    )
    _add_options(graph)
    graph.set_defaults(prepare=prepare)


def graph_options_parent() -> argparse.ArgumentParser:
    r"""The options of the graph that ``shell`` takes too, for its ``:graph``:
    the target's kind and the receivers (``--foil`` is the main job's there)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--target-kind",
        choices=TARGETS,
        default="prob",
        help="p(y), p(y) - p(foil) or logit(y) - logit(foil) (default: prob)",
    )
    parent.add_argument(
        "--qkv",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="queries, keys and values as separate receivers (a0.h1<q>, ...)",
    )
    return parent


def graph_args(**values: Any) -> argparse.Namespace:
    r"""
    ``graph``'s options at their defaults, with ``values`` in their place: the
    options of a graph computed without ``graph``'s command line (``shell``'s
    ``:graph``), checked by :func:`check_options` as the command's are.

    Args:

        **values (Any): Options by their destination, e.g. ``prompt="..."``,
                    ``counterfactual="..."``, ``qkv=True``.

    Returns:
        *argparse.Namespace*.
    """
    parser = argparse.ArgumentParser(
        add_help=False,
        parents=[prompt_parent(), model_parent(), graph_options_parent()],
    )
    _add_options(parser)
    args = parser.parse_args([])
    unknown = set(values) - set(vars(args))
    if unknown:
        raise TypeError(f"graph_args: not options of graph: {sorted(unknown)}")
    return argparse.Namespace(**{**vars(args), **values})


def _add_options(graph: argparse.ArgumentParser) -> None:
    """``graph``'s own options, beyond the prompt, the model and
    :func:`graph_options_parent`."""
    _add_start(graph)
    graph.add_argument(
        "--target",
        metavar="TEXT",
        help="the target token (one token; default: the model's prediction)",
    )
    graph.add_argument(
        "--foil",
        metavar="TEXT",
        help="the foil token of the "
        "differences (default: the counterfactual's prediction)",
    )
    graph.add_argument(
        "--position",
        type=int,
        default=-1,
        help="the position whose logits are read (default: -1)",
    )
    graph.add_argument(
        "--n-steps",
        type=at_least(1),
        default=DEFAULT_STEPS,
        help=f"steps of the path, at most {MAX_STEPS} (default: {DEFAULT_STEPS})",
    )
    graph.add_argument(
        "--method",
        choices=FLOW_METHODS,
        default="exact",
        help="the exact estimator, or the plain first-order terms (default: exact)",
    )
    graph.add_argument(
        "--per-position",
        action="store_true",
        help="keep each edge's flow per sender position (in --json)",
    )
    graph.add_argument(
        "--receiver-positions",
        action="store_true",
        help="also split each edge by its receiver's position, u@s -> w@t (in "
        "--json, and the largest printed); for short prompts",
    )
    add_budget_options(
        graph,
        "path points per forward",
        "memory budget of one forward's path points and of a step's terms (one "
        "point may exceed it)",
    )
    _add_outputs(graph)
    _add_pairs(graph)


def _add_pairs(graph: argparse.ArgumentParser) -> None:
    """The options of the pair-file form (:mod:`~captum_iglens.cli.graph_pairs`)."""
    graph.add_argument(
        "--pairs",
        metavar="FILE",
        help="a graph for every row of this JSON Lines file of {id, prompt, "
        "counterfactual | corrupt_subject, target, foil} (a row's fields replace "
        "the options; every other option applies to each row), in place of the "
        "prompt; resumable, and shared across processes under torchrun",
    )
    graph.add_argument(
        "--out",
        metavar="DIR",
        help="with --pairs: the folder of the graphs, OUT/graphs/<id>.json, and "
        "of the run's record OUT/run.json (a rerun resumes it, with the same "
        "options, rows and model only)",
    )


def _add_start(graph: argparse.ArgumentParser) -> None:
    """The options that choose the path's start."""
    graph.add_argument(
        "--counterfactual",
        metavar="TEXT",
        help="the path's start: a prompt of the same token length (refused otherwise)",
    )
    graph.add_argument(
        "--corrupt-subject",
        metavar="TEXT",
        help="the path's start: the prompt with ROME's noise (the restoration "
        "study's) on the tokens of this text's last occurrence in the prompt",
    )
    graph.add_argument(
        "--noise-seed",
        type=at_least(0),
        default=0,
        help="the seed of --corrupt-subject's noise (default: 0)",
    )
    graph.add_argument(
        "--baseline",
        choices=BASELINES,
        help="the path's start without a "
        "counterfactual: the pad token's or the mean embedding (default: mean)",
    )


def _add_outputs(graph: argparse.ArgumentParser) -> None:
    """The options that choose what is printed and written."""
    graph.add_argument(
        "--keep",
        type=_share,
        metavar="SHARE",
        help="write only the smallest edge set carrying this share of |flow| (0, 1]",
    )
    graph.add_argument(
        "--top", type=at_least(1), default=20, help="edges printed (default: 20)"
    )
    graph.add_argument("--json", metavar="PATH", help="write the graph as JSON")
    graph.add_argument("--csv", metavar="PATH", help="write the edge table as CSV")
    graph.add_argument(
        "--pairs-csv",
        metavar="PATH",
        help="write the flows by sender and receiver position as CSV (with "
        "--receiver-positions)",
    )
    graph.add_argument(
        "--eap-json",
        metavar="PATH",
        help="write the graph as EAP-IG's graph file, which MIB's circuit "
        "evaluation reads: flows as scores, --keep's edges (or all) in the "
        "graph (with --qkv)",
    )
    graph.add_argument(
        "--eap-score",
        choices=SCORES,
        default="flow",
        help="what --eap-json scores each edge by: its flow (what it carried of "
        "Δm; the default) or its own effect (the sender's whole change times the "
        "receiver's mean gradient, what patching the edge alone changes to first "
        "order)",
    )
    graph.add_argument(
        "--html",
        metavar="PATH",
        help="write the viewer's graph page, one self-contained HTML file",
    )


def check_options(args: argparse.Namespace) -> str:
    r"""Every option of ``graph`` that can be checked without the model; the
    prompt, stripped. A bad option raises :class:`CommandError`."""
    prompt = read_prompt(args)
    for name in ("pairs", "out"):
        if getattr(args, name) is not None:
            raise CommandError(f"--{name}: give --pairs FILE and --out DIR together")
    check_shared_options(args)
    subject = args.corrupt_subject
    if subject is not None and subject not in prompt:
        raise CommandError(
            f"--corrupt-subject: {subject!r} is not in the prompt {prompt!r}"
        )
    names = dict(kind="--target-kind", foil="--foil", counterfactual="--counterfactual")
    try:
        check_foil(
            args.target_kind, args.foil is not None, bool(args.counterfactual), names
        )
    except ValueError as error:
        raise CommandError(str(error)) from None
    if args.pairs_csv and not args.receiver_positions:
        raise CommandError("--pairs-csv: needs --receiver-positions")
    if args.eap_json and not args.qkv:
        raise CommandError(
            "--eap-json: EAP-IG's graph has separate query, key and value "
            "receivers; add --qkv"
        )
    check_outputs(args, *GRAPH_OUTPUTS)
    check_receiver_positions(args, [prompt])
    _device(args.device or "cpu")  # imports torch: after the checks that need none
    _device_map(args)
    return prompt


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks every option, loads the model; the job computes the graph,
    prints its largest edges and writes the outputs (with ``--pairs``, every
    row's graph: :func:`~captum_iglens.cli.graph_pairs.prepare_pairs`)."""
    if args.pairs is not None:
        from captum_iglens.cli.graph_pairs import prepare_pairs

        return prepare_pairs(args)
    prompt = check_options(args)  # before torch: input errors answer at once
    model, tokenizer = load_model_of(args)
    compute = plan_graph(model, tokenizer, prompt, args)

    def job() -> int:
        graph = compute()
        kept = graph if args.keep is None else graph.prune(args.keep)
        if args.json:
            kept.save(args.json)
        if args.csv:
            kept.to_csv(args.csv)
        if args.pairs_csv:
            kept.to_csv(args.pairs_csv, pairs=True)
        if args.eap_json:
            kept.to_eap_json(args.eap_json, score=args.eap_score)
        if args.html:
            kept.to_html(args.html)
        return 0

    return job


def plan_graph(
    model: Any, tokenizer: Any, prompt: str, args: argparse.Namespace
) -> Callable[[], "FlowGraph"]:
    r"""
    The graph of ``graph``'s options on a loaded model, planned: every argument
    is checked against the model and the budget now (a bad one raises
    :class:`CommandError`, named as its option), and the function returned
    computes the graph and prints its ``--top`` largest edges.

    Args:

        model (nn.Module or ModelParts): The model.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompt (str): The prompt, from :func:`check_options`.
        args (argparse.Namespace): ``graph``'s options, checked by
                    :func:`check_options`.

    Returns:
        *Callable[[], FlowGraph]*: The graph's computation.
    """
    from captum_iglens.attr.flow import ProbabilityFlow

    flow = ProbabilityFlow(model, tokenizer)
    try:
        plan = flow.plan(prompt, **flow_options(args))
    except (ValueError, TypeError) as error:
        raise CommandError(as_options(str(error))) from None

    def compute() -> "FlowGraph":
        graph = flow.run(plan)
        print(graph.format_table(args.top))
        return graph

    return compute
