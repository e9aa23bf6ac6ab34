r"""Proposing and verifying the parts of a causal LM that is not in the table.

:func:`propose_parts` reads the module tree and the config of a model:
the decoder blocks are its longest ``nn.ModuleList``, the head is
``model.get_output_embeddings()``, the final norm is a norm next to the blocks
(or nothing), and the final-logit transform is whichever the config names
(``final_logit_softcapping``, ``logits_scaling``, ``logit_scale``,
``lm_head_multiplier``), or none. None of that is trusted:
:func:`last_outputs_and_logits` runs one real forward and
:func:`readout_error` measures how far a readout is from the model's own
logits; :func:`captum_iglens.hf.architectures.architecture` uses the first
proposal that reproduces them, or raises :class:`ValueError` naming the model
type and showing the ``register_architecture(...)`` call
(:func:`register_hint`) to write instead.

The probe proposes no mid-block module: nothing in a forward tells which module
reads ``h + attn(...)``. A probed model supports ``granularity="block"``;
register it with ``mid=`` for the sub-layer split.
"""

import itertools
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, cast

import torch
from torch import nn, Tensor

from captum_iglens.readout.transforms import LogitDivide, LogitScale, Softcap

#: Tokens in the verification forward.
VERIFY_LENGTH = 8

# Config field -> the transform the model applies to the head's output.
_POST_FROM_CONFIG: Dict[str, Callable[[float], nn.Module]] = {
    "final_logit_softcapping": Softcap,
    "logits_scaling": LogitDivide,
    "logit_scale": LogitScale,
    "lm_head_multiplier": LogitScale,
}


class Proposal(NamedTuple):
    r"""Dotted paths of proposed parts, and the final transform with its name."""

    layers: str
    norm: Tuple[str, ...]
    head: Tuple[str, ...]
    post: Callable[[nn.Module], Optional[nn.Module]]
    post_name: str


def tolerance(dtype: torch.dtype) -> float:
    r"""Relative tolerance of a readout against the logits, by dtype."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def _block_lists(model: nn.Module) -> List[str]:
    """Paths of the non-empty ModuleLists, shallowest first, then longest (so
    that the blocks come before the experts or heads inside them)."""
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if name and isinstance(module, nn.ModuleList) and len(module) > 0
    ]
    lists.sort(key=lambda item: (item[0].count("."), -len(item[1])))
    return [name for name, _ in lists]


def _looks_like_norm(name: str, module: nn.Module) -> bool:
    kind = type(module).__name__.lower()
    return "norm" in kind or "norm" in name.rsplit(".", 1)[-1].lower()


def _norm_candidates(model: nn.Module, layers: str) -> List[Tuple[str, ...]]:
    """Norm-like siblings of the block list (one each), then no norm at all."""
    parent = layers.rsplit(".", 1)[0] if "." in layers else ""
    owner = model.get_submodule(parent)
    prefix = f"{parent}." if parent else ""
    found = [
        (f"{prefix}{name}",)
        for name, child in owner.named_children()
        if _looks_like_norm(name, child)
    ]
    return found + [()]


def _head_path(model: nn.Module) -> Optional[str]:
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if head is None:
        return None
    return next((n for n, m in model.named_modules() if m is head), None)


def _post_candidates(
    model: nn.Module,
) -> List[Tuple[str, Callable[[nn.Module], Optional[nn.Module]]]]:
    """The transforms the config names (each alone), then none."""
    config = getattr(model, "config", None)
    found = []
    for field, transform in _POST_FROM_CONFIG.items():
        value = getattr(config, field, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value > 0 and value != 1:
                name = f"{transform.__name__}({value!r})"
                found.append((name, _fixed(transform, value)))
    return found + [("none", lambda m: None)]


def _fixed(
    transform: Callable[[float], nn.Module], value: float
) -> Callable[[nn.Module], nn.Module]:
    return lambda model: transform(value)


def propose_parts(model: nn.Module) -> List[Proposal]:
    r"""Proposes the parts of ``model`` from its module tree and config.

    Args:
        model (nn.Module): A Hugging Face causal LM (``*ForCausalLM``).

    Returns:
        *list[Proposal]*: most plausible first. Empty if the model has no head.
    """
    head = _head_path(model)
    if head is None:
        return []
    return [
        Proposal(layers, norm, (head,), post, post_name)
        for layers in _block_lists(model)
        for norm, (post_name, post) in itertools.product(
            _norm_candidates(model, layers), _post_candidates(model)
        )
    ]


def verification_ids(model: nn.Module) -> Tensor:
    r"""Token ids ``(1, VERIFY_LENGTH)`` spread over the vocabulary, avoiding 0
    (often padding), on the model's input device."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise ValueError(
            f"{type(model).__name__}: config.vocab_size is {vocab!r}; the probe "
            "needs token ids to run a verification forward"
        )
    device = cast(Any, model).get_input_embeddings().weight.device
    ids = 1 + (torch.arange(VERIFY_LENGTH) * 7919) % (vocab - 1)
    return ids[None].to(device)


def last_outputs_and_logits(
    model: nn.Module, paths: List[str]
) -> Tuple[Dict[str, Tensor], Tensor]:
    r"""One forward in eval mode, hooks removed and modes restored after.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        paths (list[str]): Dotted paths of block lists.

    Returns:
        The output of the last module of each list (those that ran and returned
        a tensor), by path, and the model's logits ``(1, T, V)``.
    """
    captured: Dict[str, Tensor] = {}

    def keeper(path: str) -> Callable[..., None]:
        def keep(module: nn.Module, args: Tuple, output: object) -> None:
            state = output[0] if isinstance(output, tuple) and output else output
            if isinstance(state, Tensor):
                captured[path] = state.detach()

        return keep

    modes = {m: m.training for m in model.modules()}
    handles = [
        cast(nn.ModuleList, model.get_submodule(path))[-1].register_forward_hook(
            keeper(path)
        )
        for path in paths
    ]
    try:
        model.eval()
        with torch.no_grad():
            out = model(input_ids=verification_ids(model))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    return captured, (out.logits if hasattr(out, "logits") else out)


def readout_error(
    norm: Optional[nn.Module],
    head: nn.Module,
    post: Optional[nn.Module],
    h_final: Tensor,
    logits: Tensor,
) -> float:
    r"""Max difference between ``post(head(norm(h_final)))`` and the logits,
    relative to ``1 + max |logits|``; inf where the parts do not fit."""
    try:
        with torch.no_grad():
            ours = head(h_final if norm is None else norm(h_final))
            if post is not None:
                ours = post(ours)
    except (RuntimeError, ValueError, TypeError, AttributeError):
        return float("inf")
    if not isinstance(ours, Tensor) or ours.shape != logits.shape:
        return float("inf")
    theirs = logits.float().to(ours.device)
    scale = 1.0 + theirs.abs().max().item()
    return (ours.float() - theirs).abs().max().item() / scale


def measured_norm_kind(norm: Optional[nn.Module], h_final: Tensor) -> str:
    r"""``"layer"`` if the final norm removes a constant shift, else ``"rms"``
    (``"none"`` without a norm)."""
    if norm is None:
        return "none"
    with torch.no_grad():
        plain, shifted = norm(h_final), norm(h_final + 1.0)
    centred = (plain - shifted).abs().max().item() <= 1e-3 * (
        1.0 + plain.abs().max().item()
    )
    return "layer" if centred else "rms"


def register_hint(
    model_type: object, layers: str, norm: Tuple[str, ...], head: Tuple[str, ...]
) -> str:
    r"""The ``register_architecture(...)`` call to suggest in an error message."""
    return (
        "captum_iglens.register_architecture("
        f"{model_type!r}, layers={layers!r}, norm={norm or ('model.norm',)!r}, "
        f"head={head!r}, post=None or e.g. Softcap(30.0), "
        "mid='post_attention_layernorm' or None)"
    )
