r"""
Causal ablation of decoder blocks: the drop in the model's real ``p(y)`` when one
block's update is removed in a full forward pass, for every chosen block, with the
ablated forwards stacked along the batch.

- :func:`ablate`: the drops, in one of :data:`MODES`.
- :func:`mean_updates`: the reference updates of the ``"mean"`` mode.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import left_pad
from captum_iglens.studies.validation.options import MODES
from captum_iglens.studies.validation.hooks import (
    hooked,
    replace_output,
    target_probabilities,
)


@dataclass
class Ablation:
    r"""
    The model's probability of each target, clean and with one block ablated.

    Attributes:

        clean (Tensor): ``(B, P)`` float32, from the unablated forward.
        ablated (Tensor): ``(B, P, k)`` float32, with block ``L_j`` ablated.
    """

    clean: Tensor
    ablated: Tensor

    @property
    def drop(self) -> Tensor:
        """``(B, P, k)``: ``clean − ablated``; positive where the block helps ``y``."""
        return self.clean[..., None] - self.ablated


def mean_updates(
    model: Union[Module, ModelParts],
    sequences: Sequence[Tensor],
    *,
    layers: Optional[Sequence[int]] = None,
    batch_size: int = 16,
    pad_id: int = 0,
) -> Tensor:
    r"""
    The mean update ``h_L − h_{L−1}`` of every chosen block over a reference set,
    kept apart for the first token of a sequence (whose states are unlike any
    other's: attention sinks) and for the other tokens.

    Args:

        model (PreTrainedModel or ModelParts): A causal LM of a supported
                    architecture, or its :func:`~captum_iglens.hf.model_parts`.
        sequences (list[Tensor]): The reference token ids, 1-D each.
        layers (list[int], optional): Block indices; the last block is always
                    added. Default: all blocks.
        batch_size (int, optional): Sequences per forward. Default: 16.
        pad_id (int, optional): Id used for (left) padding. Default: 0.

    Returns:
        *Tensor* ``(k, 2, d)`` float32: ``[j, 0]`` the first tokens' mean update
        of block ``L_j``, ``[j, 1]`` the other tokens'.
    """
    if not sequences:
        raise ValueError("sequences: expected at least one reference sequence")
    parts = model_parts(model)
    model, blocks, chosen = parts.model, parts.blocks, parts.choose(layers)
    device = next(model.parameters()).device
    sums = [torch.zeros((), dtype=torch.float64, device=device)] * len(chosen)
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    batch_in_flight: Dict[str, Tensor] = {}  # "where": (2, B, T), first / other tokens

    def recorder(j: int) -> Callable[..., None]:
        def hook(module: Module, args: Any, kwargs: Any, output: Any) -> None:
            update = (hidden_of(output) - hidden_of(None, args, kwargs)).double()
            sums[j] = sums[j] + torch.einsum(
                "sbt,btd->sd", batch_in_flight["where"], update
            )

        return hook

    with hooked({blocks[i]: recorder(j) for j, i in enumerate(chosen)}):
        for start in range(0, len(sequences), batch_size):
            ids, mask = left_pad(sequences[start : start + batch_size], pad_id)
            ids, mask = ids.to(device), mask.to(device)
            first = _first_token(mask)
            where = torch.stack([first, mask.bool() & ~first]).double()
            batch_in_flight["where"] = where
            counts += where.sum((1, 2))
            last = torch.tensor([ids.shape[1] - 1], device=device)
            with torch.inference_mode():
                target_probabilities(model, ids, mask, last, ids[:, -1:])
    return (torch.stack(sums) / counts.clamp(min=1)[None, :, None]).float()


def _first_token(mask: Tensor) -> Tensor:
    """``(B, T)`` bool: the first real token of each left-padded sequence."""
    first = mask.long().argmax(-1)
    return torch.arange(mask.shape[1], device=mask.device)[None] == first[:, None]


def ablate(
    model: Union[Module, ModelParts],
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    positions: Union[Sequence[int], Tensor],
    targets: Tensor,
    layers: Optional[Sequence[int]] = None,
    mode: str = "skip",
    means: Optional[Tensor] = None,
    max_batch: int = 256,
) -> Ablation:
    r"""
    The model's real probability of each target with each chosen block's update
    removed, one block at a time, in full forward passes.

    Modes:

    - ``"skip"``: the block's output is replaced by its input, at all positions.
    - ``"mean"``: the block's update is replaced by its mean update over a
      reference set (``means``, from :func:`mean_updates`), at all positions.
    - ``"zero-at-position"``: the block is skipped only at the attributed position
      (one forward per block and position).

    The ablated copies of the batch are stacked along the batch dimension, up to
    ``max_batch`` sequences per forward. One hook per chosen block is registered
    for the call and removed when it ends, whatever happens; in each forward, a
    block's hook edits only the rows of the copies that ablate it.

    Args:

        model (PreTrainedModel or ModelParts): A causal LM of a supported
                    architecture, or its :func:`~captum_iglens.hf.model_parts`.
        input_ids (Tensor): ``(B, T)`` token ids.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at left padding.
                    Default: None
        positions (list[int] or Tensor): The ``P`` positions whose predictions
                    are measured (negative values count from the end).
        targets (Tensor): ``(B, P)`` token ids, the predicted tokens.
        layers (list[int], optional): Block indices; the last block is always
                    added. Default: all blocks.
        mode (str, optional): One of :data:`MODES`. Default: ``"skip"``.
        means (Tensor, optional): ``(k, 2, d)``, required by ``"mean"``.
        max_batch (int, optional): The most sequences in one forward.
                    Default: 256.

    Returns:
        :class:`Ablation`.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    parts = model_parts(model)
    model, blocks, chosen = parts.model, parts.blocks, parts.choose(layers)
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    batch, length = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(device)
    pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1) % length
    targets = torch.as_tensor(targets, device=device).reshape(batch, len(pos))
    if mode == "mean" and (means is None or tuple(means.shape[:2]) != (len(chosen), 2)):
        raise ValueError(
            f'means: mode "mean" needs a ({len(chosen)}, 2, d) tensor from mean_updates'
        )
    # Each variant: a chosen block j and the position index it is ablated at (or all).
    variants = [
        (j, p if mode == "zero-at-position" else None)
        for j in range(len(chosen))
        for p in (range(len(pos)) if mode == "zero-at-position" else [None])
    ]
    fills = None
    if mode == "mean":
        assert means is not None  # checked above
        first = _first_token(mask)[..., None]
        fills = [torch.where(first, m[0], m[1]).to(device) for m in means]
    plan: Dict[int, List[Tuple[int, Optional[int]]]] = {}  # the forward in flight

    def editor(j: int) -> Callable[..., Any]:
        def hook(module: Module, args: Any, kwargs: Any, output: Any) -> Any:
            if j not in plan:
                return None
            before, after = hidden_of(None, args, kwargs), hidden_of(output)
            edited = after.clone()
            for replica, p in plan[j]:
                rows = slice(replica * batch, (replica + 1) * batch)
                if p is not None:
                    edited[rows, pos[p]] = before[rows, pos[p]]
                elif fills is None:
                    edited[rows] = before[rows]
                else:
                    edited[rows] = before[rows] + fills[j].to(before.dtype)
            return replace_output(output, edited)

        return hook

    per_chunk = max(1, max_batch // batch)
    out = []
    with torch.inference_mode():
        clean = target_probabilities(model, ids, mask, pos.to(device), targets)
        with hooked({blocks[i]: editor(j) for j, i in enumerate(chosen)}):
            for start in range(0, len(variants), per_chunk):
                part = variants[start : start + per_chunk]
                plan.clear()
                for replica, (j, p) in enumerate(part):
                    plan.setdefault(j, []).append((replica, p))
                copies = len(part)
                probs = target_probabilities(
                    model,
                    ids.repeat(copies, 1),
                    mask.repeat(copies, 1),
                    pos.to(device),
                    targets.repeat(copies, 1),
                )
                out.append(probs.view(copies, batch, len(pos)))
    stacked = torch.cat(out)  # (variants, B, P)
    if mode == "zero-at-position":  # variant (j, p) is read at position p only
        k, p = len(chosen), len(pos)
        stacked = stacked.view(k, p, batch, p).diagonal(dim1=1, dim2=3)  # (k, B, P)
    return Ablation(clean=clean.cpu(), ablated=stacked.permute(1, 2, 0).cpu())
