r"""The ``"prediction_aware"`` estimator: each step's observed change of ``f``,
split across dimensions (or components) by the gradient, so that the credits
add up exactly at any ``n_steps``."""

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.attr._utils.component_reads import (
    component_dots,
    component_norms,
)
from captum_iglens.attr._utils.path_math import (
    layer_grid,
    residual_shares,
    row_groups,
    segment_layers,
    split_weights,
    values_and_gradients,
    work_dtype,
)
from captum_iglens.attr.estimators.base import Estimator, Integration, Segments
from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import TokenScore


#: Bytes the split of one step among the components holds per (step,
#: component) entry: the float32 products with the gradients, and the float64
#: first-order terms, shares and their normalised weights.
_SPLIT_ENTRY_BYTES = 4 + 6 * 8


class PredictionAware(Estimator):
    r"""
    Prediction-aware Integrated Gradients (the split of Integrated Decision
    Gradients, https://arxiv.org/abs/2305.20052): exact at any ``n_steps``, its
    map needs no gradient, and it has no form without the displacement.
    """

    name = "prediction_aware"
    exact = True
    gradient_free_map = True
    supports_unmultiplied = False

    def attributions(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""See :func:`prediction_aware_attributions` (``multiply_by_inputs``
        must be True)."""
        self.check_multiply_by_inputs(integration.multiply_by_inputs)
        return prediction_aware_attributions(
            integration.readout,
            points,
            targets,
            end_values,
            integration.n_steps,
            integration.chunk_rows,
            integration.grad_kwargs,
            layers,
        )

    def credits(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""The observed changes ``f(p_j) - f(p_{j-1})``: no readout, no
        gradient (the per-dimension split of a segment sums to its change)."""
        return values.diff(dim=-1)

    def components(self, integration: Integration, segments: Segments) -> Tensor:
        r"""
        :func:`prediction_aware_components`; per dimension, split by
        :meth:`~captum_iglens.attr.estimators.base.Segments.per_dimension` with
        the trapezoid mean gradient.
        """
        credits, mean_gradient = prediction_aware_components(
            integration.readout,
            segments,
            integration.n_steps,
            integration.chunk_rows,
            integration.grad_kwargs,
        )
        if not integration.per_dimension:
            return credits
        return segments.per_dimension(credits, mean_gradient)


def prediction_aware_attributions(
    readout: PathReadout,
    points: Tensor,
    targets: TokenScore,
    final_values: Tensor,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
    layers: Optional[Tensor] = None,
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
    path_layers = layer_grid(layers, points)
    fractions = torch.arange(n_steps, device=points.device, dtype=work)
    fractions = (fractions / n_steps).view(1, 1, n_steps, 1)
    out = torch.empty(n, k, d, device=points.device, dtype=work)
    for rows in row_groups(n, k * n_steps + 1, chunk_rows):
        group = points[rows].to(work)
        start, delta = group[:, :-1], group[:, 1:] - group[:, :-1]
        grid = start.unsqueeze(2) + fractions * delta.unsqueeze(2)  # (g, k, m, d)
        flat = torch.cat([grid.flatten(1, 2), group[:, -1:]], dim=1)  # (g, km+1, d)
        flat_targets = targets[rows].repeat_interleave(k * n_steps + 1)
        values, grads = values_and_gradients(
            readout,
            flat.flatten(0, 1).to(points.dtype),
            flat_targets,
            segment_layers(path_layers[rows], n_steps, with_end=True),
            chunk_rows,
            grad_kwargs,
        )
        g_rows = group.shape[0]
        values = values.view(g_rows, -1)
        values[:, -1] = final_values[rows]
        change = values.diff(dim=1).view(g_rows, k, n_steps, 1)
        grads = grads.view(g_rows, -1, d)[:, :-1].view(g_rows, k, n_steps, d)
        shares = split_weights(grads, delta.unsqueeze(2))
        out[rows] = (shares * change).sum(dim=2)
    return out


def prediction_aware_components(
    readout: PathReadout,
    segments: Segments,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
) -> Tuple[Tensor, Tensor]:
    r"""
    Prediction-aware credits of the components of one straight segment per row.

    The segment from ``a = ends[:, 0]`` to ``b = ends[:, 1]`` is cut into
    ``n_steps`` steps (equal ones unless ``fractions`` places them), with
    ``b - a = Σ_c u_c`` split into components ``u_c``. Step ``s`` is credited
    its observed change ``c_s = f(p_{s+1}) - f(p_s)``; component ``c`` gets
    its first-order (trapezoid) contribution
    ``t_{s,c} = (g_s + g_{s+1}) · u_c · w_s / 2`` (``w_s`` the step's
    width, ``1 / n`` for equal steps) plus a share of the step's residual
    ``r_s = c_s - Σ_c t_{s,c}`` in proportion to ``|t_{s,c}|`` (to ``‖u_c‖²``
    where every ``t_{s,c}`` is zero). Where the contributions agree in sign this
    is the split of ``c_s`` in proportion to ``t_{s,c}``; where they cancel, no
    share exceeds ``|t_{s,c}| + |r_s|``. The shares of a step sum to ``c_s``, so a
    row's credits sum to ``f(b) - f(a)``, whatever the steps; as ``n_steps``
    grows they converge to ``∫ ∇f · u_c``, since ``r_s = O(n^{-3})``. With
    ``parents``, each step is split twice by the same rule: among the groups
    (each group's first-order term the sum of its members'), then each group's
    share among its members, so that a group's credits are those of its summed
    component and its members' credits add up to them.

    Args:

        readout (PathReadout): What reads the points.
        segments (Segments): ``M`` segments and their components.
        n_steps (int): Steps per segment.
        chunk_rows (int): The most rows read at once.
        grad_kwargs (dict, optional): Passed to ``torch.autograd.grad``.
                    Default: None

    Returns:
        2-element tuple of **credits** ``(M, C)`` and **mean_gradient** ``(M, d)``
        (the trapezoid average of ``∇f`` over the steps), float32.
    """
    m, _, d = segments.ends.shape
    c = segments.components.shape[1]
    device = segments.ends.device
    credits = torch.empty(m, c, device=device)
    mean_gradient = torch.empty(m, d, device=device)
    # a group's split holds a few (g, n + 1, C) arrays: within the budget too
    split_rows = readout.max_chunk_bytes // ((n_steps + 1) * c * _SPLIT_ENTRY_BYTES)
    for rows in row_groups(m, n_steps + 1, min(chunk_rows, split_rows * (n_steps + 1))):
        # one call per group: its arrays are freed before the next group's readout
        credits[rows], mean_gradient[rows] = _group_components(
            readout, segments, rows, n_steps, chunk_rows, grad_kwargs
        )
    return credits, mean_gradient


def _group_components(
    readout: PathReadout,
    segments: Segments,
    rows: slice,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]],
) -> Tuple[Tensor, Tensor]:
    """:func:`prediction_aware_components` of the rows ``rows`` of
    ``segments``."""
    ends, components = segments.ends[rows], segments.components
    layers = layer_grid(segments.layers, segments.ends)[rows]
    if segments.fractions is None:
        steps = torch.arange(n_steps + 1, device=ends.device, dtype=torch.float32)
        steps, widths = (steps / n_steps).view(1, -1), None
    else:
        steps = segments.fractions[rows].float()
        widths = steps.diff(dim=1).unsqueeze(-1)
    start = ends[:, 0].float().unsqueeze(1)
    grid = start + steps.unsqueeze(-1) * (ends[:, 1].float().unsqueeze(1) - start)
    values, grads = values_and_gradients(
        readout,
        grid.flatten(0, 1).to(ends.dtype),
        segments.targets[rows].repeat_interleave(n_steps + 1),
        segment_layers(layers, n_steps + 1, with_end=False),
        chunk_rows,
        grad_kwargs,
    )
    end_values = segments.end_values[rows]
    values = values.view(-1, n_steps + 1)
    values[:, 0], values[:, -1] = end_values[:, 0], end_values[:, 1]
    grads = grads.view(-1, n_steps + 1, ends.shape[-1]).float()  # as the components
    along = component_dots(components, rows, grads)  # (g, n + 1, C)
    # the split in float64: each step's shares add up to its change, and the
    # changes to f(b) - f(a), to float32 rounding of the credits alone
    first_order = _trapezoid(along, widths, n_steps).double()
    del along
    residual = values.double().diff(dim=1) - first_order.sum(-1)  # (g, n)
    parents = segments.parents
    norm, square, group = component_norms(components, rows, parents)
    norms = (
        norm.double(),
        square.double(),
        None if group is None else group.double(),
    )
    credits = residual_shares(first_order, residual, norms, parents).sum(1)
    mean_gradient = (
        (grads[:, :-1] + grads[:, 1:]).sum(1) / (2 * n_steps)
        if widths is None
        else _trapezoid(grads, widths, n_steps).sum(1)
    )
    return credits, mean_gradient


def _trapezoid(at_points: Tensor, widths: Optional[Tensor], n_steps: int) -> Tensor:
    """Each step's trapezoid ``(x_s + x_{s+1}) w_s / 2`` of values at the step
    ends ``(g, n + 1, ...)``: ``(g, n, ...)``; ``widths`` ``(g, n, 1)``, or None
    for equal steps."""
    pairs = at_points[:, :-1] + at_points[:, 1:]
    return pairs / (2 * n_steps) if widths is None else pairs * (widths / 2)


#: The estimator (an entry of :data:`~captum_iglens.attr.estimators.ESTIMATORS`).
PREDICTION_AWARE = PredictionAware()
