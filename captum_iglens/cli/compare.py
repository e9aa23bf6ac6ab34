r"""``captum-iglens compare``: IG-Lens beside the alternatives on the same
tokens and layers (see :func:`~captum_iglens.studies.compare`)."""

import argparse

from captum_iglens.cli.common import (
    HTML_HELP,
    CommandError,
    deferred,
    Job,
    check_outputs,
    load,
    model_parent,
    names,
    progress,
    prompt_parent,
    read_prompt,
    settings_from,
    settings_parent,
    write_outputs,
)


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    compare = commands.add_parser(
        name,
        parents=[prompt_parent(), settings_parent(n_steps=8), model_parent()],
        help="IG-Lens beside Captum's LayerConductance / LayerIntegratedGradients, "
        "the logit lens and DLA",
        description="IG-Lens beside the alternatives on the same tokens and layers: "
        "scores, additivity residuals, time and passes. --n-steps is also the "
        "steps of Captum's methods (their cost grows with blocks x steps x tokens).",
    )
    compare.add_argument("--methods", type=names, help=deferred(_methods_help))
    compare.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    compare.add_argument("--png", metavar="PATH", help="write the comparison plot")
    compare.add_argument("--html", metavar="PATH", help=HTML_HELP)
    compare.set_defaults(prepare=prepare)


def _methods_help() -> str:
    from captum_iglens.studies.methods.registry import COMPARED_METHODS, SOURCE_METHODS

    return (
        f"comma-separated, from {','.join(COMPARED_METHODS)} (default: all; "
        "ig_lens,dla with --granularity head), or the source-token methods "
        f"{','.join(SOURCE_METHODS)} (their rank agreement with ig_lens_sources is "
        "printed)"
    )


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the methods and outputs, loads the model and chooses four evenly
    spaced blocks where none are given; the job compares and writes."""
    from captum_iglens._result_tables import visible
    from captum_iglens.studies.comparison import (
        COMPARED_METHODS,
        METHODS,
        compare_text,
        format_head_agreement,
        format_source_agreement,
    )
    from captum_iglens.studies.comparison.compare import method_names
    from captum_iglens.studies.comparison.joint import (
        format_joint_agreement,
        has_joint_agreement,
    )
    from captum_iglens.studies.comparison.sources import has_source_agreement

    settings = settings_from(args)
    if args.methods is None:
        head = settings.granularity == "head"
        args.methods = ("ig_lens", "dla") if head else COMPARED_METHODS
    try:
        method_names(args.methods)
    except ValueError as error:
        raise CommandError(f"--{error}") from None
    # IG-Lens's source credits split each block: they need consecutive blocks.
    whole = any(METHODS[m].granularity is not None for m in args.methods)
    if (
        whole
        and settings.layers is not None
        and list(settings.layers)
        != list(range(min(settings.layers), max(settings.layers) + 1))
    ):
        raise CommandError(
            f"--layers: ig_lens_sources needs consecutive blocks, got "
            f"{','.join(map(str, settings.layers))} (leave --layers out for all)"
        )
    check_outputs(args, "json", "png", "html")
    prompt = read_prompt(args)
    parts, tokenizer = load(args, settings)
    if settings.layers is None and settings.granularity != "head" and not whole:
        n_blocks = len(parts.blocks)
        spread = sorted({round(i * (n_blocks - 1) / 3) for i in range(4)})
        settings = settings.replace(layers=spread)

    def job() -> int:
        result, answer = compare_text(
            parts,
            tokenizer,
            prompt,
            methods=args.methods,
            settings=settings,
            progress=progress(args),
        )
        print(f"prompt: {visible(prompt)}")
        print(f"answer: {visible(tokenizer.decode(answer))}")
        print(result.format_table())
        if settings.granularity == "head" and {"ig_lens", "dla"} <= set(args.methods):
            print(format_head_agreement(result))
        if has_joint_agreement(result):
            print(format_joint_agreement(result))
        if has_source_agreement(result):
            print(format_source_agreement(result))
        write_outputs(result, args)
        return 0

    return job
