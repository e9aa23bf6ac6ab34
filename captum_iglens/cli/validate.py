r"""``captum-iglens validate``: does each per-layer score predict where ablating
a block (``--test ablation``) or restoring one (``--test restoration``) matters
most? (see :mod:`captum_iglens.studies.validation`)."""

import argparse
from typing import TYPE_CHECKING, List

from captum_iglens.cli.common import (
    HTML_HELP,
    CommandError,
    deferred,
    Job,
    Names,
    check_outputs,
    lens_folder,
    lens_of_model,
    load,
    model_parent,
    names,
    progress,
    settings_from,
    settings_parent,
    write_outputs,
)

if TYPE_CHECKING:  # imported when the command runs, after the checks
    from captum_iglens.settings import Settings
    from captum_iglens.studies.validation import StudyOptions
    from captum_iglens.studies.validation.facts import Fact

#: What each test does, for the errors that refuse settings it cannot use.
_WHAT = {
    "ablation": "the validation study ablates whole blocks",
    "restoration": "restoration restores whole blocks' outputs",
}
#: The ``--max-new-tokens`` of validate (ablation generates to check answers).
_MAX_NEW_TOKENS = 8


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    validate = commands.add_parser(
        name,
        parents=[
            settings_parent(chat=False, max_new_tokens=_MAX_NEW_TOKENS),
            model_parent(),
        ],
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
    validate.add_argument(
        "--mode",
        choices=Names("captum_iglens.studies.validation.options", "MODES"),
        metavar="MODE",
        help="how --test ablation removes a block: %(choices)s (default: skip; "
        "not used by restoration)",
    )
    validate.add_argument(
        "--methods",
        type=names,
        help=deferred(_methods_help),
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
    validate.add_argument(
        "--lens",
        metavar="logit|linear|DIR",
        help=deferred(_lens_help),
    )
    validate.add_argument(
        "--noise-seeds",
        type=int,
        help=deferred(_seeds_help),
    )
    validate.add_argument("--json", metavar="PATH", help="write the study as JSON")
    validate.add_argument("--png", metavar="PATH", help="write the plots as PNG")
    validate.add_argument("--html", metavar="PATH", help=HTML_HELP)
    validate.set_defaults(prepare=prepare)


def _scored() -> "tuple[str, ...]":
    from captum_iglens.studies.methods.registry import SCORED_METHODS

    return SCORED_METHODS


def _methods_help() -> str:
    from captum_iglens.studies.methods.registry import TRACED_METHODS
    from captum_iglens.studies.validation.options import StudyOptions

    return (
        f"comma-separated, from {','.join(_scored())} (default: all of them); "
        f"restoration also runs {','.join(TRACED_METHODS)} (the probability "
        "flow from each corrupted start of each fact, "
        f"{StudyOptions().flow_steps} steps a flow)"
    )


def _known(args: argparse.Namespace) -> "tuple[str, ...]":
    r"""The methods ``--methods`` may name for this ``--test`` and ``--lens``."""
    from captum_iglens.studies.methods.registry import (
        LEARNED_METHODS,
        TRACED_METHODS,
    )

    restoration = args.test == "restoration"
    return (
        _scored()
        + (LEARNED_METHODS if args.lens else ())
        + (TRACED_METHODS if restoration else ())
    )


def _seeds_help() -> str:
    from captum_iglens.studies.validation.options import StudyOptions

    return f"restoration: noise draws per fact (default: {StudyOptions().noise_seeds})"


def _lens_help() -> str:
    from captum_iglens.studies.methods.registry import LEARNED_METHODS

    return (
        "restoration: logit (default), linear (this model's cached fitted "
        "lens, fitted first when there is none) or a fitted lens folder "
        "(captum-iglens fit-lens --out DIR); "
        f"also scores {','.join(LEARNED_METHODS)}"
    )


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the methods, limit and outputs, reads the facts and loads the
    model; the job runs the study and writes its outputs."""
    from captum_iglens.studies.methods import TRACED_METHODS
    from captum_iglens.studies.validation import (
        StudyOptions,
        load_facts,
        run_restoration,
        run_validation,
    )

    settings = settings_from(args)
    _check_lens(args)
    if args.methods is None:
        args.methods = _scored()
    known = _known(args)
    unknown = [m for m in args.methods if m not in known]
    restoration = [m for m in unknown if m in TRACED_METHODS]
    if restoration:
        raise CommandError(
            f"--methods: {','.join(restoration)} runs from the corrupted prompts "
            "of validate --test restoration only; add --test restoration or "
            "leave it out"
        )
    if unknown or not args.methods:
        raise CommandError(
            f"--methods: expected names from {','.join(known)}, got "
            f"{','.join(args.methods)}"
        )
    if args.limit is not None and args.limit < 1:
        raise CommandError(f"--limit: expected an int >= 1, got {args.limit}")
    seeds = {} if args.noise_seeds is None else {"noise_seeds": args.noise_seeds}
    study = StudyOptions(conductance_prompts=args.conductance_prompts, **seeds)
    check_outputs(args, "json", "png", "html")
    prompts = load_facts(args.prompts)[: args.limit]
    _check_test(args, settings, study, prompts)
    parts, tokenizer = load(args, settings)
    args.lens = lens_of_model(args.lens, parts, tokenizer, args)

    def job() -> int:
        run = run_restoration if args.test == "restoration" else run_validation
        extra = (
            {"lens": args.lens}
            if args.test == "restoration"
            else {"mode": args.mode or "skip"}
        )
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


def _check_lens(args: argparse.Namespace) -> None:
    r"""``--lens`` and ``--noise-seeds``: restoration only; the lens folder's
    config readable (its fit to the model is checked once the model loads,
    before any forward); ``--lens logit`` is the default readout."""
    if args.test != "restoration":
        for option, set_ in (
            ("--lens", args.lens is not None),
            ("--noise-seeds", args.noise_seeds is not None),
        ):
            if set_:
                raise CommandError(
                    f"{option}: only validate --test restoration uses it; leave it out"
                )
    args.lens = lens_folder(args.lens, args.path)


def _check_test(
    args: argparse.Namespace,
    settings: "Settings",
    study: "StudyOptions",
    prompts: "List[Fact]",
) -> None:
    r"""Everything the chosen ``--test`` checks, before the model loads: the
    settings it can use, the facts it can trace, and no option it would ignore."""
    from captum_iglens.studies.validation import CORRUPTIONS
    from captum_iglens.studies.validation.restoration_study import traced_facts
    from captum_iglens.studies.validation.study import check_arguments

    ignored = [("--top-k", args.top_k != 0)]
    if args.test == "restoration":
        ignored += [
            ("--mode", args.mode is not None),
            ("--max-new-tokens", args.max_new_tokens != _MAX_NEW_TOKENS),
        ]
    given = [name for name, set_ in ignored if set_]
    if given:
        raise CommandError(
            f"{given[0]}: not used by validate --test {args.test}; leave it out"
        )
    settings, methods = check_arguments(
        settings,
        {},
        args.methods,
        study,
        _WHAT[args.test],
        learned=args.lens is not None,
        traced=args.test == "restoration",
    )
    if args.test == "restoration":
        traced_facts(prompts, CORRUPTIONS, methods, settings)
