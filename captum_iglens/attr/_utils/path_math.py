r"""
The path maths shared by the estimators and the lens, evaluated on captured
residual-stream states.

Every function takes ``points`` of shape ``(N, K, d)``: for each of ``N`` rows (a
sequence position), the ``K`` path points ``h_base, h_{L_1}, ..., h_{L_k}`` (or a
part of them) in the model's dtype, and ``targets``, a
:class:`~captum_iglens.readout.scores.TokenScore` of ``N`` rows (the score ``f`` of
each row: one target's probability, a token set's, or a contrastive difference).
``layers`` (broadcastable to ``(N, K)``, long) is the readout index each
column is read with (a hidden-state index, see
:class:`~captum_iglens.readout.interface.PathReadout`; the model's own readout
ignores it), and the interpolation points of a segment are read with the index
of the point at its end: a learned readout passes one index per segment (both
ends equal, :mod:`captum_iglens.attr.lens_change`). The readout is
pointwise over rows, so rows can be grouped freely; ``chunk_rows`` bounds how
many rows go through the readout at once. Results are in :func:`work_dtype` of
the points' dtype: float64 for a float64 model, float32 otherwise.
"""

from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import (
    FinalDistribution,
    TokenScore,
    Views,
    log_softmax_in_place,
)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attributions are computed and returned in: the wider of the
    model's dtype and float32."""
    return torch.promote_types(dtype, torch.float32)


def chunks(total: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` of ``range(total)``."""
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def row_groups(n_rows: int, points_per_row: int, chunk_rows: int) -> Iterator[slice]:
    """Groups of rows whose interpolation points fill about one readout chunk."""
    return chunks(n_rows, max(1, chunk_rows // points_per_row))


def layer_grid(layers: Optional[Tensor], points: Tensor) -> Tensor:
    r"""
    The path point of every entry of ``points`` ``(N, K, d)``.

    Args:
        layers (Tensor, optional): Broadcastable to ``(N, K)``. Default: None,
                    ``0, 1, ..., K - 1`` for every row (a path from its start).

    Returns:
        *Tensor* ``(N, K)``, long, on the points' device.
    """
    n, k = points.shape[:2]
    if layers is None:
        layers = torch.arange(k, device=points.device)
    return layers.to(device=points.device, dtype=torch.long).expand(n, k)


def segment_layers(layers: Tensor, steps: int, with_end: bool) -> Tensor:
    r"""
    The path point of each interpolation row of the segments of ``layers``
    ``(g, K)``: ``steps`` rows per segment, read as the segment's end, and with
    ``with_end`` one more row, the last point.

    Returns:
        *Tensor* ``(g · ((K - 1) · steps + with_end),)``.
    """
    rows = layers[:, 1:].repeat_interleave(steps, dim=1)
    if with_end:
        rows = torch.cat([rows, layers[:, -1:]], dim=1)
    return rows.flatten()


@torch.no_grad()
def path_values(
    readout: PathReadout,
    points: Tensor,
    targets: TokenScore,
    chunk_rows: int,
    top_k: int = 0,
    final_logits: Optional[Callable[[slice], Tensor]] = None,
    layers: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Views]]:
    r"""
    ``f`` at every path point, with no gradient, and with ``top_k >= 1`` the
    views of every point's distribution, kept from the same log-softmax.

    ``final_logits(rows)`` returns the model's own logits ``(n, V)`` of the rows
    ``rows`` of ``points`` (needed with ``top_k``, for the KL divergence from the
    model's final distribution, read once per position of a chunk). One
    ``(n, V)`` buffer, reused by every chunk, takes the log-softmax, and the
    chunk's logits, no longer needed, the ``exp`` of the entropy (see
    :func:`log_softmax_in_place`); views also keep the final distributions of the
    chunk's positions; chunks are shortened to keep these within the readout's
    budget.

    Args:
        layers (Tensor, optional): The path point of each column, see
                    :func:`layer_grid`. Default: None

    Returns:
        2-element tuple of *Tensor* ``(N, K)`` (in :func:`work_dtype`), the score of
        ``softmax(readout(points, layers))``, and *Views* of leading shape
        ``(N, K)`` (None when ``top_k`` is 0).
    """
    n, k, d = points.shape
    flat = points.reshape(n * k, d)
    flat_layers = layer_grid(layers, points).reshape(n * k)
    flat_targets = targets.repeat_interleave(k)
    size = min(chunk_rows, _rows_with_views(readout, k)) if top_k else chunk_rows
    values, views = [], []
    scratch: Optional[Tensor] = None  # the log-softmax, one buffer for all chunks
    for rows in chunks(n * k, size):
        for sub in chunks(rows.stop - rows.start, readout.rows_per_chunk()):
            part = slice(rows.start + sub.start, rows.start + sub.stop)
            raw = readout(flat[part], flat_layers[part])
            logits = raw.to(work_dtype(raw.dtype))
            # A half-precision readout's logits and their float32 copy coexist:
            # then the log-softmax gets fresh memory, so as not to exceed the budget.
            if logits.dtype == raw.dtype and scratch is None:
                scratch = torch.empty_like(logits)  # the first chunk is the largest
            del raw
            buffer = None if scratch is None else scratch[: len(logits)]
            log_probs, entropy = log_softmax_in_place(logits, buffer, bool(top_k))
            score = flat_targets[part]
            values.append(score.of(log_probs))
            if top_k:
                final = _final_distribution(final_logits, part, k)
                views.append(Views.of(log_probs, score, top_k, final, entropy))
                del final
            del logits, log_probs
    if not values:
        empty = points.new_zeros((n, k), dtype=work_dtype(points.dtype))
        return empty, None
    found = torch.cat(values).reshape(n, k)
    return found, Views.cat(views).reshape(n, k) if views else None


def _rows_with_views(readout: PathReadout, k: int) -> int:
    """Rows per chunk when views are kept: the log-softmax and one ``(n, V)``
    temporary (8 bytes a logit), and up to three ``(n / k + 1, V)`` float32
    copies of the final distributions (12 bytes a logit), within the budget."""
    bytes_per_logit = readout.max_chunk_bytes / readout.vocab_size
    return max(1, int((bytes_per_logit - 12) / (8 + 12 / k)))


def _final_distribution(
    final_logits: Optional[Callable[[slice], Tensor]], rows: slice, k: int
) -> FinalDistribution:
    """The model's final distributions of the positions of flat rows ``rows``
    (``k`` points per position), each read once."""
    if final_logits is None:
        raise ValueError("final_logits: needed for views (top_k >= 1)")
    first, last = rows.start // k, (rows.stop - 1) // k + 1
    log_probs = torch.log_softmax(final_logits(slice(first, last)).float(), -1)
    index = torch.arange(rows.start, rows.stop, device=log_probs.device) // k
    return FinalDistribution.of(log_probs, index - first)


def values_and_gradients(
    readout: PathReadout,
    hidden: Tensor,
    targets: TokenScore,
    layers: Tensor,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]],
) -> Tuple[Tensor, Tensor]:
    """``f`` and its gradient at each row of ``hidden`` (M, d), read as path
    points ``layers`` (M,), a backward a chunk of at most ``chunk_rows`` rows and
    what the readout's budget allows."""
    values, gradients = [], []
    size = min(chunk_rows, readout.rows_per_chunk(backward=True))
    with torch.enable_grad():
        for rows in chunks(hidden.shape[0], size):
            x = hidden[rows].detach().requires_grad_(True)
            prob = readout.score(x, targets[rows], layers[rows])
            (grad,) = torch.autograd.grad(
                prob, x, grad_outputs=torch.ones_like(prob), **(grad_kwargs or {})
            )
            values.append(prob.detach())
            gradients.append(grad.to(work_dtype(grad.dtype)))
    return torch.cat(values), torch.cat(gradients)


def split_weights(grads: Tensor, direction: Tensor) -> Tensor:
    """``g_i² / ‖g‖²``; ``Δ_i² / ‖Δ‖²`` where ``g = 0``; zeros where both vanish."""
    grad_sq, dir_sq = grads.square(), direction.square().expand_as(grads)
    grad_norm = grad_sq.sum(-1, keepdim=True)
    dir_norm = dir_sq.sum(-1, keepdim=True)
    by_grad = grad_sq / grad_norm.clamp_min(torch.finfo(grads.dtype).tiny)
    by_dir = dir_sq / dir_norm.clamp_min(torch.finfo(grads.dtype).tiny)
    return torch.where(grad_norm > 0, by_grad, by_dir)


def segment_pairs(stream: Tensor, which: Sequence[int]) -> Tuple[Tensor, Tensor]:
    """Segments ``which`` of ``stream (N, K, d)`` as rows ``(N·len(which), 2, d)``,
    and the path points of their ends, ``(N·len(which), 2)``."""
    index = torch.tensor(list(which), device=stream.device)
    pairs = torch.stack([stream[:, index], stream[:, index + 1]], 2).flatten(0, 1)
    return pairs, torch.stack([index, index + 1], -1).repeat(stream.shape[0], 1)


def segment_ends(values: Tensor, which: Sequence[int]) -> Tensor:
    r"""
    ``f`` at both ends of the segments ``which``: from ``values`` ``(N, K)``
    at the path points, or ``(N, K - 1, 2)`` per segment (a learned readout
    per layer reads each segment with its own readout).

    Returns:
        *Tensor* ``(N, len(which), 2)``.
    """
    ends = torch.tensor(list(which), device=values.device)
    if values.dim() == 3:
        return values[:, ends]
    return torch.stack([values[:, ends], values[:, ends + 1]], -1)


def interleave(plain: Tensor, attn: Tensor) -> Tensor:
    r"""
    Columns in path order: ``plain[:, 0]``, then per block ``attn[:, j]`` (its
    ``C`` columns) and ``plain[:, j + 1]``.

    Args:
        plain (Tensor): ``(N, k + 1, ...)``: ``"input"`` and the MLPs.
        attn (Tensor): ``(N, k, C, ...)``: the attention components.

    Returns:
        *Tensor* ``(N, 1 + k (C + 1), ...)``.
    """
    blocks = torch.cat([attn, plain[:, 1:].unsqueeze(2)], dim=2).flatten(1, 2)
    return torch.cat([plain[:, :1], blocks], dim=1)


def residual_shares(
    first_order: Tensor,
    residual: Tensor,
    norms: Tuple[Tensor, Tensor, Optional[Tensor]],
    parents: Optional[Tensor],
) -> Tensor:
    r"""
    Each step's change split among the components: ``t_{s,c}`` plus a share of
    the residual ``r_s`` in proportion to ``|t_{s,c}|`` (to ``‖u_c‖²`` where
    every ``t_{s,c}`` is zero); with ``parents``, first among the groups, then
    within each group.

    Args:
        first_order (Tensor): ``(g, n, C)``: ``t_{s,c}``.
        residual (Tensor): ``(g, n)``: ``r_s``.
        norms (tuple): ``‖u_c‖`` and ``‖u_c‖²`` ``(g, C)``, and each group's
                    summed component's norm ``(g, G)`` with ``parents``
                    (:func:`~captum_iglens.attr._utils.component_reads.component_norms`).
        parents (Tensor, optional): ``(C,)`` long.

    Returns:
        *Tensor* ``(g, n, C)``, summing over ``C`` to ``Σ_c t_{s,c} + r_s``.
    """
    norm, square, group_norm = norms
    if parents is None or group_norm is None:
        weights = split_weights(first_order.abs().sqrt(), norm.unsqueeze(1))
        return first_order + residual.unsqueeze(-1) * weights
    n_groups = int(parents.max()) + 1
    group_first = first_order.new_zeros(*first_order.shape[:2], n_groups)
    group_first.index_add_(2, parents, first_order)
    group_rest = (
        residual_shares(group_first, residual, (group_norm, group_norm, None), None)
        - group_first
    )
    within = _within_groups(first_order.abs(), square.unsqueeze(1), parents)
    return first_order + group_rest[..., parents] * within


def _within_groups(amount: Tensor, fallback: Tensor, parents: Tensor) -> Tensor:
    """``amount`` normalised within each group (``fallback`` where a group's
    ``amount`` is all zero, zeros where both are)."""
    n_groups = int(parents.max()) + 1

    def normalised(x: Tensor) -> Tuple[Tensor, Tensor]:
        total = x.new_zeros(*x.shape[:-1], n_groups).index_add_(-1, parents, x)
        total = total[..., parents]
        return x / total.clamp_min(torch.finfo(x.dtype).tiny), total > 0

    by_amount, has_amount = normalised(amount)
    by_fallback, has_fallback = normalised(fallback.expand_as(amount).contiguous())
    zeros = torch.zeros_like(amount)
    by_fallback = torch.where(has_fallback, by_fallback, zeros)
    return torch.where(has_amount, by_amount, by_fallback)
