r"""Validation and normalisation of the arguments of :class:`LayerIGLens`.

Each check raises ``ValueError`` or ``TypeError`` naming the argument and what was
expected, before any hook is registered on the model.
"""

import inspect
import math
from typing import (
    Any,
    Callable,
    Collection,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import torch
from captum._utils.common import _format_tensor_into_tuples
from captum._utils.typing import TargetType
from torch import Tensor
from torch.nn import Module, ModuleList

from captum_iglens._utils.offload import unloaded
from captum_iglens.attr._utils.capture import NEEDS
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.scores import per_position

BaselineType = Union[None, int, float, Tensor, str, Tuple[Tensor, ...]]
PositionsType = Union[None, int, Sequence[int], Tensor]


def forward_module(forward_func: Callable[..., Any]) -> Optional[Module]:
    """The module that ``forward_func`` is, or is a bound method of; else None."""
    if isinstance(forward_func, Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, Module) else None


def check_construction(
    forward_func: Callable[..., Any],
    layer: Union[Module, Sequence[Module]],
    readout: LayerwiseReadout,
    input_layer: Optional[Module],
    layer_names: Optional[Sequence[str]],
    sublayers: Optional[Sequence[Module]],
) -> Tuple[List[Module], Module, List[str], Optional[List[Module]]]:
    """The arguments of ``LayerIGLens.__init__``, checked: the blocks as a list,
    the input layer, a name per block and the mid-block modules."""
    if not callable(forward_func):
        raise TypeError(
            f"forward_func: expected a callable, got {type(forward_func).__name__}"
        )
    is_list = isinstance(layer, (list, tuple, ModuleList))
    # Checked below: each must be a Module.
    layers: List[Any] = list(cast(Sequence[Module], layer)) if is_list else [layer]
    if not layers or not all(isinstance(m, Module) for m in layers):
        raise TypeError(
            "layer: expected a non-empty list of torch.nn.Module blocks, got "
            f"{type(layer).__name__}"
        )
    if len({id(m) for m in layers}) != len(layers):
        raise ValueError("layer: each block may appear only once")
    owner = forward_module(forward_func)
    for module in (*layers, readout, *([] if owner is None else [owner])):
        if isinstance(module, Module) and unloaded(module):
            raise ValueError(
                "model: its weights are on the meta device (not loaded); load "
                "them first, e.g. with from_pretrained(...) without device='meta'"
            )
    if not isinstance(readout, LayerwiseReadout):
        raise TypeError(
            "readout: expected a captum_iglens.Readout (or another "
            "captum_iglens.readout.interface.LayerwiseReadout), got "
            f"{type(readout).__name__}; build one with "
            "captum_iglens.hf.model_parts(model).readout() or "
            "Readout(head=..., norm=..., post=...)"
        )
    for module in layers:
        readout.state_index(module)  # each block is one the readout reads
    first: Module = layers[0] if input_layer is None else input_layer
    names = (
        _default_names(forward_func, layers)
        if layer_names is None
        else [str(n) for n in layer_names]
    )
    if len(names) != len(layers):
        raise ValueError(f"layer_names: expected {len(layers)} names, got {len(names)}")
    if sublayers is not None and (
        len(sublayers) != len(layers)
        or not all(isinstance(m, Module) for m in sublayers)
    ):
        raise ValueError(
            f"sublayers: expected one torch.nn.Module per block ({len(layers)}), "
            f"got {sublayers!r}"
        )
    if isinstance(forward_func, Module):
        inside = {id(m) for m in forward_func.modules()}
        named = [(f"layer[{i}]", m) for i, m in enumerate(layers)]
        named += [(f"sublayers[{i}]", m) for i, m in enumerate(sublayers or ())]
        for what, module in [*named, ("input_layer", first)]:
            if id(module) not in inside:
                raise ValueError(
                    f"{what}: {type(module).__name__} is not a submodule of "
                    "forward_func"
                )
    return layers, first, names, None if sublayers is None else list(sublayers)


def hf_model_of(forward_func: Callable[..., Any]) -> Module:
    r"""
    The Hugging Face model behind ``forward_func``: the model itself, the module
    a bound method belongs to, the function of a ``functools.partial``, or the
    model wrapped by ``nn.DataParallel``, ``DistributedDataParallel`` or
    :class:`~captum_iglens.hf.forward.CausalLMForward` (``.module``, ``.model``),
    a few levels deep, nearest first.

    Raises:
        TypeError: If there is none, naming ``readout=`` as the way out.
    """
    frontier: List[Any] = [forward_func]
    for _ in range(5):  # wrappers of wrappers, a few levels deep
        for candidate in frontier:
            if isinstance(candidate, Module) and hasattr(
                getattr(candidate, "config", None), "model_type"
            ):
                return candidate
        frontier = [
            getattr(c, name, None)
            for c in frontier
            if c is not None
            for name in ("__self__", "func", "module", "model")
        ]
    raise TypeError(
        "readout: forward_func is not a Hugging Face causal LM (nor a bound method "
        "of one, nor a wrapper holding one in .module or .model), so its readout "
        "cannot be found; pass readout=Readout(head=..., norm=..., post=...)"
    )


def qualified_names(
    forward_func: Callable[..., Any], modules: Sequence[Module]
) -> List[Optional[str]]:
    """Each module's qualified name in ``forward_func`` when it is a module; None
    for a module not in it, and for every module of a plain function."""
    if not isinstance(forward_func, Module):
        return [None] * len(modules)
    qualified = {id(m): name for name, m in forward_func.named_modules()}
    return [qualified.get(id(m)) for m in modules]


def _default_names(forward_func: Callable[..., Any], layers: List[Module]) -> List[str]:
    """The blocks' qualified names in ``forward_func`` when it is a module, else
    their indices."""
    names = qualified_names(forward_func, layers)
    return [str(i) if name is None else name for i, name in enumerate(names)]


def summed_credits(
    attributions: Union[Tensor, Sequence[Tensor]],
    shape: Sequence[int],
    counts: Collection[int],
) -> Tensor:
    r"""
    The credits ``(B, P)`` of attributions as ``attribute`` returns them: one
    ``(B, P, d)`` tensor, or a list of them, summed in float64.

    Args:

        attributions (Tensor or list[Tensor]): ``(B, P, d)`` each.
        shape (tuple[int, int]): ``(B, P)``.
        counts (collection of int): How many tensors ``attribute`` returns at
                    the granularities it returns per-column tensors for (per
                    block, per sub-layer): a list of another length (e.g. 3 of
                    4 blocks) would give a wrong delta.

    Raises:
        ValueError: If an attribution does not have the shape ``(*shape, d)``,
            or there are not as many as one of ``counts``.
    """
    parts = [attributions] if isinstance(attributions, Tensor) else attributions
    if isinstance(parts, Sequence) and len(parts) not in counts:
        raise ValueError(
            f"attributions: expected {' or '.join(map(str, sorted(counts)))} "
            f"tensors, one per block or per sub-layer as attribute returns them, "
            f"got {len(parts)}"
        )
    shape = tuple(shape)
    if not parts or any(
        not isinstance(a, Tensor) or a.dim() != 3 or tuple(a.shape[:2]) != shape
        for a in parts
    ):
        raise ValueError(
            f"attributions: expected a tensor (or a list of tensors) of shape "
            f"{shape + ('d',)} as attribute returns for these arguments"
        )
    return torch.stack([a.double().sum(-1) for a in parts]).sum(0)


def check_settings(
    internal_batch_size: Optional[int], attribute_to_layer_input: bool
) -> None:
    if internal_batch_size is not None and (
        isinstance(internal_batch_size, bool)
        or not isinstance(internal_batch_size, int)
        or internal_batch_size < 1
    ):
        raise ValueError(
            f"internal_batch_size: expected None or an int >= 1, got "
            f"{internal_batch_size!r}"
        )
    if attribute_to_layer_input:
        raise ValueError(
            "attribute_to_layer_input: IG-Lens follows the residual stream through "
            "block outputs; pass False (choose earlier blocks in `layer` instead)"
        )


def format_inputs(
    inputs: Union[Tensor, Tuple[Tensor, ...]],
) -> Tuple[Tuple[Tensor, ...], int, int]:
    """The inputs as Captum's tuple, with the batch size and sequence length of
    the first (token ids ``(B, T)`` or embeddings ``(B, T, d)``)."""
    formatted = (
        _format_tensor_into_tuples(inputs) if isinstance(inputs, Tensor) else inputs
    )
    if (
        not isinstance(formatted, tuple)
        or not formatted
        or not isinstance(formatted[0], Tensor)
    ):
        raise TypeError(
            "inputs: expected a tensor (B, T) of token ids or (B, T, d) of "
            f"embeddings, or a tuple led by one; got {type(inputs).__name__}"
        )
    first = formatted[0]
    if first.dim() < 2 or first.shape[0] == 0 or first.shape[1] == 0:
        raise ValueError(
            "inputs: expected a non-empty batch (B, T) or (B, T, d) with "
            f"B, T >= 1, got shape {tuple(first.shape)}"
        )
    if first.dtype == torch.bool or first.is_complex():
        raise TypeError(
            f"inputs: expected integer token ids or float embeddings, got {first.dtype}"
        )
    if first.is_floating_point() and first.dim() == 2:
        raise TypeError(
            f"inputs: a (B, T) tensor holds token ids, expected an integer dtype, "
            f"got {first.dtype} (embeddings are (B, T, d)). {NEEDS}"
        )
    if first.is_floating_point() and first.dim() != 3:
        raise ValueError(
            f"inputs: float inputs must be embeddings (B, T, d), got shape "
            f"{tuple(first.shape)}. {NEEDS}"
        )
    if not first.is_floating_point() and first.dim() != 2:
        raise ValueError(
            "inputs: integer token ids must have shape (B, T), got shape "
            f"{tuple(first.shape)}"
        )
    return formatted, first.shape[0], first.shape[1]


def check_token_ids(forward_func: Callable[..., Any], inputs: Tensor) -> None:
    r"""For a Hugging Face model: ``(B, T)`` inputs are integer token ids within
    its input vocabulary (other forward functions define their own inputs)."""
    try:
        embeddings = cast(Any, hf_model_of(forward_func)).get_input_embeddings()
    except (TypeError, AttributeError, NotImplementedError):
        return
    vocab = getattr(embeddings, "num_embeddings", None)
    if inputs.dim() != 2 or vocab is None:
        return
    if inputs.is_floating_point():
        raise TypeError(
            f"inputs: a (B, T) tensor holds token ids, expected an integer dtype, "
            f"got {inputs.dtype} (embeddings are (B, T, d))"
        )
    low, high = int(inputs.min()), int(inputs.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"inputs: token ids must lie in [0, {vocab}), the model's vocabulary, "
            f"got min {low}, max {high}"
        )


def attention_mask_of(
    forward_func: Callable[..., Any],
    inputs: Tuple[Tensor, ...],
    extra: Optional[Tuple[Any, ...]],
    batch: int,
    length: int,
) -> Optional[Tensor]:
    """The tensor bound to a parameter named ``attention_mask``, if any."""
    func = forward_func
    try:
        bound = inspect.signature(
            func.forward if isinstance(func, Module) else func
        ).bind_partial(*inputs, *(extra or ()))
    except (TypeError, ValueError):
        return None
    mask = bound.arguments.get("attention_mask")
    if not isinstance(mask, Tensor):
        return None
    if tuple(mask.shape) != (batch, length):
        raise ValueError(
            f"additional_forward_args: expected attention_mask of shape "
            f"({batch}, {length}), got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        bad = mask[(mask != 0) & (mask != 1)].flatten()[0].item()
        raise ValueError(
            "additional_forward_args: expected an attention_mask of 0s and 1s (1 "
            f"at a real token, 0 at padding), got {bad}; pass the mask the "
            "tokenizer returns"
        )
    return mask


def resolve_positions(
    positions: PositionsType, length: int, attention_mask: Optional[Tensor]
) -> Tensor:
    if positions is None:
        if attention_mask is None:
            return torch.arange(length)
        marked = attention_mask.bool().any(0)
        if not marked.any():
            raise ValueError(
                "additional_forward_args: the attention mask marks no token (all "
                "zeros); there is nothing to attribute"
            )
        return marked.nonzero()[:, 0].cpu()
    forms = (
        "None (every position), an int such as -1 (the last), or a non-empty 1-D "
        "list or tensor of ints"
    )
    if isinstance(positions, (str, bytes, float, bool)):
        raise TypeError(f"positions: expected {forms}, got {positions!r}")
    try:
        pos = torch.as_tensor(positions)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"positions: expected {forms}, got {positions!r}") from None
    if pos.dtype not in (torch.int64, torch.int32) or pos.dim() > 1 or pos.numel() == 0:
        raise ValueError(
            "positions: expected a non-empty 1-D list or tensor of int positions, "
            f"got {positions!r}"
        )
    pos = pos.reshape(-1).long().cpu()
    if ((pos < -length) | (pos >= length)).any():
        raise ValueError(
            f"positions: expected values in [-{length}, {length}), got {pos.tolist()}"
        )
    return pos % length


def _split_target(
    target: TargetType, batch: int
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Captum's target forms split into token ids (0-d, ``(B,)`` or ``(B, P)``)
    and, for ``(t, v)`` index tuples, the positions ``t`` (0-d or ``(B,)``)."""
    if target is None:
        return None, None
    if isinstance(target, tuple) or (
        isinstance(target, list) and any(isinstance(t, tuple) for t in target)
    ):
        index = [target] if isinstance(target, tuple) else target
        widths = {len(t) if isinstance(t, tuple) else -1 for t in index}
        if (
            len(widths) != 1
            or widths.pop() not in (1, 2)
            or not all(
                isinstance(i, int) and not isinstance(i, bool) for t in index for i in t
            )
        ):
            raise TypeError(
                "target: an index tuple is (v,) (token id v) or (t, v) (position t, "
                "token id v), and a list of them holds one such tuple of ints per "
                f"example, all of one length; got {target!r}"
            )
        if isinstance(target, list) and len(index) != batch:
            raise ValueError(
                f"target: expected one index tuple per example ({batch}), got "
                f"{len(index)}"
            )
        table = torch.tensor(index, dtype=torch.long)  # (n, 1) or (n, 2)
        if isinstance(target, tuple):
            table = table[0]
        positions = table[..., 0] if table.shape[-1] == 2 else None
        return table[..., -1], positions
    if isinstance(target, bool) or not isinstance(target, (int, list, Tensor)):
        raise TypeError(
            "target: expected None, an int, a tuple (v,) or (t, v), a list of B "
            "ints or of B such tuples, or an integer tensor (one element, (B,), "
            f"(B, 1) or (B, P)) of token ids; got {type(target).__name__}"
        )
    ids = torch.as_tensor(target)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"target: expected integer token ids, got dtype {ids.dtype}")
    if isinstance(target, Tensor) and ids.numel() == 1:  # a list has B entries
        return ids.reshape(()), None
    if ids.dim() == 2 and ids.shape[1] == 1:
        return ids[:, 0], None
    return ids, None


def target_positions(target: TargetType, batch: int, length: int) -> Optional[Tensor]:
    r"""
    The position each example's target names, for Captum's ``(t, v)`` index
    forms (a tuple, or a list of one tuple per example); None for every other
    form, whose positions come from ``positions=``.

    Returns:
        ``(B,)`` LongTensor of positions in ``[0, length)``, or None.
    """
    _, positions = _split_target(target, batch)
    if positions is None:
        return None
    if ((positions < -length) | (positions >= length)).any():
        raise ValueError(
            f"target: positions t of (t, v) must lie in [-{length}, {length}), got "
            f"{positions.tolist()}"
        )
    return (positions % length).expand(batch)


def resolve_targets(
    target: TargetType, batch: int, n_positions: int, vocab: int
) -> Optional[Tensor]:
    r"""
    The token ids to attribute, one per example and attributed position.

    Captum's ``TargetType`` forms keep Captum's meaning: an ``int``, a tuple
    ``(v,)`` and a one-element tensor name token ``v`` for every example; a list
    of ``B`` ints, a list of ``B`` one-tuples and a ``(B,)`` or ``(B, 1)`` tensor
    name one token per example; in ``(t, v)`` tuples the token is ``v`` (the
    position ``t`` is read by :func:`target_positions`). This project's own form,
    a ``(B, P)`` tensor (or list of lists) with ``P > 1``, names one token per
    attributed position. The rule that decides: a one-element tensor is a single
    id, a tensor whose second dimension is 1 (or that has one dimension) is per
    example, any other 2-D tensor is per position; tuples always index Captum's
    output (vocabulary last).

    Returns:
        ``(B, P)`` LongTensor, or None for the model's own greedy prediction.
    """
    ids, _ = _split_target(target, batch)
    if ids is None:
        return None
    return per_position(ids, batch, n_positions, vocab, "target")


def check_baselines(baselines: BaselineType) -> None:
    if isinstance(baselines, str):
        valid = baselines == "mean"
    elif isinstance(baselines, tuple):
        valid = bool(baselines) and all(isinstance(b, Tensor) for b in baselines)
    else:
        valid = baselines is None or (
            isinstance(baselines, (int, float, Tensor))
            and not isinstance(baselines, bool)
        )
    if not valid:
        raise TypeError(
            'baselines: expected None, "mean", a number, a tensor broadcastable '
            "to the hidden states (B, T, d), or token ids shaped like the inputs "
            f"(alone or in a tuple of tensors, one per input); got {baselines!r}"
        )
    finite = (
        torch.isfinite(torch.as_tensor(baselines)).all()
        if isinstance(baselines, (int, float, Tensor))
        else True
    )
    if not finite:
        raise ValueError("baselines: expected finite values, got NaN or inf")
    if isinstance(baselines, (int, float, Tensor)):
        values = torch.as_tensor(baselines).detach().double().abs()
        largest = float(values.max()) if values.numel() else 0.0
        if largest >= _LARGEST_BASELINE:
            raise ValueError(
                f"baselines: expected values under {_LARGEST_BASELINE:.3g} in size "
                "(the model's norms square them, and the square must be a finite "
                f"float32 number), got {largest:.3g}"
            )


#: The size of a baseline value whose square is the largest finite float32.
_LARGEST_BASELINE = math.sqrt(torch.finfo(torch.float32).max)


def baseline_inputs(
    baselines: BaselineType, inputs: Tuple[Tensor, ...], vocab_size: int
) -> Optional[Tuple[Tensor, ...]]:
    r"""
    The inputs of the reference forward pass for token-id baselines, as Captum
    users pass them to LayerIntegratedGradients: an integer tensor shaped like the
    integer first input ``(B, T)`` (alone or in a 1-tuple; the other inputs are
    kept), or a tuple of tensors, one per input, led by such ids. None for every
    other form of ``baselines`` (hidden states, numbers, ``"mean"``). Token ids
    outside ``[0, vocab_size)`` are refused.
    """
    ids = baselines[0] if isinstance(baselines, tuple) else baselines
    first = inputs[0]
    is_ids = (
        isinstance(ids, Tensor)
        and not ids.is_floating_point()
        and not first.is_floating_point()
        and tuple(ids.shape) == tuple(first.shape)
    )
    if is_ids:
        _check_ids_in_vocabulary(cast(Tensor, ids), vocab_size)
    if not isinstance(baselines, tuple) or len(baselines) == 1:
        if is_ids:
            return (cast(Tensor, ids), *inputs[1:])
        if (
            isinstance(baselines, tuple)
            and isinstance(ids, Tensor)
            and not ids.is_floating_point()
        ):
            raise ValueError(
                "baselines: token-id baselines must be an integer tensor shaped like "
                f"the token-id inputs {tuple(first.shape)}, got {tuple(ids.shape)}"
            )
        return None
    if not is_ids or len(baselines) != len(inputs):
        raise ValueError(
            f"baselines: a tuple of {len(baselines)} baselines is read as one per "
            f"input ({len(inputs)}), led by token ids shaped like the token-id "
            f"inputs {tuple(first.shape)}; got shapes "
            f"{[tuple(b.shape) for b in baselines]}"
        )
    return baselines


def _check_ids_in_vocabulary(ids: Tensor, vocab_size: int) -> None:
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if outside.numel():
        raise ValueError(
            f"baselines: token id {int(outside[0])} is outside the vocabulary "
            f"[0, {vocab_size}); give ids of tokens the model has"
        )


def check_last_position_real(attention_mask: Optional[Tensor]) -> None:
    r"""
    For a forward that returns last-position logits ``(B, V)``: every row's last
    position must be a real token.

    Args:

        attention_mask (Tensor, optional): ``(B, T)``, 0 at padding.

    Raises:
        ValueError: If a row ends in padding (a right-padded batch), whose
            credits would all be zero.
    """
    if attention_mask is None:
        return
    padded = (attention_mask[:, -1] == 0).nonzero()
    if padded.numel():
        raise ValueError(
            f"attention_mask: row {int(padded[0, 0])} ends in padding, but "
            "forward_func returns last-position logits (B, V), which read the last "
            "position; left-pad the batch"
        )


def baseline_states(
    baselines: BaselineType, h_0: Tensor, attention_mask: Optional[Tensor]
) -> Tensor:
    if baselines is None:
        return h_0
    if isinstance(baselines, tuple):  # a 1-tuple of hidden states
        baselines = baselines[0]
    if isinstance(baselines, str):
        weight = (
            torch.ones(h_0.shape[:2], device=h_0.device)
            if attention_mask is None
            else attention_mask.to(h_0.device).float()
        )[..., None]
        mean = (h_0.float() * weight).sum(1, keepdim=True) / weight.sum(1, keepdim=True)
        return mean.to(h_0.dtype).expand_as(h_0)
    value = torch.as_tensor(baselines, dtype=h_0.dtype, device=h_0.device)
    try:
        return torch.broadcast_to(value, h_0.shape)
    except RuntimeError:
        raise ValueError(
            f"baselines: expected a tensor broadcastable to the hidden states "
            f"{tuple(h_0.shape)}, got shape {tuple(value.shape)}"
        ) from None


def output_logits(
    output: Any, batch: int, length: int, vocab: int, kept: int = 0
) -> Tensor:
    """The logits of a forward's output: ``(B, T, V)``, last-position ``(B, V)``,
    or with ``kept`` (a forward that keeps the attributed positions' logits
    only, :meth:`~captum_iglens.hf.forward.CausalLMForward.keeping`) ``(B, kept,
    V)``; the log of a softmax output."""
    logits = getattr(output, "logits", output)
    if not isinstance(logits, Tensor):
        raise TypeError(
            "forward_func: expected it to return logits (B, T, V), an object "
            f"with .logits, or last-position logits (B, V); got "
            f"{type(output).__name__}"
        )
    shapes = {(batch, vocab), (batch, length, vocab), (batch, kept or length, vocab)}
    if tuple(logits.shape) in shapes:
        return _log_if_probabilities(logits)
    raise ValueError(
        f"forward_func: expected logits of shape ({batch}, {length}, {vocab}) or "
        f"({batch}, {vocab}) (vocabulary from the readout), got "
        f"{tuple(logits.shape)}. {NEEDS}"
    )


def _log_if_probabilities(logits: Tensor) -> Tensor:
    r"""The log of a forward's output that is a softmax (every entry >= 0, every
    row summing to 1, as many Captum tutorials write the forward): log-
    probabilities are logits of the same distribution. Other outputs as they
    are."""
    if not logits.is_floating_point() or logits.numel() == 0:
        return logits
    if logits.min().item() < 0:  # logits nearly always have negative entries
        return logits
    total = logits.sum(-1, dtype=torch.float32)
    tol = 1e-4 if logits.dtype in (torch.float32, torch.float64) else 1e-2
    if (total - 1).abs().max().item() > tol:
        return logits
    return logits.clamp_min(torch.finfo(logits.dtype).tiny).log()
