r"""
The options of ``graph`` that its one-prompt form
(:mod:`~captum_iglens.cli.graph`) and its pair-file form
(:mod:`~captum_iglens.cli.graph_pairs`) share: their checks before the model
loads, the arguments of the flow they give, and the option a refusal's
argument name stands for.
"""

import argparse
from typing import Any, Dict, List

from captum_iglens.attr.flow.options import check_steps
from captum_iglens.cli.common import CommandError

#: The options that name the files one graph is written to.
GRAPH_OUTPUTS = ("json", "csv", "pairs_csv", "eap_json", "html")


def check_shared_options(args: argparse.Namespace) -> None:
    r"""The checks of ``graph``'s options that hold for one prompt and for a
    pair file alike: the path's start, the step count, the target and foil
    texts and the device.

    Args:

        args (argparse.Namespace): ``graph``'s parsed options.

    Raises:
        CommandError: Naming the first bad option, in one line.
    """
    if args.counterfactual is not None:
        if not args.counterfactual.strip():
            raise CommandError("--counterfactual: expected a non-empty prompt")
        if args.baseline is not None:
            raise CommandError(
                "--baseline: give either --counterfactual or --baseline, not both"
            )
    _check_subject(args)
    try:
        check_steps(args.n_steps, "--n-steps")
    except ValueError as error:
        raise CommandError(str(error)) from None
    for name in ("target", "foil"):
        if getattr(args, name) == "":
            raise CommandError(f"--{name}: expected a token's text")
    if args.device_map is not None:
        raise CommandError("--device-map: graph runs the model on one --device")


def check_receiver_positions(args: argparse.Namespace, prompts: List[str]) -> None:
    r"""``--receiver-positions`` against the memory available for the longest
    of ``prompts``, from the model's ``config.json`` and ``tokenizer.json``
    where they can be read before the load (the loaded model is checked
    again, with its path points). Nothing is checked where they cannot be read.

    Args:

        args (argparse.Namespace): ``graph``'s parsed options.
        prompts (list[str]): The prompts of the graphs, one for each.

    Raises:
        CommandError: If the longest prompt's pairs would not fit, naming
            ``--receiver-positions``.
    """
    if not args.receiver_positions:
        return
    from captum_iglens.hf.model_files import read_text_config, read_tokenizer

    config, tokenizer = read_text_config(args.model), read_tokenizer(args.model)
    if config is None or tokenizer is None:
        return
    blocks = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    if not (isinstance(blocks, int) and isinstance(heads, int)):
        return
    from captum_iglens.attr.flow.pair_memory import check_pair_memory
    from captum_iglens.graph.model_graph import model_graph

    length = max(len(tokenizer(prompt)["input_ids"]) for prompt in prompts)
    check_pair_memory(model_graph(blocks, heads, args.qkv), length)


def _check_subject(args: argparse.Namespace) -> None:
    """``--corrupt-subject``: one start of the path."""
    subject = args.corrupt_subject
    if subject is None:
        return
    for other in ("counterfactual", "baseline"):
        if getattr(args, other) is not None:
            raise CommandError(
                f"--corrupt-subject: give either --{other} or --corrupt-subject, "
                "not both"
            )
    if not subject.strip():
        raise CommandError("--corrupt-subject: expected the subject's text")


def flow_options(args: argparse.Namespace) -> Dict[str, Any]:
    r"""
    The arguments of :meth:`ProbabilityFlow.plan` that ``graph``'s options
    give, all but the prompt.

    Args:

        args (argparse.Namespace): ``graph``'s options.

    Returns:
        *dict*.
    """
    return dict(
        # stripped as the prompt is, so that equal prompts have equal lengths
        counterfactual=args.counterfactual and args.counterfactual.strip(),
        corrupt_subject=args.corrupt_subject,
        noise_seed=args.noise_seed,
        baselines=args.baseline or "mean",
        target=args.target,
        target_kind=args.target_kind,
        foil=args.foil,
        position=args.position,
        n_steps=args.n_steps,
        method=args.method,
        qkv=args.qkv,
        per_position=args.per_position,
        receiver_positions=args.receiver_positions,
        internal_batch_size=args.internal_batch_size,
        max_chunk_bytes=args.max_chunk_mib * 2**20,
    )


def as_options(message: str) -> str:
    r"""A Python argument's name at the head of ``message`` as the option."""
    name, sep, rest = message.partition(": ")
    renamed = {
        "inputs": "prompt",
        "baselines": "--baseline",
        "max_chunk_bytes": "--max-chunk-mib",
    }
    option = renamed.get(name, "--" + name.replace("_", "-"))
    return option + sep + rest if sep and name.isidentifier() else message
