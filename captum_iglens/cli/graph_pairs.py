r"""
``captum-iglens graph --pairs FILE --out DIR``: the graph of every row of a
pair file (:mod:`~captum_iglens.studies.pair_file`), resumably, shared across
processes under ``torchrun`` (see
:func:`~captum_iglens.studies.batch.graph_pairs`). Every option of ``graph``
applies to each row; a row's own fields replace the prompt, the start, the
target and the foil.
"""

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

from captum_iglens.cli.common import (
    CommandError,
    Job,
    _device,
    claimed_folder,
    join_processes,
    load_model_of,
    progress,
)
from captum_iglens.cli.graph_options import (
    GRAPH_OUTPUTS,
    as_options,
    check_receiver_positions,
    check_shared_options,
    flow_options,
)

if TYPE_CHECKING:  # imported when the command runs, after its options are checked
    from captum_iglens.studies.batch.graphs import GraphsPlan
    from captum_iglens.studies.pair_file import GraphPair


def prepare_pairs(args: argparse.Namespace) -> Job:
    r"""Checks the options, every row of the pair file and the folder (a
    rerun's options and rows against its record) before torch; joins the
    process group (under torchrun), takes the folder's lock (rank 0), loads
    the model and plans every row (each checked against the tokenizer), with
    the folder's record checked again against the model's weights; the job
    writes the graphs not written yet."""
    from captum_iglens._utils.output_paths import check_apart, check_folder
    from captum_iglens.studies.pair_file import pair_arguments, read_pairs

    _check_pair_options(args)
    options = flow_options(args)
    try:
        pairs = read_pairs(args.pairs)
        for pair in pairs:
            pair_arguments(pair, options, kind_name="--target-kind")
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(f"--pairs: {error}") from None
    out = check_folder(args.out, "--out")
    inputs = {"--pairs": args.pairs, "--model": args.model}
    check_apart(out, "--out", {k: v for k, v in inputs.items() if v is not None})
    check_receiver_positions(args, [pair.prompt for pair in pairs])
    _device(args.device or "cpu")  # imports torch: after the checks that need none
    return _load(args, pairs, options, out)


def _check_pair_options(args: argparse.Namespace) -> None:
    """The options that the pair-file form refuses or needs."""
    if args.out is None:
        raise CommandError("--pairs: needs --out DIR, the folder of the graphs")
    if args.prompt is not None or args.stdin:
        raise CommandError(
            "--pairs: the prompts are the file's rows; give no prompt argument "
            "or --stdin"
        )
    for name in GRAPH_OUTPUTS:
        if getattr(args, name) is not None:
            option = "--" + name.replace("_", "-")
            raise CommandError(
                f"{option}: writes one graph; with --pairs every row's graph is "
                "written to --out as JSON"
            )
    check_shared_options(args)


def _load(
    args: argparse.Namespace,
    pairs: List["GraphPair"],
    options: Dict[str, Any],
    out: Path,
) -> Job:
    """The rest of :func:`prepare_pairs`, from the folder's record on."""
    from captum_iglens.studies.distributed import rank_and_world
    from captum_iglens.studies.batch.graphs import (
        check_graph_run,
        plan_graphs,
        run_graphs,
    )

    try:
        check_graph_run(out, pairs, args.keep, **options)
    except ValueError as error:
        raise CommandError(_named(str(error))) from None
    join_processes(args)

    def load() -> "GraphsPlan":
        model, tokenizer = load_model_of(args)
        try:
            return plan_graphs(model, tokenizer, pairs, out, keep=args.keep, **options)
        except ValueError as error:
            raise CommandError(_named(str(error))) from None

    lock, plan = claimed_folder(out, load)

    def job() -> int:
        try:
            folder = run_graphs(plan, progress=progress(args))
        except ValueError as error:  # the folder or the processes changed since
            raise CommandError(_named(str(error))) from None
        finally:
            lock.release()
        if rank_and_world()[0] == 0:
            print(f"graphs: {folder}{os.sep} ({len(pairs)} rows)")
        return 0

    return job


def _named(message: str) -> str:
    """A refusal of the study as the command line names it: the folder as
    ``--out``, a row as ``--pairs`` with its file and line, an argument of the
    flow as its option (a row's field keeps its name)."""
    from captum_iglens.studies.pair_file import PAIR_FIELDS

    if message.startswith("out_dir: "):
        return "--out: " + message.removeprefix("out_dir: ")
    where, sep, rest = message.partition(": ")
    if where.isidentifier():  # no row: an option's own refusal
        return as_options(message)
    if rest.partition(": ")[0] not in PAIR_FIELDS:
        message = where + sep + as_options(rest)
    return f"--pairs: {message}"
