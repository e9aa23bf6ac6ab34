r"""
The ``captum-iglens`` command: attribute a model's answer to a prompt across layers.

    captum-iglens "What is the capital of Vietnam?"
    captum-iglens compare "What is the capital of Vietnam?"
    captum-iglens batch PROMPTS.jsonl --out DIR
    captum-iglens validate
    captum-iglens fit-lens --model gemma3 --out DIR
    captum-iglens shell

Every subcommand is prepared before any expensive work: its arguments are turned
into :class:`~captum_iglens.Settings`, its input and output paths are checked,
the model is loaded and the settings are checked against it. An error there is an
input error: one line on stderr and exit status 2. Errors after that are internal
and keep their traceback, but for a ``CommandError`` of what only the job can
see (no pair of a task left once the model has read them).

Each subcommand lives in its own module (:mod:`~captum_iglens.cli.attribute`,
:mod:`~captum_iglens.cli.compare`, :mod:`~captum_iglens.cli.batch`,
:mod:`~captum_iglens.cli.validate`), which adds its parser and prepares its job;
what they share is in :mod:`~captum_iglens.cli.common`.
"""

import argparse
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

from captum_iglens._utils.allocator import return_freed_memory
from captum_iglens.cli import (
    attribute,
    batch,
    circuits,
    compare,
    fit_lens,
    graph,
    shell,
    validate,
)
from captum_iglens.cli.common import (
    INPUT_ERRORS,
    CommandError,
    Parser,
    model_parent,
    settings_parent,
)
from captum_iglens.version import __version__

#: The worked examples at the end of ``captum-iglens --help``.
EXAMPLES = """\
examples:
  captum-iglens "What is the capital of Vietnam?"
      the embedded SmolLM2-135M-Instruct answers; a row per answer token, a
      column per block, each cell the probability that block adds to the token
  captum-iglens "What is the capital of France?" --granularity head --top-k 5 \\
      --html out.html
      each block's attention credit split across its heads, what each layer
      predicts (top 5), and the interactive viewer in out.html
  captum-iglens shell --model gemma3
      load Gemma 3 270M once, then type prompts; ':set granularity sublayer'
      changes an option, ':html out.html' writes the last map's viewer"""

#: The subcommands, in the order of the help, and what adds each to the parser.
_COMMANDS: Dict[str, Callable[[Any, str], None]] = {
    "attribute": attribute.add_parser,
    "compare": compare.add_parser,
    "graph": graph.add_parser,
    "batch": batch.add_parser,
    "validate": validate.add_parser,
    "fit-lens": fit_lens.add_parser,
    "shell": shell.add_parser,
    "circuits": circuits.add_parser,
}


def build_parser() -> Parser:
    r"""The ``captum-iglens`` parser: one subparser per subcommand, each added by
    its own module, sharing the model, settings and prompt options through the
    parent parsers of :mod:`captum_iglens.cli.common`."""
    parser = Parser(
        prog="captum-iglens",
        description="At which layer is the probability of each answer token "
        "produced?\nIG-Lens credits, which add up exactly to the change in "
        "probability.\nWithout a subcommand, `attribute` is run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"captum-iglens {__version__}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add_parser in _COMMANDS.items():
        add_parser(commands, name)
        commands.choices[name].set_defaults(parser=commands.choices[name])
    return parser


def _with_subcommand(argv: List[str]) -> List[str]:
    """``argv`` with the subcommand first: ``attribute`` when none is named, and
    options given before the subcommand (``--quiet compare ...``) moved after it."""
    if argv[:1] in (["-h"], ["--help"], ["--version"]):
        return argv
    for i, token in enumerate(argv):
        if token in _COMMANDS:
            leading = argv[:i]
            options = Parser(
                add_help=False, parents=[model_parent(), settings_parent()]
            )
            _, rest = options.parse_known_args(leading)
            if not rest:
                return [token, *leading, *argv[i + 1 :]]
            break
    return ["attribute", *argv]


def _warning_line(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
    return f"captum-iglens: warning: {message}\n"


def _refused(args: argparse.Namespace, err: Exception) -> int:
    """Prints an input error as one line on stderr; exit status 2."""
    text = str(err).strip()
    message = text.splitlines()[0] if text else type(err).__name__
    message = args.parser.in_option_names(message)
    print(f"captum-iglens: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``captum-iglens`` and ``python -m captum_iglens``."""
    warnings.formatwarning = _warning_line
    return_freed_memory()  # the CLI owns its process: bounded memory every run
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_with_subcommand(argv))
    try:
        try:
            job = args.prepare(args)
        except (CommandError, *INPUT_ERRORS) as err:
            return _refused(args, err)
        try:
            return job()
        except CommandError as err:  # what only the job can see (no pair left)
            return _refused(args, err)
    except KeyboardInterrupt:
        print("captum-iglens: interrupted", file=sys.stderr)
        return 130
