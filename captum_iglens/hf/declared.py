r"""What a registration declares about the inside of a block, checked on one
forward before first use: the ``mid`` module's input is the block input plus
the attention's update, the ``attn_out`` module's output is that update, and
the final norm is of the declared ``norm_kind``. A wrong field gives wrong
sub-layer, head or DLA credits without any error, so each is measured, and a
mismatch is one sentence naming the field.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.probe import measured_norm_kind, verification_ids


def check_declared(parts: ModelParts, h_final: Tensor) -> None:
    r"""
    Checks the ``mid``, ``attn_out`` and ``norm_kind`` of a registered entry.

    Args:

        parts (ModelParts): The parts bound from the entry.
        h_final (Tensor): The last block's output of the verification forward,
                    ``(1, T, d)``, for the norm's kind.

    Raises:
        ValueError: Naming the field whose declaration the forward contradicts.
    """
    declared = parts.architecture.norm_kind
    if parts.norm is not None and declared in ("rms", "layer"):
        measured = measured_norm_kind(parts.norm, h_final)
        if measured != declared:
            what = "subtracts the mean" if measured == "layer" else "keeps the mean"
            raise ValueError(
                f"norm_kind: registered {declared!r}, but the final norm "
                f"({type(parts.norm).__name__}) {what}: it is a {measured!r} norm; "
                f"register with norm_kind={measured!r}"
            )
    if parts.mid is not None:
        _check_blocks(parts)


def _check_blocks(parts: ModelParts) -> None:
    """The ``mid`` (and ``attn_out``) of every block against its states."""
    records = _block_records(parts)
    tol = 1e-3 if _dtype(records) in (torch.float32, torch.float64) else 5e-2
    for i, (h_in, h_mid, outputs) in enumerate(records):
        if h_mid is None or h_in is None:
            raise ValueError(
                f"mid: the module of block {i} did not run with a tensor input "
                "during the forward; give the module whose input is h + attn(...)"
            )
        if h_mid.shape != h_in.shape:
            raise ValueError(
                f"mid: the input of block {i}'s mid module has shape "
                f"{tuple(h_mid.shape)}, not the stream's {tuple(h_in.shape)}; give "
                "the module whose input is h + attn(...), e.g. "
                "'post_attention_layernorm'"
            )
        update = (h_mid - h_in).double()
        scale = h_in.double().abs().max().item()
        if update.abs().max().item() <= 1e-6 * (1.0 + scale):
            raise ValueError(
                f"mid: the input of block {i}'s mid module is the block input "
                "itself (every attention credit would be 0); give the module "
                "after the attention, whose input is h + attn(...)"
            )
        if not any(_fits(update, u, tol) for u in outputs.values()):
            raise ValueError(
                f"mid: the input of block {i}'s mid module is not the block input "
                "plus the output of any module of the block (the attention's "
                "update); give the module whose input is h + attn(...), e.g. "
                "'post_attention_layernorm'"
            )
        _check_attn_out(parts, i, update, outputs, tol)


def _check_attn_out(
    parts: ModelParts,
    i: int,
    update: Tensor,
    outputs: Dict[nn.Module, Tensor],
    tol: float,
) -> None:
    """The ``attn_out`` module's output, times the scale, is ``h_mid − h_in``."""
    if parts.attn_out is None:
        return
    projected = outputs.get(parts.attn_out[i])
    exact = projected is not None and projected.shape == update.shape
    if exact:
        assert projected is not None  # narrowed by ``exact``
        error = update - parts.attn_scale * projected.double()
        exact = error.abs().max().item() <= tol * update.abs().max().item()
    if not exact:
        raise ValueError(
            f"attn_out: the output of block {i}'s attn_out module is not the "
            "attention update the block adds to the stream (the mid state minus "
            "the block input); give the attention output projection, e.g. "
            "'self_attn.o_proj'"
        )


def _fits(update: Tensor, output: Tensor, tol: float) -> bool:
    """Whether ``update`` is a non-zero multiple of ``output`` (a scaled
    residual branch, as Granite's) within ``tol`` of its largest entry."""
    if output.shape != update.shape:
        return False
    u = output.double()
    norm = (u * u).sum()
    if norm.item() == 0.0:
        return False
    c = (update * u).sum() / norm
    error = (update - c * u).abs().max().item()
    return error <= tol * update.abs().max().item()


def _dtype(records: List[Tuple[Any, Any, Any]]) -> torch.dtype:
    """The dtype of the captured block inputs."""
    first = next((h for h, _, _ in records if h is not None), None)
    return torch.float32 if first is None else first.dtype


def _block_records(
    parts: ModelParts,
) -> List[Tuple[Optional[Tensor], Optional[Tensor], Dict[nn.Module, Tensor]]]:
    """Per block: its input, its mid module's input, and the tensor output of
    each of its submodules, from one forward (hooks removed, modes restored)."""
    n = len(parts.blocks)
    mid = parts.mid
    assert mid is not None  # the caller checks only blocks with a mid
    inputs: List[Optional[Tensor]] = [None] * n
    mids: List[Optional[Tensor]] = [None] * n
    outputs: List[Dict[nn.Module, Tensor]] = [{} for _ in range(n)]
    handles = []
    for i, block in enumerate(parts.blocks):
        handles.append(
            block.register_forward_pre_hook(_keep_input(inputs, i), with_kwargs=True)
        )
        handles.append(
            mid[i].register_forward_pre_hook(_keep_input(mids, i), with_kwargs=True)
        )
        for module in block.modules():
            if module is not block:
                handles.append(module.register_forward_hook(_keep_output(outputs[i])))
    model = parts.model
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(input_ids=verification_ids(model))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    return list(zip(inputs, mids, outputs))


def _keep_input(store: List[Optional[Tensor]], i: int) -> Callable[..., None]:
    def keep(module: nn.Module, args: Tuple, kwargs: Dict[str, Any]) -> None:
        state = args[0] if args else kwargs.get("hidden_states")
        if store[i] is None and isinstance(state, Tensor):
            store[i] = state.detach().clone()

    return keep


def _keep_output(store: Dict[nn.Module, Tensor]) -> Callable[..., None]:
    def keep(module: nn.Module, args: Tuple, output: Any) -> None:
        state = output[0] if isinstance(output, tuple) and output else output
        if module not in store and isinstance(state, Tensor):
            store[module] = state.detach().clone()

    return keep
