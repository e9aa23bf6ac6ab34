r"""
The gradient through each head's query, key and value reads alone, carried
from the attention's inputs back to the block's input (the stream the heads
read), per query head.

Where the attention module has separate ``q_proj``, ``k_proj`` and ``v_proj``
linear projections (Llama, Qwen, Mistral, Gemma families), the gradient is
carried to the three projections' outputs by one vector-Jacobian product
batched over the query heads of a key-value group, then through each head's
own rows of the projection, then through the block's input norm, batched over
the heads: the projections' backward is paid once, not once per head.
Otherwise, one vector-Jacobian product batched over the heads goes through the
whole graph from the block's input (:func:`batched_head_reads`).
"""

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Linear, Module

#: The projections the split path reads, in the order queries, keys, values.
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def projections_of(attention: Module) -> Optional[List[Linear]]:
    """The attention's query, key and value projections, or None where it has
    no separate ``nn.Linear`` ones."""
    found = [getattr(attention, name, None) for name in PROJECTIONS]
    if all(isinstance(p, Linear) for p in found):
        return found  # type: ignore[return-value]  # checked above
    return None


def _owner(
    n_heads: int, n_read: int, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """``(H, H_read)``: one-hot, the key-value group each query head reads."""
    return torch.nn.functional.one_hot(
        torch.arange(n_heads, device=device) // (n_heads // n_read), n_read
    ).to(dtype)


def batched_head_reads(
    reads: List[Tensor],
    h_in: Tensor,
    grads: Tuple[Tensor, ...],
    separate: bool,
    first: int = 0,
) -> Tensor:
    r"""
    Per query head ``h`` (and read kind, if ``separate``), the gradient with
    respect to the block's input ``h_in`` through head ``h``'s slice of its
    queries, keys and values alone: one batched vector-Jacobian product.

    Args:
        reads (list[Tensor]): The queries ``(P, H, T, e)`` and the grouped
                    keys and values ``(P, H_kv, T, e)``, as the attention got
                    them.
        h_in (Tensor): ``(P, T, d)``: the block's input.
        grads (tuple[Tensor]): ``(B, P, H, T, e)`` each: ``B`` gradients
                    (of ``m``, or of its part through one query position)
                    with respect to each query head's queries, keys and
                    values.
        separate (bool): One result per read kind (queries, keys, values).
        first (int, optional): The first position returned. Default: 0

    Returns:
        *Tensor* ``(kinds · H, B, P, T − first, d)``, kind-major (every
        head's queries, then keys, then values: the graph's receiver order).
    """
    n_heads, batch = grads[0].shape[2], grads[0].shape[0]
    kinds = len(reads) if separate else 1
    upstream = []
    for kind, (read, grad) in enumerate(zip(reads, grads)):
        owner = _owner(n_heads, read.shape[1], grad.device, grad.dtype)
        # (H, B, P, H_read, T, e): query head h's gradient in its group's slot
        per_head = (
            owner[:, None, None, :, None, None]
            * grad.permute(2, 0, 1, 3, 4)[:, :, :, None]
        )
        if separate:  # (kinds, H, B, ...): zero but at this kind
            slots = per_head.new_zeros(kinds, *per_head.shape)
            slots[kind] = per_head
            per_head = slots
        upstream.append(per_head.flatten(0, 2 if separate else 1))
    (vjp,) = torch.autograd.grad(
        reads, h_in, upstream, retain_graph=True, is_grads_batched=True
    )
    return vjp.view(n_heads * kinds, batch, *vjp.shape[1:])[..., first:, :]


def _padded(grad: Tensor, groups: int) -> Tensor:
    """``(groups · B, P, H_read, T, e)``: ``grad`` ``(B, P, H_read, n, T, e)``
    with its ``n`` heads per group moved to the front, then zeros."""
    moved = grad.permute(3, 0, 1, 2, 4, 5)
    if moved.shape[0] < groups:
        zeros = moved.new_zeros(groups - moved.shape[0], *moved.shape[1:])
        moved = torch.cat([moved, zeros])
    return moved.flatten(0, 1)


def split_head_reads(
    reads: List[Tensor],
    seen: Dict[str, Tensor],
    projections: List[Linear],
    grads: Tuple[Tensor, ...],
    separate: bool,
    first: int = 0,
) -> Tensor:
    r"""
    :func:`batched_head_reads` through each head's own rows of the
    projections, at the positions from ``first`` on (the input norm acts on
    each position alone).

    Args:
        reads (list[Tensor]): As for :func:`batched_head_reads`.
        seen (dict[str, Tensor]): ``"in"``, the block's input ``(P, T, d)``;
                    ``"x"``, the attention's input (after the block's input
                    norm); ``"q_proj"``, ``"k_proj"``, ``"v_proj"``, the
                    projections' outputs ``(P, T, H_read · e)``.
        projections (list[Linear]): The query, key and value projections.
        grads (tuple[Tensor]): As for :func:`batched_head_reads`.
        separate (bool): One result per read kind.
        first (int, optional): The first position returned. Default: 0

    Returns:
        *Tensor* ``(kinds · H, B, P, T − first, d)``, kind-major (every
        head's queries, then keys, then values: the graph's receiver order).
    """
    batch, _, n_heads = grads[0].shape[:3]
    kinds = len(reads) if separate else 1
    groups = [n_heads // read.shape[1] for read in reads]
    # (groups · B, P, H_read, T, e) per read: batch (j, b) holds query head
    # g·groups + j of group g; one batched product for the three reads, so
    # the queries' (one head per group) are padded with zeros to the keys'
    upstream = [
        _padded(grad.view(batch, p, n_read, n, t, e), max(groups))
        for grad, (p, n_read, t, e), n in zip(grads, (r.shape for r in reads), groups)
    ]
    at_outs = torch.autograd.grad(
        reads,
        [seen[name] for name in PROJECTIONS],
        upstream,
        retain_graph=True,
        is_grads_batched=True,
    )  # (groups · B, P, T, H_read · e) each
    # (kinds, H, B, P, T, d): the gradient at the attention's input per head
    upstream_x = grads[0].new_zeros(kinds, n_heads, batch, *seen["x"].shape)
    for kind, (at_out, read, n, proj) in enumerate(
        zip(at_outs, reads, groups, projections)
    ):
        p, n_read, t, e = read.shape
        at_out = at_out[: n * batch].view(n, batch, p, t, n_read, e)[:, :, :, first:]
        weight = proj.weight.view(n_read, e, -1).to(at_out.dtype)
        # query head g·groups + j, through its group's rows of the projection
        per_head = torch.einsum("jbptge,ged->gjbptd", at_out, weight)
        slot = upstream_x[kind if separate else 0, :, :, :, first:]
        slot += per_head.reshape(n_heads, *per_head.shape[2:])
    upstream_x = upstream_x.flatten(0, 2)
    (vjp,) = torch.autograd.grad(
        seen["x"], seen["in"], upstream_x, retain_graph=True, is_grads_batched=True
    )
    return vjp[:, :, first:].reshape(n_heads * kinds, batch, p, -1, vjp.shape[-1])
