r"""The ``"adaptive"`` estimator: adaptive Gauss–Kronrod quadrature of each
component's integral in the logit of ``α``, with the quadrature's own (tiny)
residual shared among the components, so that the credits add up exactly at
any budget and each credit carries an estimate of its own error."""

from functools import lru_cache
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from captum_iglens.attr._utils.component_reads import (
    component_credits,
    component_dots,
    component_norms,
)
from captum_iglens.attr._utils.path_math import (
    layer_grid,
    path_values,
    residual_shares,
    row_groups,
    segment_layers,
    values_and_gradients,
)
from captum_iglens.attr.estimators.base import Estimator, Integration, Segments
from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import TokenScore

#: Gauss points per panel; each panel is read at the ``2 · GAUSS + 1`` points of
#: its Kronrod extension.
GAUSS = 3
#: Panels the logit range starts with (fewer where the budget is smaller).
FIRST_PANELS = 3
#: ``e^{-TAIL}`` bounds the share of ``α`` left at either end of the logit
#: range (as a fraction of the segment, scaled by the ratio of the end norms).
TAIL = 14.0


class Adaptive(Estimator):
    r"""
    Adaptive Gauss–Kronrod quadrature of ``∫_0^1 ∇f(γ(α)) · u_c dα`` in
    ``v = logit(α)``, exact in sum.

    The final norm of the readout makes ``f`` depend on the direction of
    ``γ(α)``, which turns from the start's to the end's near ``α ≈ ‖a‖/‖b‖``
    (a few thousandths on real models, whose ``h_0`` is small), and the
    softmax then moves ``p`` within a small range of ``α``: in ``v`` those
    features have a width of order one wherever they fall. The range ``v ∈
    [-T + min(0, log(‖a‖/‖b‖)), T + max(0, log(‖a‖/‖b‖))]`` (``T`` =
    :data:`TAIL`) is cut into panels, each read at the 7 points of the
    Gauss–Kronrod pair G3/K7; the panel whose components disagree most
    between the two rules (``Σ_c |K - G|``) is halved, while the budget of
    ``n_steps`` gradient evaluations per row allows. A component's credit is
    its K7 sum over the panels plus a share of the row's residual ``r = f(b) -
    f(a) - Σ_c K_c`` (the two ends of ``α`` left out and the quadrature's
    error) in proportion to ``|K_c|`` (first among groups with ``parents``),
    so the credits add up to ``f(b) - f(a)``. Its error estimate is ``Σ_panels
    |K_c - G_c| + |share_c|``: the cruder G3 rule's error, which bounds the
    K7 rule's on the embedded models (``docs/paths.md``).
    """

    name = "adaptive"
    exact = True
    gradient_free_map = True
    supports_unmultiplied = False
    estimates_error = True

    def attributions(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""Per-dimension attributions of every segment: each segment as the
        one component of its own straight line, split per dimension as
        :meth:`components` does."""
        n, k_plus_1, d = points.shape
        k = k_plus_1 - 1
        path_layers = layer_grid(layers, points)
        values = path_values(
            integration.readout,
            points,
            targets,
            integration.chunk_rows,
            layers=path_layers,
        )[0]
        values[:, -1] = end_values
        pairs = torch.stack([points[:, :-1], points[:, 1:]], dim=2).flatten(0, 1)
        segments = Segments(
            pairs,
            pairs.float().diff(dim=1),  # each segment its own one component
            targets.repeat_interleave(k),
            torch.stack([values[:, :-1], values[:, 1:]], -1).flatten(0, 1),
            layers=torch.stack([path_layers[:, :-1], path_layers[:, 1:]], -1).flatten(
                0, 1
            ),
        )
        out = self.components(integration, segments)
        return out.view(n, k, d)

    def credits(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""The observed changes ``f(p_j) - f(p_{j-1})``: no readout, no
        gradient (a segment's components add up to its change)."""
        return values.diff(dim=-1)

    def components(self, integration: Integration, segments: Segments) -> Tensor:
        r"""The credits of :func:`adaptive_components` (its own panels:
        ``fractions`` is not read); per dimension, split by
        :meth:`~captum_iglens.attr.estimators.base.Segments.per_dimension` with
        the K7 integral of ``∇f``."""
        return self.components_and_errors(integration, segments)[0]

    def components_and_errors(
        self, integration: Integration, segments: Segments
    ) -> Tuple[Tensor, Optional[Tensor]]:
        r"""As :meth:`components`, with each credit's error estimate ``(M,
        C)`` (None per dimension)."""
        self.check_multiply_by_inputs(integration.multiply_by_inputs)
        credits, errors, mean_gradient = adaptive_components(
            integration.readout,
            segments,
            integration.n_steps,
            integration.chunk_rows,
            integration.grad_kwargs,
        )
        if not integration.per_dimension:
            return credits, errors
        return segments.per_dimension(credits, mean_gradient), None


@lru_cache(maxsize=None)
def gauss_kronrod(n: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    The ``2n + 1`` points of the Kronrod extension of the ``n``-point
    Gauss–Legendre rule on ``[-1, 1]``, its weights, and the Gauss rule's
    weights at the same points (zero at the Kronrod points).

    The added points are the roots of the Stieltjes polynomial ``E_{n+1}``,
    orthogonal to ``P_n · x^j`` for ``j ≤ n``; the weights make the rule exact
    for polynomials of degree ``2n`` (it is then exact to ``3n + 1``).

    Returns:
        3-element tuple of float64 tensors ``(2n + 1,)``: points, Kronrod
        weights, Gauss weights.
    """
    legendre = np.polynomial.legendre
    gauss_x, gauss_w = legendre.leggauss(n)
    xq, wq = legendre.leggauss(3 * n + 2)  # exact for the products below
    basis = legendre.legvander(xq, n + 1)  # P_0 .. P_{n+1}
    weighted = wq * basis[:, n]
    powers = np.stack([xq**j for j in range(n + 1)])  # (n + 1, q)
    lhs = (powers * weighted) @ basis[:, : n + 1]
    rhs = -(powers * weighted) @ basis[:, n + 1]
    coefficients = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
    added = np.real(legendre.legroots(np.append(coefficients, 1.0)))
    points = np.sort(np.concatenate([gauss_x, added]))
    moments = np.zeros(2 * n + 1)
    moments[0] = 2.0
    weights = np.linalg.solve(legendre.legvander(points, 2 * n).T, moments)
    at_gauss = np.abs(points[:, None] - gauss_x[None]).argmin(0)
    gauss = np.zeros_like(points)
    gauss[at_gauss] = gauss_w
    return (
        torch.from_numpy(points),
        torch.from_numpy(weights),
        torch.from_numpy(gauss),
    )


def panel_rule(n_steps: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    The rule of a panel within a budget of ``n_steps`` gradient evaluations:
    the G3/K7 pair of :func:`gauss_kronrod`, or below 7 evaluations the
    ``n_steps``-point Gauss–Legendre rule with no cruder rule beside it (its
    error estimate is then the whole credit: no accuracy is claimed).

    Returns:
        3-element tuple as :func:`gauss_kronrod`'s.
    """
    if n_steps >= 2 * GAUSS + 1:
        return gauss_kronrod(GAUSS)
    points, weights = np.polynomial.legendre.leggauss(n_steps)
    return (
        torch.from_numpy(points),
        torch.from_numpy(weights),
        torch.zeros(n_steps, dtype=torch.float64),
    )


def logit_range(ends: Tensor) -> Tensor:
    r"""
    The range of ``v = logit(α)`` integrated for each row's segment ``a → b``:
    ``[-T + min(0, log(‖a‖/‖b‖)), T + max(0, log(‖a‖/‖b‖))]``, each norm
    taken at least ``10⁻⁶`` of the other.

    Args:
        ends (Tensor): ``(M, 2, d)``.

    Returns:
        *Tensor* ``(M, 2)`` float64.
    """
    norms = ends.double().norm(dim=-1)
    floor = norms.max(dim=1, keepdim=True).values * 1e-6
    norms = torch.maximum(norms, floor).clamp_min(torch.finfo(torch.float64).tiny)
    ratio = (norms[:, 0] / norms[:, 1]).log()
    return torch.stack([-TAIL + ratio.clamp(max=0), TAIL + ratio.clamp(min=0)], -1)


def adaptive_components(
    readout: PathReadout,
    segments: Segments,
    n_steps: int,
    chunk_rows: int,
    grad_kwargs: Optional[Dict[str, Any]] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    Adaptive, exact credits of the components of one straight segment per row
    (see :class:`Adaptive`). With ``parents`` the residual is shared among the
    groups first; ``fractions`` is not read (the panels are the rule's own).

    Args:

        readout (PathReadout): What reads the points.
        segments (Segments): ``M`` segments and their components.
        n_steps (int): Gradient evaluations per row (panels of 7 from 7 on,
                    see :func:`panel_rule`).
        chunk_rows (int): The most rows read at once.
        grad_kwargs (dict, optional): Passed to ``torch.autograd.grad``.
                    Default: None

    Returns:
        3-element tuple of **credits** ``(M, C)``, **errors** ``(M, C)`` and
        **mean_gradient** ``(M, d)`` (the K7 integral of ``∇f``), float32.
    """
    ends, components, parents = segments.ends, segments.components, segments.parents
    targets, end_values = segments.targets, segments.end_values
    m, _, d = ends.shape
    c = components.shape[1]
    path_layers = layer_grid(segments.layers, ends)
    rule = panel_rule(n_steps)
    width = len(rule[0])
    first = max(1, min(FIRST_PANELS, n_steps // width))
    rounds = (n_steps - first * width) // (2 * width)
    credits = torch.empty(m, c, device=ends.device)
    errors = torch.empty(m, c, device=ends.device)
    mean_gradient = torch.empty(m, d, device=ends.device)
    for rows in row_groups(m, 2 * width, chunk_rows):
        panels = _Panels(readout, ends[rows], targets[rows], path_layers[rows], rule)
        panels.read(first, chunk_rows, grad_kwargs)
        for _ in range(rounds):
            worst = panels.disagreement(components, rows).argmax(dim=1)
            panels.halve(worst, chunk_rows, grad_kwargs)
        total = panels.kronrod.sum(1).float()  # (g, d)
        found = component_credits(components, rows, total).double()  # (g, C)
        error = component_dots(components, rows, panels.difference.float())
        residual = end_values[rows].double().diff(dim=1) - found.sum(1, keepdim=True)
        norm, square, group = component_norms(components, rows, parents)
        norms = (
            norm.double(),
            square.double(),
            None if group is None else group.double(),
        )
        shares = residual_shares(found.unsqueeze(1), residual, norms, parents)[:, 0]
        credits[rows] = shares.float()
        errors[rows] = (error.abs().sum(1).double() + (shares - found).abs()).float()
        mean_gradient[rows] = total
    return credits, errors, mean_gradient


class _Panels:
    r"""
    The panels of a group of ``g`` rows in ``v = logit(α)``: their edges, and
    per panel the K7 integral of ``∇f`` and its difference from the G3
    integral, ``(g, panels, d)`` float64.
    """

    def __init__(
        self,
        readout: PathReadout,
        ends: Tensor,
        targets: TokenScore,
        layers: Tensor,
        rule: Tuple[Tensor, Tensor, Tensor],
    ) -> None:
        self.readout, self.ends, self.targets = readout, ends, targets
        self.layers, self.rule = layers, rule
        self.low, self.high = logit_range(ends).unbind(-1)  # (g, panels) once read
        self.kronrod = ends.new_zeros(ends.shape[0], 0, ends.shape[-1]).double()
        self.difference = self.kronrod.clone()

    def read(
        self, count: int, chunk_rows: int, grad_kwargs: Optional[Dict[str, Any]]
    ) -> None:
        r"""Cuts the range into ``count`` equal panels and reads them."""
        cuts = torch.linspace(0, 1, count + 1, dtype=torch.float64)
        span = (self.high - self.low)[:, None]
        edges = self.low[:, None] + cuts.to(self.low.device) * span
        self.low, self.high = edges[:, :-1], edges[:, 1:]
        self.kronrod, self.difference = self._integrals(
            self.low, self.high, chunk_rows, grad_kwargs
        )

    def disagreement(self, components: Any, rows: Any) -> Tensor:
        r"""``Σ_c |K_c - G_c|`` per panel ``(g, panels)``."""
        dots = component_dots(components, rows, self.difference.float())
        return dots.abs().sum(-1)

    def halve(
        self, worst: Tensor, chunk_rows: int, grad_kwargs: Optional[Dict[str, Any]]
    ) -> None:
        r"""Halves each row's panel ``worst`` ``(g,)``: its left half takes
        its place, its right half is added as the last panel."""
        at = worst.unsqueeze(1)
        low, high = self.low.gather(1, at), self.high.gather(1, at)
        middle = (low + high) / 2
        kronrod, difference = self._integrals(
            torch.cat([low, middle], 1),
            torch.cat([middle, high], 1),
            chunk_rows,
            grad_kwargs,
        )
        index = at.unsqueeze(-1).expand(-1, 1, self.kronrod.shape[-1])
        self.kronrod = torch.cat(
            [self.kronrod.scatter(1, index, kronrod[:, :1]), kronrod[:, 1:]], 1
        )
        self.difference = torch.cat(
            [self.difference.scatter(1, index, difference[:, :1]), difference[:, 1:]],
            1,
        )
        self.low = torch.cat([self.low, middle], 1)
        self.high = torch.cat([self.high.scatter(1, at, middle), high], 1)

    def _integrals(
        self,
        low: Tensor,
        high: Tensor,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]],
    ) -> Tuple[Tensor, Tensor]:
        r"""The K7 integral of ``∇f`` on each panel ``[low, high]`` ``(g, n)``
        in ``v`` and its difference from the G3 integral: ``(g, n, d)`` each."""
        points, kronrod_w, gauss_w = (t.to(low.device) for t in self.rule)
        half = (high - low).unsqueeze(-1) / 2  # (g, n, 1)
        v = low.unsqueeze(-1) + half * (points + 1)  # (g, n, 7)
        alpha = torch.sigmoid(v)
        jacobian = half * alpha * (1 - alpha)  # dα = α (1 - α) dv
        start = self.ends[:, 0].double()
        step = self.ends[:, 1].double() - start
        g, n, width = v.shape
        grid = start[:, None, None] + alpha.unsqueeze(-1) * step[:, None, None]
        _, grads = values_and_gradients(
            self.readout,
            grid.flatten(0, 2).to(self.ends.dtype),
            self.targets.repeat_interleave(n * width),
            segment_layers(self.layers, n * width, with_end=False),
            chunk_rows,
            grad_kwargs,
        )
        grads = grads.double().view(g, n, width, -1) * jacobian.unsqueeze(-1)
        kronrod = torch.einsum("gnwd,w->gnd", grads, kronrod_w)
        return kronrod, kronrod - torch.einsum("gnwd,w->gnd", grads, gauss_w)


#: The estimator (an entry of :data:`~captum_iglens.attr.estimators.ESTIMATORS`).
ADAPTIVE = Adaptive()
