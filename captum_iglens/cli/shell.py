r"""``captum-iglens shell``: an interactive session. The model is loaded once;
each line typed is a prompt, answered, attributed and printed as the main job
does, and a line that starts with ``:`` changes one of the main job's options
or writes the last result:

.. code-block:: text

    iglens> What is the capital of France?
    iglens> :set granularity head
    iglens> :html out.html
    iglens> :graph What is the capital of Italy?
    iglens> :json graph.json

The session takes the main job's options (:mod:`~captum_iglens.cli.attribute`),
and ``graph``'s ``--target-kind`` and ``--qkv`` for ``:graph``
(:mod:`~captum_iglens.cli.graph`), checked as those commands check them; the
model's options are fixed when it starts. It ends on ``:quit``, end of input
(Ctrl-D) or Ctrl-C at the prompt; a Ctrl-C while a prompt or a graph is being
worked on abandons that one only.
"""

import argparse
import copy
import shlex
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Tuple

from captum_iglens.cli.attribute import (
    answer_and_attribute,
    check_options,
    companion_settings,
    options_parent,
    report,
    scored_tokens,
    write_files,
)
from captum_iglens.cli.common import (
    INPUT_ERRORS,
    CommandError,
    Job,
    Parser,
    Stages,
    check_outputs,
    lens_readout,
    load,
    model_parent,
    option_first,
    settings_parent,
)
from captum_iglens.cli.graph import (
    check_options as check_graph_options,
    graph_args,
    graph_options_parent,
    plan_graph,
)

PROMPT = "iglens> "
#: The files the last result can be written to, by command (``:html PATH``).
OUTPUTS = ("json", "csv", "png", "html")
#: The :class:`~captum_iglens.attr.flow.graph.FlowGraph` method that writes
#: each file a graph can be written to.
GRAPH_WRITERS = {"json": "save", "csv": "to_csv", "html": "to_html"}
#: The session's options that ``:graph`` passes on to ``graph``'s: the model's,
#: the budget's, the target's and the receivers'.
GRAPH_OPTIONS = (
    "model",
    "device",
    "device_map",
    "dtype",
    "trust_remote_code",
    "quiet",
    "internal_batch_size",
    "max_chunk_mib",
    "target_kind",
    "foil",
    "qkv",
)
COMMANDS = f"""\
commands (anything else is a prompt):
  :graph COUNTERFACTUAL
                      the probability flow graph of the last prompt (as typed,
                      without the chat template) from COUNTERFACTUAL, a prompt
                      of the same token length, as captum-iglens graph computes
                      it; it takes :set target-kind prob|prob_diff|logit_diff,
                      :set foil TEXT and :set qkv on|off
  :set OPTION VALUE   one of the main job's options, as on the command line:
                      :set granularity head, :set layers 0,10,20, :set top-k 5,
                      :set chat off, :set foil ' Lyon'
  :unset OPTION       the option back to its default, e.g. :unset foil
  :show               every option and its value
  {" ".join(":" + name for name in OUTPUTS)} PATH
                      write the last result, the map of the last prompt or the
                      last :graph, whichever came last (the viewer, for :html;
                      a graph has no :png)
  :help               this list
  :quit               end the session (also Ctrl-D, or Ctrl-C at the prompt)"""


def add_parser(commands: "argparse._SubParsersAction", name: str) -> None:
    r"""Adds the subcommand ``name`` to ``commands``."""
    shell = commands.add_parser(
        name,
        parents=[
            settings_parent(),
            model_parent(),
            options_parent(),
            graph_options_parent(),
        ],
        help="an interactive session: load the model once, then type prompts",
        description="An interactive session: the model is loaded once, then "
        "each line typed is a prompt, answered and attributed as the main job "
        "does. The options are the main job's; in the session, ':set OPTION "
        "VALUE' changes one (':set granularity head'), ':graph COUNTERFACTUAL' "
        "computes the last prompt's flow graph and ':html PATH' writes the last "
        "result's viewer.",
        epilog=COMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shell.set_defaults(prepare=prepare)


def prepare(args: argparse.Namespace) -> Job:
    r"""Checks the options and loads the model; the job is the session."""
    return Session(args).run


class _OptionParser(Parser):
    """The options a session can change; an error is raised, not exited on."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(option_first(message))


class Session:
    r"""
    One interactive session on one loaded model.

    Args:

        args (argparse.Namespace): The parsed options of ``shell``; the model's
                    are used once, to load it, the others are the session's
                    starting options.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.options = _OptionParser(
            prog=":set",
            add_help=False,
            parents=[settings_parent(), options_parent(), graph_options_parent()],
        )
        self.fixed = {
            option.lstrip("-")
            for action in model_parent()._actions
            for option in action.option_strings
        }
        settings, _ = check_options(args)
        self.args = args
        self.parts, self.tokenizer = load(args, settings)
        self.prompt: Optional[str] = None
        self.last: Optional[Any] = None
        self._readouts: Dict[Tuple[str, int], Any] = {}

    def run(self) -> int:
        r"""Reads and runs lines until the session ends; returns 0."""
        history = _start_history()
        model = self.args.model or "smollm2"
        print(
            f"captum-iglens shell, {model} loaded: type a prompt, :help for the "
            "commands, Ctrl-D to end"
        )
        while True:
            try:
                line = input(PROMPT).strip()
            except (EOFError, KeyboardInterrupt):
                print()
                break
            try:
                if not self.handle(line):
                    break
            except KeyboardInterrupt:
                print("interrupted; the prompt is abandoned")
            except (CommandError, *INPUT_ERRORS) as err:
                text = str(err).strip()
                message = text.splitlines()[0] if text else type(err).__name__
                print(f"error: {self.options.in_option_names(message)}")
        _save_history(history)
        return 0

    def handle(self, line: str) -> bool:
        r"""Runs one line; False when it ends the session."""
        if not line:
            return True
        if not line.startswith(":"):
            self.attribute(line)
            return True
        command, _, rest = line[1:].partition(" ")
        if command == "graph":  # the rest is a prompt, quotes and all
            self.graph(rest.strip())
            return True
        words = shlex.split(rest)
        if command in ("quit", "q", "exit"):
            return False
        if command == "help":
            print(COMMANDS)
        elif command == "show":
            print(self.show())
        elif command == "set":
            self.set(words)
        elif command == "unset":
            self.unset(words)
        elif command in OUTPUTS:
            self.write(command, words)
        else:
            raise CommandError(f":{command}: not a command; :help lists them")
        return True

    def attribute(self, prompt: str) -> None:
        r"""Answers, attributes and prints ``prompt`` under the current options;
        ``prompt`` is the one ``:graph`` reads from then on."""
        settings, folder = check_options(self.args)
        self.prompt = prompt
        key = (str(folder), settings.max_chunk_bytes)
        if key not in self._readouts:
            self._readouts[key] = lens_readout(
                folder, self.parts, self.tokenizer, self.args, settings
            )
        scored = scored_tokens(self.args, self.tokenizer)
        stages = Stages()
        maps = answer_and_attribute(
            self.parts,
            self.tokenizer,
            prompt,
            settings,
            self._readouts[key],
            scored,
            stages,
            self.args,
            companion=None
            if folder
            else companion_settings(settings, self.args.n_steps),
        )
        if maps is not None:
            report(*maps, self.args)
            print(stages.summary())
            self.last = maps[0]

    def graph(self, counterfactual: str) -> None:
        r"""``:graph COUNTERFACTUAL``: the flow graph of the last prompt, computed
        and printed as ``graph`` does, with the session's ``--target-kind``,
        ``--foil`` and ``--qkv`` and ``graph``'s defaults for the rest."""
        if not counterfactual:
            raise CommandError(
                ":graph: expected the counterfactual prompt, of the last prompt's "
                "token length: :graph COUNTERFACTUAL"
            )
        if self.prompt is None:
            raise CommandError(
                ":graph: no prompt yet; type a prompt first, then :graph COUNTERFACTUAL"
            )
        args = graph_args(
            prompt=self.prompt,
            counterfactual=counterfactual,
            **{name: getattr(self.args, name) for name in GRAPH_OPTIONS},
        )
        prompt = check_graph_options(args)
        self.last = plan_graph(self.parts, self.tokenizer, prompt, args)()

    def set(self, words: List[str]) -> None:
        r"""``:set OPTION VALUE...`` (or ``:set --option VALUE ...``)."""
        if not words:
            raise CommandError(":set: expected an option and its value")
        name = words[0].lstrip("-")
        if name in self.fixed:
            raise CommandError(
                f"--{name}: the model's options are fixed for a session; start "
                "another shell to change them"
            )
        if words[0].startswith("--"):
            argv = words
        elif self._is_switch(name) and words[1:] in (["on"], ["off"]):
            argv = [f"--{name}" if words[1] == "on" else f"--no-{name}"]
        else:
            argv = [f"--{name}", *words[1:]]
        self._apply(self.options.parse_args(argv, namespace=copy.copy(self.args)))

    def unset(self, words: List[str]) -> None:
        r"""``:unset OPTION``: the option back to its default."""
        if len(words) != 1:
            raise CommandError(":unset: expected one option, e.g. :unset foil")
        action = self._action(words[0].lstrip("-"))
        changed = copy.copy(self.args)
        setattr(changed, action.dest, action.default)
        self._apply(changed)

    def show(self) -> str:
        r"""Every option the session can change, with its value."""
        lines = []
        for action in self.options._actions:
            value = getattr(self.args, action.dest)
            lines.append(f"  {action.option_strings[0]} {value!r}")
        return "\n".join(lines)

    def write(self, kind: str, words: List[str]) -> None:
        r"""``:json``, ``:csv``, ``:png`` or ``:html PATH``: the last result."""
        if len(words) != 1:
            raise CommandError(f":{kind}: expected one path, e.g. :{kind} out.{kind}")
        if self.last is None:
            raise CommandError(f":{kind}: no result yet; type a prompt first")
        graph = _is_graph(self.last)
        if graph and kind not in GRAPH_WRITERS:
            raise CommandError(
                f":{kind}: the last result is a graph, written by "
                f"{', '.join(':' + name for name in GRAPH_WRITERS)}"
            )
        target = copy.copy(self.args)
        for name in OUTPUTS:
            setattr(target, name, words[0] if name == kind else None)
        check_outputs(target, kind)
        if graph:
            getattr(self.last, GRAPH_WRITERS[kind])(words[0])
        else:
            write_files(self.last, target)
        print(f"wrote {words[0]}")

    def _apply(self, changed: argparse.Namespace) -> None:
        """Makes ``changed`` the session's options once they pass the main
        job's checks and fit the model."""
        from captum_iglens.attr.granularities import model_columns

        settings, _ = check_options(changed)
        model_columns(self.parts, settings.layers, settings.granularity)
        self.args = changed

    def _action(self, name: str) -> argparse.Action:
        for action in self.options._actions:
            if f"--{name}" in action.option_strings:
                return action
        raise CommandError(f"--{name}: not an option of the session; :show lists them")

    def _is_switch(self, name: str) -> bool:
        return isinstance(self._action(name), argparse.BooleanOptionalAction)


def _is_graph(result: Any) -> bool:
    """Whether ``result`` is a flow graph (else a map); imports torch, which a
    result has loaded already."""
    from captum_iglens.attr.flow.graph import FlowGraph

    return isinstance(result, FlowGraph)


def _start_history() -> Optional[Path]:
    """Line editing and the history of earlier sessions, where readline exists;
    the history file's path (under the model cache), or None."""
    try:
        import readline
    except ImportError:  # no readline on this platform: plain input()
        return None
    from captum_iglens.hf.model_files import cache_root

    try:
        path = cache_root() / "shell_history"
    except ValueError:
        return None
    try:
        readline.read_history_file(path)
    except OSError:  # no history yet
        pass
    readline.set_history_length(1000)
    return path


def _save_history(path: Optional[Path]) -> None:
    if path is None:
        return
    import readline

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError:  # an unwritable cache costs the history, not the session
        pass
