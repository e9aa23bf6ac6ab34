r"""``captum-iglens fit-lens``: fit linear shortcuts per layer in closed form on
text the model samples itself (or ``--corpus FILE``), optionally KL-tune them,
report them on held-out tokens beside the logit lens, and write a tuned-lens
checkpoint folder (see :mod:`captum_iglens.lens_fit`)."""

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

from captum_iglens.cli.common import (
    CommandError,
    check_outputs,
    distinct_outputs,
    deferred,
    flag,
    Job,
    load,
    model_parent,
    progress,
    save_figure,
)

if TYPE_CHECKING:  # imported when the command runs, after the checks
    from captum_iglens.lens_fit import FitOptions


#: The fields of ``FitOptions`` set by an option each (``--eval-tokens`` sets
#: ``eval_tokens``; left out, the field keeps its default): type and help.
_FIELDS: Dict[str, Tuple[type, str]] = {
    "tokens": (int, "fitting tokens"),
    "eval_tokens": (int, "held-out tokens"),
    "length": (int, "tokens per sampled sequence / window"),
    "batch": (int, "sequences sampled or run together"),
    "seed": (int, "seed of the sampling and fine-tune"),
    "ridge": (float, "relative ridge of the closed form"),
    "kl_steps": (int, "Adam steps of a KL fine-tune"),
    "kl_lr": (float, "its learning rate"),
    "kl_batch": (int, "its tokens per step"),
    "kl_tokens": (int, "fitting tokens kept for it"),
}


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    fit = commands.add_parser(
        name,
        parents=[model_parent()],
        help="fit a linear lens per layer (closed form, optional KL fine-tune)",
        description="Fit linear shortcuts h_i -> h_L per layer by ridge least "
        "squares (streamed float64 Gram matrices; the first position left out) on "
        "text the model samples itself (seeded) or --corpus FILE; report KL and "
        "top-1 agreement on held-out tokens beside the logit lens; write a "
        "tuned-lens checkpoint folder, also cached per model checksum.",
    )
    fit.add_argument(
        "--out",
        metavar="DIR",
        help="the lens folder to write (default: only the model's lens cache)",
    )
    fit.add_argument(
        "--corpus",
        metavar="FILE",
        help="plain text, or JSON Lines of "
        'strings or {"text": ...} (default: sampled from the model)',
    )
    for field, (kind, text) in _FIELDS.items():
        fit.add_argument(flag(field), type=kind, help=deferred(_help(text, field)))
    fit.add_argument(
        "--curve",
        metavar="N,N",
        default="",
        help="also fit on the first N tokens and report each "
        "(written as DIR-tokensN with --out)",
    )
    fit.add_argument("--png", metavar="PATH", help="also write the figure here")
    fit.add_argument("--json", metavar="PATH", help="also write the report here")
    fit.set_defaults(prepare=prepare)


def _help(text: str, field: str) -> Callable[[], str]:
    def make() -> str:
        from captum_iglens.lens_fit.options import FitOptions

        return f"{text} (default: {getattr(FitOptions(), field)})"

    return make


def _options(args: argparse.Namespace) -> "FitOptions":
    from captum_iglens.lens_fit import FitOptions
    from captum_iglens.lens_fit.corpus import read_corpus

    try:
        curve = tuple(int(t) for t in args.curve.split(",") if t.strip())
    except ValueError:
        raise CommandError(
            f"--curve: expected comma-separated token counts, got {args.curve!r}"
        ) from None
    given = {f: getattr(args, f) for f in _FIELDS if getattr(args, f) is not None}
    options = FitOptions(
        **given,
        curve=curve,
        corpus=None if args.corpus is None else read_corpus(args.corpus),
    )
    try:
        options.check()
    except ValueError as err:
        name, _, rest = str(err).partition(":")
        raise CommandError(f"{flag(name)}:{rest}") from None
    return options


#: Fewer fitting tokens per hidden dimension than this leave each ``d x d``
#: shortcut mostly ridge: ``fit-lens`` warns.
_TOKENS_PER_DIMENSION = 2


def _warn_few_tokens(tokens: int, config: Any) -> None:
    d = getattr(config, "hidden_size", None)
    if isinstance(d, int) and tokens < _TOKENS_PER_DIMENSION * d:
        warnings.warn(
            f"--tokens {tokens} is below {_TOKENS_PER_DIMENSION} fitting tokens per "
            f"dimension of the hidden state ({_TOKENS_PER_DIMENSION} x {d} = "
            f"{_TOKENS_PER_DIMENSION * d}): each shortcut is then fitted mostly by "
            "its ridge; expect a weak lens",
            stacklevel=1,
        )


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the options, the corpus and the output paths, then loads the
    model; the job fits, prints the table and writes the lens folders."""
    from captum_iglens._utils.output_paths import check_folder

    options = _options(args)
    if args.out is not None:
        out = check_folder(args.out, "--out")
        if out.exists() and any(out.iterdir()) and not (out / "params.pt").exists():
            raise CommandError(
                f"--out: {out} is a folder that holds no lens; "
                "expected a new folder or a lens folder"
            )
    check_outputs(args, "png", "json")
    distinct_outputs(args, "out", "png", "json")
    from captum_iglens.settings import Settings

    parts, tokenizer = load(args, Settings(chat=False))
    _warn_few_tokens(options.tokens, parts.model.config.get_text_config())

    def job() -> int:
        from captum_iglens.lens_fit import cache_fit, fit_lens, save_fit

        fitted = fit_lens(
            parts,
            tokenizer,
            options,
            model_name=args.model or "smollm2",
            progress=progress(args),
        )
        print(fitted.report.format_table())
        if options == type(options)():  # only the default fit is the cached one
            print(f"cached: {cache_fit(fitted)}", file=sys.stderr)
        if args.out is not None:
            save_fit(Path(args.out), fitted, curve_folders=True)
            print(f"lens: {args.out}", file=sys.stderr)
        if args.png is not None:
            save_figure(fitted.report.plot()[0], args.png)
        if args.json is not None:
            fitted.report.save(args.json)
        return 0

    return job
