r"""Captum's approximation rules (``riemann_*``, ``gausslegendre``) as IG-Lens
estimators, with Captum's own step sizes and alphas."""

from typing import Optional

import torch
from captum.attr._utils.approximation_methods import approximation_parameters
from torch import Tensor

from captum_iglens.attr._utils.component_reads import component_credits
from captum_iglens.attr._utils.path_math import (
    layer_grid,
    row_groups,
    segment_layers,
    values_and_gradients,
    work_dtype,
)
from captum_iglens.attr.estimators.base import Estimator, Integration, Segments
from captum_iglens.readout.scores import TokenScore


class CaptumRule(Estimator):
    r"""
    Integrated Gradients of every segment with one of Captum's rules:
    ``Δ_i · Σ_s w_s ∂f/∂h_i(start + a_s Δ)``, with the weights ``w_s`` and alphas
    ``a_s`` of ``approximation_parameters(rule)`` (and their discretisation
    error; Captum 0.9's trapezoid weights sum to ``1 - 1/n_steps``).

    Args:
        rule (str): A name from Captum's ``SUPPORTED_METHODS``.
    """

    exact = False
    gradient_free_map = False
    supports_unmultiplied = True

    def __init__(self, rule: str) -> None:
        approximation_parameters(rule)  # Captum refuses an unknown rule
        self.name = rule
        self.min_steps = 2 if rule.startswith("riemann") else 1

    def __repr__(self) -> str:
        return f"CaptumRule({self.name!r})"

    def attributions(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""
        Per-dimension Integrated Gradients of every segment; with
        ``multiply_by_inputs=False``, the segment's path-averaged gradient
        ``Σ_s w_s ∂f/∂h_i(start + a_s Δ)`` alone. ``end_values`` is not used.
        """
        averaged = self.integrated_gradients(integration, points, targets, layers)
        if not integration.multiply_by_inputs:
            return averaged
        work = averaged.dtype
        return (points[:, 1:].to(work) - points[:, :-1].to(work)) * averaged

    def components(self, integration: Integration, segments: Segments) -> Tensor:
        r"""``u_c · Σ_s w_s ∇f(a_s)`` along the segment (per dimension:
        ``u_{c,i} Σ_s w_s ∂_i f``); linear in the components, so ``parents``
        changes nothing, and at Captum's own alphas, so ``fractions`` is not
        read. The components are read a group of rows at a time."""
        ends, components = segments.ends, segments.components
        averaged = self.integrated_gradients(
            integration, ends, segments.targets, segments.layers
        )
        averaged = averaged[:, 0].float()
        per_dimension, chunk_rows = integration.per_dimension, integration.chunk_rows
        m, c, d = components.shape
        out = torch.empty(m, c, *([d] if per_dimension else []), device=ends.device)
        for rows in row_groups(m, c, max(chunk_rows, c)):
            if per_dimension:
                out[rows] = components[rows] * averaged[rows].unsqueeze(1)
            else:
                out[rows] = component_credits(components, rows, averaged[rows])
        return out

    def integrated_gradients(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""
        The weighted gradient sum ``Σ_s w_s ∇f(start + a_s Δ)`` of every segment:
        a segment's credit for any displacement ``u`` along it is
        ``u · Σ_s w_s ∇f(a_s)``.

        Returns:
            *Tensor* of shape ``(N, k, d)``, in the work dtype of the points.
        """
        n_steps, chunk_rows = integration.n_steps, integration.chunk_rows
        step_sizes_func, alphas_func = approximation_parameters(self.name)
        n, k_plus_1, d = points.shape
        k = k_plus_1 - 1
        work = work_dtype(points.dtype)
        path_layers = layer_grid(layers, points)
        alphas = torch.tensor(alphas_func(n_steps), device=points.device, dtype=work)
        weights = torch.tensor(
            step_sizes_func(n_steps), device=points.device, dtype=work
        )
        alphas, weights = alphas.view(1, 1, -1, 1), weights.view(1, 1, -1, 1)
        out = torch.empty(n, k, d, device=points.device, dtype=work)
        for rows in row_groups(n, k * n_steps, chunk_rows):
            group = points[rows].to(work)
            start, delta = group[:, :-1], group[:, 1:] - group[:, :-1]
            grid = start.unsqueeze(2) + alphas * delta.unsqueeze(2)  # (g, k, m, d)
            _, grads = values_and_gradients(
                integration.readout,
                grid.flatten(0, 2).to(points.dtype),
                targets[rows].repeat_interleave(k * n_steps),
                segment_layers(path_layers[rows], n_steps, with_end=False),
                chunk_rows,
                integration.grad_kwargs,
            )
            out[rows] = (weights * grads.view_as(grid)).sum(dim=2)
        return out


#: Captum's rules, an estimator each (entries of
#: :data:`~captum_iglens.attr.estimators.ESTIMATORS`).
RIEMANN_LEFT = CaptumRule("riemann_left")
RIEMANN_RIGHT = CaptumRule("riemann_right")
RIEMANN_MIDDLE = CaptumRule("riemann_middle")
RIEMANN_TRAPEZOID = CaptumRule("riemann_trapezoid")
GAUSSLEGENDRE = CaptumRule("gausslegendre")
