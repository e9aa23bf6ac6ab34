r"""``captum-iglens validate``: does each per-layer score predict where ablating
a block (``--test ablation``) or restoring one (``--test restoration``) matters
most? (see :mod:`captum_iglens.studies.validation`)."""

import argparse

from captum_iglens.cli.common import (
    HTML_HELP,
    CommandError,
    Job,
    check_outputs,
    load,
    model_parent,
    names,
    progress,
    settings_from,
    settings_parent,
    write_outputs,
)
from captum_iglens.studies.validation import (
    MODES,
    SCORED_METHODS,
    StudyOptions,
    load_facts,
    run_restoration,
    run_validation,
)


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    validate = commands.add_parser(
        name,
        parents=[settings_parent(chat=False, max_new_tokens=8), model_parent()],
        help="does each per-layer score predict where ablation hurts most?",
        description="Does each per-layer score predict where ablating a block "
        "lowers p(y) most? Agreement (Spearman, top-1/top-3 hits, onset distance) "
        "with bootstrap 95%% intervals, over a prompt set.",
    )
    validate.add_argument(
        "--prompts", help="JSON Lines of facts (default: the shipped prompt set)"
    )
    validate.add_argument(
        "--test",
        choices=("ablation", "restoration"),
        default="ablation",
        help="ablation: remove whole blocks; restoration: corrupt the subject and "
        "restore one block's output at the attributed position (causal tracing)",
    )
    validate.add_argument("--mode", choices=MODES, default="skip")
    validate.add_argument(
        "--methods",
        type=names,
        default=SCORED_METHODS,
        help=f"comma-separated, from {','.join(SCORED_METHODS)}",
    )
    validate.add_argument(
        "--limit", type=int, help="use only the first N prompts (a quick look)"
    )
    validate.add_argument(
        "--conductance-prompts",
        type=int,
        default=16,
        help="LayerConductance runs on this many prompts only (it is slow)",
    )
    validate.add_argument("--json", metavar="PATH", help="write the study as JSON")
    validate.add_argument("--png", metavar="PATH", help="write the plots as PNG")
    validate.add_argument("--html", metavar="PATH", help=HTML_HELP)
    validate.set_defaults(prepare=prepare)


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the methods, limit and outputs, reads the facts and loads the
    model; the job runs the study and writes its outputs."""
    settings = settings_from(args)
    unknown = [m for m in args.methods if m not in SCORED_METHODS]
    if unknown or not args.methods:
        raise CommandError(
            f"--methods: expected names from {','.join(SCORED_METHODS)}, got "
            f"{','.join(args.methods)}"
        )
    if args.limit is not None and args.limit < 1:
        raise CommandError(f"--limit: expected an int >= 1, got {args.limit}")
    study = StudyOptions(conductance_prompts=args.conductance_prompts)
    check_outputs(args, "json", "png", "html")
    prompts = load_facts(args.prompts)[: args.limit]
    parts, tokenizer = load(args, settings)

    def job() -> int:
        run = run_restoration if args.test == "restoration" else run_validation
        extra = {} if args.test == "restoration" else {"mode": args.mode}
        result = run(
            parts,
            tokenizer,
            prompts,
            methods=args.methods,
            settings=settings,
            study=study,
            progress=progress(args),
            **extra,
        )
        print(result.format_table())
        write_outputs(result, args)
        return 0

    return job
