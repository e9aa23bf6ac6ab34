r"""Proposing and verifying the parts of a causal LM that is not in the table.

:func:`propose_architectures` reads the module tree and the config of a model:
the decoder blocks are its longest ``nn.ModuleList``, the head is
``model.get_output_embeddings()``, the final norm is a norm next to the blocks
(or nothing), and the final-logit transform is whichever the config names
(``final_logit_softcapping``, ``logits_scaling``, ``logit_scale``,
``lm_head_multiplier``), or none. None of that is trusted:
:func:`verify_architecture` runs one real forward and accepts an entry only if
the readout of the last block's output reproduces the model's own logits.
:func:`probe_architecture` returns the first proposal that passes, or raises
:class:`ValueError` naming the model type and showing the
``register_architecture(...)`` call to write instead.

The probe proposes no mid-block module: nothing in a forward tells which module
reads ``h + attn(...)``. A probed model supports ``granularity="block"``;
register it with ``mid=`` for the sub-layer split.
"""

import itertools
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn, Tensor

from captum_iglens.hf.architectures import (
    Architecture,
    blocks_of,
    mid_modules_of,
    readout_parts_of,
)
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


def _tolerance(dtype: torch.dtype) -> float:
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


def propose_architectures(model: nn.Module) -> List[Tuple[Architecture, str]]:
    r"""Proposes registry entries for ``model`` from its module tree and config.

    Args:
        model (nn.Module): A Hugging Face causal LM (``*ForCausalLM``).

    Returns:
        *list[tuple[Architecture, str]]*: candidate entries, most plausible first,
        each with the name of its final-logit transform (for messages). Empty if
        the model has no head or no ``nn.ModuleList``.
    """
    head = _head_path(model)
    if head is None:
        return []
    proposals = []
    for layers in _block_lists(model):
        for norm, (post_name, post) in itertools.product(
            _norm_candidates(model, layers), _post_candidates(model)
        ):
            entry = Architecture(
                layers=layers,
                norm=norm,
                head=(head,),
                post=post,
                norm_kind="rms" if norm else "none",
            )
            proposals.append((entry, post_name))
    return proposals


def _verification_ids(model: nn.Module) -> Tensor:
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise ValueError(
            f"{type(model).__name__}: config.vocab_size is {vocab!r}; the probe "
            "needs token ids to run a verification forward"
        )
    device = model.get_input_embeddings().weight.device
    # Distinct ids spread over the vocabulary, avoiding 0 (often padding).
    ids = 1 + (torch.arange(VERIFY_LENGTH) * 7919) % (vocab - 1)
    return ids[None].to(device)


def _last_outputs_and_logits(
    model: nn.Module, paths: List[str]
) -> Tuple[Dict[str, Tensor], Tensor]:
    """One forward in eval mode: the output of the last module of each block
    list in ``paths`` (those that ran and returned a tensor), and the logits."""
    captured: Dict[str, Tensor] = {}

    def keeper(path: str) -> Callable[..., None]:
        def keep(module: nn.Module, args: Tuple, output: object) -> None:
            state = output[0] if isinstance(output, tuple) and output else output
            if isinstance(state, Tensor):
                captured[path] = state.detach()

        return keep

    modes = {m: m.training for m in model.modules()}
    handles = [
        model.get_submodule(path)[-1].register_forward_hook(keeper(path))
        for path in paths
    ]
    try:
        model.eval()
        with torch.no_grad():
            out = model(input_ids=_verification_ids(model))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    return captured, (out.logits if hasattr(out, "logits") else out)


def _readout_error(
    model: nn.Module, entry: Architecture, h_final: Tensor, logits: Tensor
) -> float:
    """Max difference between the entry's readout of ``h_final`` and the logits,
    relative to ``1 + max |logits|``; inf where the parts do not fit."""
    try:
        norm, head, post = readout_parts_of(model, entry)
        with torch.no_grad():
            ours = head(h_final if norm is None else norm(h_final))
            if post is not None:
                ours = post(ours)
    except (RuntimeError, ValueError, TypeError, AttributeError):
        return float("inf")
    if ours.shape != logits.shape:
        return float("inf")
    theirs = logits.float().to(ours.device)
    scale = 1.0 + theirs.abs().max().item()
    return (ours.float() - theirs).abs().max().item() / scale


def _norm_kind(model: nn.Module, entry: Architecture, h_final: Tensor) -> str:
    """``"layer"`` if the final norm removes a constant shift, else ``"rms"``."""
    norm, _, _ = readout_parts_of(model, entry)
    if norm is None:
        return "none"
    with torch.no_grad():
        plain, shifted = norm(h_final), norm(h_final + 1.0)
    centred = (plain - shifted).abs().max().item() <= 1e-3 * (
        1.0 + plain.abs().max().item()
    )
    return "layer" if centred else "rms"


def _register_hint(model_type: object, entry: Optional[Architecture]) -> str:
    layers = entry.layers if entry is not None else "model.layers"
    norm = entry.norm if entry is not None and entry.norm else ("model.norm",)
    head = entry.head if entry is not None else ("lm_head",)
    return (
        "captum_iglens.register_architecture("
        f"{model_type!r}, layers={layers!r}, norm={norm!r}, head={head!r}, "
        "post=None or e.g. Softcap(30.0), mid='post_attention_layernorm' or None)"
    )


def verify_architecture(model: nn.Module, entry: Architecture) -> None:
    r"""Checks an entry on a real forward of ``model``.

    The readout (final norm, head, final transform) of the last block's output
    must reproduce the model's logits (fp32: to ``1e-4`` relative to
    ``1 + max |logits|``), and each block must have the mid-block module, if the
    entry names one. The model's mode is restored and no hook is left.

    Args:
        model (nn.Module): The model.
        entry (Architecture): The entry to check.

    Raises:
        ValueError: If a part is missing or the readout does not reproduce the
            logits; the message names the model type and the error.
    """
    model_type = getattr(model.config, "model_type", None)
    mid_modules_of(model, entry, blocks_of(model, entry))
    captured, logits = _last_outputs_and_logits(model, [entry.layers])
    if entry.layers not in captured:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the last block "
            f"of {entry.layers!r} did not run or did not return a tensor"
        )
    h_final = captured[entry.layers]
    error = _readout_error(model, entry, h_final, logits)
    if error > _tolerance(h_final.dtype):
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the registered "
            "architecture does not reproduce the model's logits (relative "
            f"difference {error:.3g}): the readout ({entry.norm}, {entry.head}, "
            f"post) of the output of the last block of {entry.layers!r} must be "
            "what the model computes. Fix the entry with "
            f"{_register_hint(model_type, entry)[:-1]}, replace=True)"
        )


def probe_architecture(model: nn.Module) -> Architecture:
    r"""The verified entry of a model whose type is not in the table.

    Args:
        model (nn.Module): A Hugging Face causal LM.

    Returns:
        *Architecture*: the first proposal of :func:`propose_architectures`
        whose readout reproduces the model's logits on a real forward, with
        ``norm_kind`` measured on the final norm and no mid-block module.

    Raises:
        ValueError: If no proposal reproduces the logits; the message names the
            model type, what was tried and the ``register_architecture`` call.
    """
    model_type = getattr(model.config, "model_type", None)
    proposals = propose_architectures(model)
    tried: List[str] = []
    if proposals:
        paths = list(dict.fromkeys(entry.layers for entry, _ in proposals))
        captured, logits = _last_outputs_and_logits(model, paths)
        for entry, post_name in proposals:
            if entry.layers not in captured:
                continue
            h_final = captured[entry.layers]
            error = _readout_error(model, entry, h_final, logits)
            if error <= _tolerance(h_final.dtype):
                return Architecture(
                    layers=entry.layers,
                    norm=entry.norm,
                    head=entry.head,
                    post=entry.post,
                    norm_kind=_norm_kind(model, entry, h_final),
                )
            tried.append(
                f"layers={entry.layers!r}, norm={entry.norm}, post={post_name}: "
                f"{error:.3g}"
            )
    hint = _register_hint(model_type, proposals[0][0] if proposals else None)
    raise ValueError(
        f"{type(model).__name__} (model_type={model_type!r}) is not in the "
        "architecture table, and no part structure proposed by the probe "
        "reproduces its logits"
        + (f" (relative differences: {'; '.join(tried[:6])})" if tried else "")
        + f". Register it: {hint}; or build Readout(head=..., norm=..., post=...) "
        "by hand and pass layer= explicitly."
    )
