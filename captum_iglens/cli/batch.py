r"""``captum-iglens batch``: attribute a prompt set in padded batches, resumably
(see :func:`~captum_iglens.studies.run_batch`)."""

import argparse

from captum_iglens.cli.common import (
    CommandError,
    Job,
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
        "--html",
        action="store_true",
        help="also write OUT/index.html, the interactive viewer of the whole set",
    )
    batch.set_defaults(prepare=prepare)


def prepare(args: argparse.Namespace) -> Job:
    r"""Reads the prompt set, checks the output folder, joins the distributed
    group (under torchrun) and loads the model; the job runs the set."""
    from captum_iglens._utils.serialization import check_folder
    from captum_iglens.studies.batch import init_distributed, run_batch, write_html
    from captum_iglens.studies.prompts import read_prompts

    settings = settings_from(args)
    if args.batch_size < 1:
        raise CommandError(f"--batch-size: expected an int >= 1, got {args.batch_size}")
    prompts = read_prompts(args.prompts)
    check_folder(args.out, "--out")
    device = init_distributed()
    if device.type == "cuda":
        args.device = str(device)
    parts, tokenizer = load(args, settings)

    def job() -> int:
        path = run_batch(
            parts,
            tokenizer,
            prompts,
            args.out,
            settings=settings,
            batch_size=args.batch_size,
            progress=progress(args),
        )
        print(f"results: {path}")
        if args.html:
            print(f"viewer: {write_html(args.out)}")
        return 0

    return job
