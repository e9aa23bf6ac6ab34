r"""``captum-iglens batch``: attribute a prompt set in padded batches, resumably
(see :func:`~captum_iglens.studies.run_batch`)."""

import argparse
from typing import Any, Tuple

from captum_iglens.cli.common import (
    CommandError,
    Job,
    claimed_folder,
    join_processes,
    lens_readout,
    lens_folder,
    load,
    model_parent,
    progress,
    settings_from,
    settings_parent,
)


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    batch = commands.add_parser(
        name,
        parents=[settings_parent(), model_parent()],
        help="attribute a prompt set, resumably",
        description="Attribute a prompt set (JSON Lines with 'id', 'prompt' and "
        "optionally 'answer') in padded batches; results are written incrementally "
        "to OUT/results.jsonl and a rerun resumes where it stopped (with the same "
        "settings and model only). Under torchrun the prompts are split across "
        "processes.",
    )
    batch.add_argument("prompts", help="the prompt set, a .jsonl file")
    batch.add_argument("--out", required=True, help="output folder")
    batch.add_argument("--batch-size", type=int, default=8)
    batch.add_argument(
        "--lens",
        metavar="logit|linear|DIR",
        help="the readout of each layer, as for attribute (recorded in OUT/run.json; "
        "a rerun under another readout is refused)",
    )
    batch.add_argument(
        "--html",
        action="store_true",
        help="also write OUT/index.html, the interactive viewer of the whole set",
    )
    batch.set_defaults(prepare=prepare)


def prepare(args: argparse.Namespace) -> Job:
    r"""Reads the prompt set, checks the output folder (taking its lock, and
    checking a rerun's settings and prompt texts against what it holds), joins
    the distributed group (under torchrun), loads the model and checks it
    against the folder's; the job runs the set."""
    from captum_iglens._utils.output_paths import check_folder
    from captum_iglens.studies.batch import (
        check_model,
        check_resume,
        run_batch,
        write_html,
    )
    from captum_iglens.studies.distributed import rank_and_world
    from captum_iglens.studies.prompts import read_prompts

    settings = settings_from(args)
    if args.batch_size < 1:
        raise CommandError(f"--batch-size: expected an int >= 1, got {args.batch_size}")
    prompts = read_prompts(args.prompts)
    lens = lens_folder(args.lens, args.path)
    out = check_folder(args.out, "--out")
    join_processes(args)

    def load_checked() -> Tuple[Any, Any, Any]:
        check_resume(out, prompts, settings, args.batch_size)
        parts, tokenizer = load(args, settings)
        readout = lens_readout(lens, parts, tokenizer, args, settings)
        check_model(out, parts, readout)
        return parts, tokenizer, readout

    lock, (parts, tokenizer, readout) = claimed_folder(out, load_checked)

    def job() -> int:
        try:
            path = run_batch(
                parts,
                tokenizer,
                prompts,
                out,
                settings=settings,
                batch_size=args.batch_size,
                progress=progress(args),
                lens=readout,
            )
        finally:
            lock.release()
        if rank_and_world()[0] == 0:  # every process returns after the merge
            print(f"results: {path}")
            if args.html:
                print(f"viewer: {write_html(out)}")
        return 0

    return job
