r"""
Docs pages generated from the code at build time, so that they cannot drift:

* ``_generated/cli.md``, the command-line reference, from the argparse parsers
  of ``captum-iglens`` (:func:`captum_iglens.cli.build_parser`): per subcommand
  its usage, description and every option with its help and default;
* ``_generated/architecture_table.md``, the table of supported model types,
  from :data:`captum_iglens.hf.table.BUILT_IN` read with each type's default
  Hugging Face config; ``architectures.md`` includes it whole.
"""

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:  # the tests import this module without Sphinx
    from sphinx.application import Sphinx

#: The block-relative modules of an entry, one column each.
FIELDS = ("mid", "attn_out", "attn_norm", "parallel_mlp", "mlp_out", "experts")
SWITCHES = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse.BooleanOptionalAction,
)


def _cell(text: Any) -> str:
    r"""``text`` as one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _prose(text: Any) -> str:
    r"""Help text as one table cell, with option names as code (so that
    ``--stdin`` is not typeset as a dash)."""
    return re.sub(r"(?<![`\w-])(--[\w-]+)", r"`\1`", _cell(text))


def _code(text: Optional[str]) -> str:
    return "–" if not text else f"`{_cell(text)}`"


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if isinstance(action, SWITCHES) or action.nargs == 0:
        return ", ".join(f"`{o}`" for o in action.option_strings)
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}"
        if action.choices
        else action.dest.upper()
    )
    return ", ".join(f"`{o} {metavar}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(
        action, (argparse._HelpAction, argparse._VersionAction)
    ):
        return ""
    if isinstance(action, SWITCHES):
        return "on" if action.default else "off"
    return f"`{_cell(action.default)}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as ``--help`` prints it: made when shown (the CLI's help texts
    may be deferred), ``%(choices)s`` and ``%(default)s`` filled in."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


def _options_table(parser: argparse.ArgumentParser) -> List[str]:
    lines: List[str] = []
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._SubParsersAction)
        ]
        if not actions:
            continue
        lines += [f"**{group.title}**", "", "| option | meaning | default |"]
        lines.append("|---|---|---|")
        for action in actions:
            lines.append(
                f"| {_option(action)} | {_prose(_help(parser, action))} "
                f"| {_default(action)} |"
            )
        lines.append("")
    return lines


def cli_page() -> str:
    r"""The command-line reference page, in Markdown."""
    from captum_iglens.cli import build_parser

    parser = build_parser()
    (commands,) = [
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ]
    lines = [
        "# Command-line reference",
        "",
        "Generated from the argparse parsers of `captum-iglens` when the docs are",
        "built, so it is what `captum-iglens COMMAND --help` prints. Without a",
        "subcommand, `attribute` runs. Input errors (a bad option, a missing",
        "file, an output folder that does not exist) are one line on stderr and",
        "exit status 2, before the model is loaded.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        "```text",
        (parser.epilog or "").strip(),
        "```",
        "",
    ]
    helps = {a.dest: a.help for a in commands._get_subactions()}
    for name, sub in commands.choices.items():
        lines += [f"## `captum-iglens {name}`", "", _prose(helps.get(name, "")), ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        if sub.description:
            lines += [_prose(sub.description), ""]
        lines += _options_table(sub)
        if sub.epilog:
            lines += ["```text", sub.epilog.strip(), "```", ""]
    return "\n".join(lines)


def _entry_value(value: Any, config: Any) -> Any:
    try:
        return value(config)
    except Exception:  # a config that lacks the field: shown as unknown
        return "?"


def _post_name(post: Any) -> str:
    name = getattr(post, "__name__", "")
    if name == "no_post":
        return "–"
    return (post.__doc__ or name).strip().splitlines()[0]


def architecture_table() -> str:
    r"""The table of built-in model types, in Markdown."""
    from transformers import AutoConfig

    from captum_iglens.hf.table import BUILT_IN

    lines = [
        "| model_type | blocks | final norm (kind) | head | final transform "
        "| sub-layer state | head split (`attn_out`) | post-norm (`attn_norm`) "
        "| parallel MLP | neuron split (`mlp_out`) | experts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model_type in sorted(BUILT_IN):
        entry = BUILT_IN[model_type]
        try:
            config: Optional[Any] = AutoConfig.for_model(model_type)
        except (ValueError, KeyError):
            config = None
        cells: Dict[str, Any] = {}
        for field in FIELDS:
            value = _entry_value(getattr(entry, field), config)
            if isinstance(value, tuple):  # one per block: the distinct ones
                value = ", ".join(sorted(set(value)))
            cells[field] = value
        post = _post_name(entry.post)
        lines.append(
            f"| `{model_type}` | `{entry.layers}` "
            f"| {', '.join(f'`{n}`' for n in entry.norm)} ({entry.norm_kind}) "
            f"| {' or '.join(f'`{h}`' for h in entry.head)} | {_cell(post)} "
            + "".join(f"| {_code(cells[field])} " for field in FIELDS)
            + "|"
        )
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(app: "Sphinx") -> None:
    r"""Write the generated pages under ``_generated/``."""
    out = Path(app.srcdir) / "_generated"
    _write(out / "cli.md", cli_page())
    _write(out / "architecture_table.md", architecture_table())


def setup(app: "Sphinx") -> Dict[str, Any]:
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True}
