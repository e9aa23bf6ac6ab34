r"""
The path integrals of IG-Lens, evaluated on captured residual-stream states.

Every function takes ``points`` of shape ``(N, K, d)``: for each of ``N`` rows (a
sequence position), the ``K = k + 1`` path points ``h_base, h_{L_1}, ..., h_{L_k}``
in the model's dtype, and ``targets``, a
:class:`~captum_iglens.readout.scores.TokenScore` of ``N`` rows (the score ``f`` of
each row: one target's probability, a token set's, or a contrastive difference).
The readout is pointwise over rows, so rows can be grouped freely; ``chunk_rows``
bounds how many rows go through the readout at once. Results are in
:func:`work_dtype` of the points' dtype: float64 for a float64 model, float32
otherwise.
"""

from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from captum.attr._utils.approximation_methods import (
    SUPPORTED_METHODS,
    approximation_parameters,
)
from torch import Tensor

from captum_iglens.readout.readout import Readout
from captum_iglens.readout.scores import FinalDistribution, TokenScore, Views

#: Estimators accepted by ``method=``: ours first, then Captum's rules.
ESTIMATORS: Tuple[str, ...] = ("prediction_aware", *SUPPORTED_METHODS)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attributions are computed and returned in: the wider of the
    model's dtype and float32."""
    return torch.promote_types(dtype, torch.float32)


def _chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def path_values(
    readout: Readout,
    points: Tensor,
    targets: TokenScore,
    chunk_rows: int,
    top_k: int = 0,
    final_logits: Optional[Callable[[slice], Tensor]] = None,
) -> Tuple[Tensor, Optional[Views]]:
    r"""
    ``f`` at every path point, with no gradient, and with ``top_k >= 1`` the
    views of every point's distribution, kept from the same log-softmax.

    ``final_logits(rows)`` returns the model's own logits ``(n, V)`` of the rows
    ``rows`` of ``points`` (needed with ``top_k``, for the KL divergence from the
    model's final distribution, read once per position of a chunk). Views keep
    one ``(n, V)`` temporary beside the chunk's log-softmax (where its logits
    were) and the final distributions of the chunk's positions; chunks are
    shortened to keep these within the readout's budget.

    Returns:
        2-element tuple of *Tensor* ``(N, K)`` (in :func:`work_dtype`), the score of
        ``softmax(readout(points))``, and *Views* of leading shape ``(N, K)``
        (None when ``top_k`` is 0).
    """
    n, k, d = points.shape
    flat = points.reshape(n * k, d)
    flat_targets = targets.repeat_interleave(k)
    size = min(chunk_rows, _rows_with_views(readout, k)) if top_k else chunk_rows
    values, views = [], []
    for rows in _chunks(n * k, size):
        for sub in _chunks(rows.stop - rows.start, readout.rows_per_chunk()):
            part = slice(rows.start + sub.start, rows.start + sub.stop)
            logits = readout(flat[part])
            logits = logits.to(work_dtype(logits.dtype))
            log_probs = torch.log_softmax(logits, dim=-1)
            score = flat_targets[part]
            values.append(score.of(log_probs))
            if top_k:  # the logits are dead: the views' exp is written over them
                final = _final_distribution(final_logits, part, k)
                views.append(Views.of(log_probs, score, top_k, final, logits))
                del final
            del logits, log_probs
    if not values:
        empty = points.new_zeros((n, k), dtype=work_dtype(points.dtype))
        return empty, None
    found = torch.cat(values).reshape(n, k)
    return found, Views.cat(views).reshape(n, k) if views else None


def _rows_with_views(readout: Readout, k: int) -> int:
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


def _values_and_gradients(
    readout: Readout,
    hidden: Tensor,
    targets: TokenScore,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]],
) -> Tuple[Tensor, Tensor]:
    """``f_y`` and its gradient at each row of ``hidden`` (M, d), a backward a
    chunk of at most ``chunk_rows`` rows and what the readout's budget allows."""
    values, gradients = [], []
    size = min(chunk_rows, readout.rows_per_chunk(backward=True))
    with torch.enable_grad():
        for rows in _chunks(hidden.shape[0], size):
            x = hidden[rows].detach().requires_grad_(True)
            prob = readout.score(x, targets[rows])
            (grad,) = torch.autograd.grad(
                prob, x, grad_outputs=torch.ones_like(prob), **(grad_kwargs or {})
            )
            values.append(prob.detach())
            gradients.append(grad.to(work_dtype(grad.dtype)))
    return torch.cat(values), torch.cat(gradients)


def _row_groups(n_rows: int, points_per_row: int, chunk_rows: int) -> Iterator[slice]:
    """Groups of rows whose interpolation points fill about one readout chunk."""
    return _chunks(n_rows, max(1, chunk_rows // points_per_row))


def prediction_aware_attributions(
    readout: Readout,
    points: Tensor,
    targets: TokenScore,
    final_values: Tensor,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
) -> Tensor:
    r"""
    Per-dimension prediction-aware attributions (the IDGI split).

    Each segment is cut into ``n_steps`` equal steps. Step ``s`` is credited its
    observed change ``f(p_s) - f(p_{s-1})``, split across dimensions in proportion
    to ``g_i^2`` with ``g`` the gradient of ``f`` at the step's start. Where
    ``g = 0`` the split follows ``Δ_i^2`` (the segment's direction), and where the
    segment is empty too, the step has no change to split. Every step's shares sum
    to its change, so each segment sums to ``f(end) - f(start)`` exactly.

    ``final_values`` ``(N,)`` is ``f`` at the last path point as the model itself
    computed it, used in place of the readout's evaluation of that point.

    Returns:
        *Tensor* of shape ``(N, k, d)``.
    """
    n, k_plus_1, d = points.shape
    k = k_plus_1 - 1
    work = work_dtype(points.dtype)
    fractions = torch.arange(n_steps, device=points.device, dtype=work)
    fractions = (fractions / n_steps).view(1, 1, n_steps, 1)
    out = torch.empty(n, k, d, device=points.device, dtype=work)
    for rows in _row_groups(n, k * n_steps + 1, chunk_rows):
        group = points[rows].to(work)
        start, delta = group[:, :-1], group[:, 1:] - group[:, :-1]
        grid = start.unsqueeze(2) + fractions * delta.unsqueeze(2)  # (g, k, m, d)
        flat = torch.cat([grid.flatten(1, 2), group[:, -1:]], dim=1)  # (g, km+1, d)
        flat_targets = targets[rows].repeat_interleave(k * n_steps + 1)
        values, grads = _values_and_gradients(
            readout,
            flat.flatten(0, 1).to(points.dtype),
            flat_targets,
            chunk_rows,
            grad_kwargs,
        )
        g_rows = group.shape[0]
        values = values.view(g_rows, -1)
        values[:, -1] = final_values[rows]
        change = values.diff(dim=1).view(g_rows, k, n_steps, 1)
        grads = grads.view(g_rows, -1, d)[:, :-1].view(g_rows, k, n_steps, d)
        shares = _split_weights(grads, delta.unsqueeze(2))
        out[rows] = (shares * change).sum(dim=2)
    return out


def _split_weights(grads: Tensor, direction: Tensor) -> Tensor:
    """``g_i² / ‖g‖²``; ``Δ_i² / ‖Δ‖²`` where ``g = 0``; zeros where both vanish."""
    grad_sq, dir_sq = grads.square(), direction.square().expand_as(grads)
    grad_norm = grad_sq.sum(-1, keepdim=True)
    dir_norm = dir_sq.sum(-1, keepdim=True)
    by_grad = grad_sq / grad_norm.clamp_min(torch.finfo(grads.dtype).tiny)
    by_dir = dir_sq / dir_norm.clamp_min(torch.finfo(grads.dtype).tiny)
    return torch.where(grad_norm > 0, by_grad, by_dir)


def gradient_attributions(
    readout: Readout,
    points: Tensor,
    targets: TokenScore,
    n_steps: int,
    method: str,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
    multiply_by_inputs: bool = True,
) -> Tensor:
    r"""
    Per-dimension Integrated Gradients of every segment with one of Captum's
    approximation rules: ``Δ_i · Σ_s w_s ∂f/∂h_i(start + a_s Δ)``, with Captum's own
    step sizes ``w_s`` and alphas ``a_s``. With ``multiply_by_inputs=False``, the
    segment's path-averaged gradient ``Σ_s w_s ∂f/∂h_i(start + a_s Δ)`` alone.

    Returns:
        *Tensor* of shape ``(N, k, d)``, in :func:`work_dtype` of the points.
    """
    averaged = integrated_gradients(
        readout, points, targets, n_steps, method, chunk_rows, grad_kwargs
    )
    if not multiply_by_inputs:
        return averaged
    work = averaged.dtype
    return (points[:, 1:].to(work) - points[:, :-1].to(work)) * averaged


def integrated_gradients(
    readout: Readout,
    points: Tensor,
    targets: TokenScore,
    n_steps: int,
    method: str,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
) -> Tensor:
    r"""
    The weighted gradient sum ``Σ_s w_s ∇f(start + a_s Δ)`` of every segment, with
    one of Captum's rules: a segment's credit for any displacement ``u`` along it
    is ``u · Σ_s w_s ∇f(a_s)``.

    Returns:
        *Tensor* of shape ``(N, k, d)``, in :func:`work_dtype` of the points.
    """
    step_sizes_func, alphas_func = approximation_parameters(method)
    n, k_plus_1, d = points.shape
    k = k_plus_1 - 1
    work = work_dtype(points.dtype)
    alphas = torch.tensor(alphas_func(n_steps), device=points.device, dtype=work)
    weights = torch.tensor(step_sizes_func(n_steps), device=points.device, dtype=work)
    alphas, weights = alphas.view(1, 1, -1, 1), weights.view(1, 1, -1, 1)
    out = torch.empty(n, k, d, device=points.device, dtype=work)
    for rows in _row_groups(n, k * n_steps, chunk_rows):
        group = points[rows].to(work)
        start, delta = group[:, :-1], group[:, 1:] - group[:, :-1]
        grid = start.unsqueeze(2) + alphas * delta.unsqueeze(2)  # (g, k, m, d)
        _, grads = _values_and_gradients(
            readout,
            grid.flatten(0, 2).to(points.dtype),
            targets[rows].repeat_interleave(k * n_steps),
            chunk_rows,
            grad_kwargs,
        )
        out[rows] = (weights * grads.view_as(grid)).sum(dim=2)
    return out


def prediction_aware_components(
    readout: Readout,
    ends: Tensor,
    components: Tensor,
    targets: TokenScore,
    end_values: Tensor,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
) -> Tuple[Tensor, Tensor]:
    r"""
    Prediction-aware credits of the components of one straight segment per row.

    The segment from ``a = ends[:, 0]`` to ``b = ends[:, 1]`` is cut into
    ``n_steps`` equal steps, with ``b - a = Σ_c u_c`` split into components
    ``u_c``. Step ``s`` is credited its observed change ``c_s = f(p_{s+1}) -
    f(p_s)``; component ``c`` gets its first-order (trapezoid) contribution
    ``t_{s,c} = (g_s + g_{s+1}) · u_c / (2 n)`` plus a share of the step's residual
    ``r_s = c_s - Σ_c t_{s,c}`` in proportion to ``|t_{s,c}|`` (to ``‖u_c‖²``
    where every ``t_{s,c}`` is zero). Where the contributions agree in sign this
    is the split of ``c_s`` in proportion to ``t_{s,c}``; where they cancel, no
    share exceeds ``|t_{s,c}| + |r_s|``. The shares of a step sum to ``c_s``, so a
    row's credits sum to ``f(b) - f(a)``; as ``n_steps`` grows they converge to
    ``∫ ∇f · u_c``, since ``r_s = O(n^{-3})``.

    Args:

        ends (Tensor): ``(M, 2, d)``: each segment's start and end.
        components (Tensor): ``(M, C, d)`` float32: the components ``u_c``.
        targets (TokenScore): ``M`` rows.
        end_values (Tensor): ``(M, 2)``: ``f`` at the start and the end, used in
                    place of the readout's evaluations there, so that the credits
                    telescope with the other segments' values.

    Returns:
        2-element tuple of **credits** ``(M, C)`` and **mean_gradient** ``(M, d)``
        (the trapezoid average of ``∇f`` over the steps), float32.
    """
    m, _, d = ends.shape
    fractions = torch.arange(n_steps + 1, device=ends.device, dtype=torch.float32)
    fractions = (fractions / n_steps).view(1, -1, 1)
    credits = torch.empty(m, components.shape[1], device=ends.device)
    mean_gradient = torch.empty(m, d, device=ends.device)
    for rows in _row_groups(m, n_steps + 1, chunk_rows):
        start = ends[rows, 0].float().unsqueeze(1)
        grid = start + fractions * (ends[rows, 1].float().unsqueeze(1) - start)
        values, grads = _values_and_gradients(
            readout,
            grid.flatten(0, 1).to(ends.dtype),
            targets[rows].repeat_interleave(n_steps + 1),
            chunk_rows,
            grad_kwargs,
        )
        values = values.view(-1, n_steps + 1)
        values[:, 0], values[:, -1] = end_values[rows, 0], end_values[rows, 1]
        grads = grads.view(-1, n_steps + 1, d)
        u = components[rows]
        along = torch.einsum("gsd,gcd->gsc", grads, u)  # (g, n + 1, C)
        first_order = (along[:, :-1] + along[:, 1:]) / (2 * n_steps)
        residual = values.diff(dim=1) - first_order.sum(-1)  # (g, n)
        weights = _split_weights(
            first_order.abs().sqrt(), u.norm(dim=-1).unsqueeze(1)
        )
        credits[rows] = (first_order + residual.unsqueeze(-1) * weights).sum(1)
        mean_gradient[rows] = (grads[:, :-1] + grads[:, 1:]).sum(1) / (2 * n_steps)
    return credits, mean_gradient
