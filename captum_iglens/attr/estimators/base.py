r"""The interface of an IG-Lens estimator: how the credit of each straight
segment of a path is computed; and the records of the segments the estimators
(:class:`Segments`) and the paths (:class:`SplitChains`) credit."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from torch import Tensor

from captum_iglens.attr._utils.path_math import split_weights
from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import TokenScore


@dataclass(frozen=True)
class Segments:
    r"""
    One straight segment per row and the components ``u_c`` it is split into,
    ``Σ_c u_c = end - start`` (the heads of ``granularity="head"``, the
    per-(head, source) terms of ``"source"``, the columns of the joint path):
    what :meth:`Estimator.components` credits.

    Args:

        ends (Tensor): ``(M, 2, d)``: each segment's start and end.
        components (Tensor): ``(M, C, d)`` float32: the components ``u_c``
                    (or an object whose ``[rows]`` builds those rows'
                    ``(g, C, d)`` components, and with a ``shape``; see
                    :mod:`~captum_iglens.attr._utils.component_reads`).
        targets (TokenScore): ``M`` rows: the score ``f`` of each.
        end_values (Tensor): ``(M, 2)``: ``f`` at the start and the end, used
                    in place of the readout's evaluations there, so that the
                    credits telescope with the other segments' values.
        layers (Tensor, optional): Broadcastable to ``(M, 2)``: the path points
                    of the ends (see
                    :func:`~captum_iglens.attr._utils.path_math.layer_grid`).
                    Default: None, a path from its start
        parents (Tensor, optional): ``(C,)`` long: a group per component (the
                    head of a (head, source) term). Where the estimator is not
                    linear in the components, each group's credit is the one
                    the group's summed component would get, split among its
                    members by the same rule. Default: None, no groups
        fractions (Tensor, optional): ``(M, n_steps + 1)``, increasing from 0
                    to 1: where an estimator that steps along the segment ends
                    its steps (a path may place them where ``f`` changes).
                    Estimators with their own nodes (Captum's rules, the
                    adaptive panels) keep them. Default: None, equal steps
    """

    ends: Tensor
    components: Tensor
    targets: TokenScore
    end_values: Tensor
    layers: Optional[Tensor] = None
    parents: Optional[Tensor] = None
    fractions: Optional[Tensor] = None

    def per_dimension(self, credits: Tensor, mean_gradient: Tensor) -> Tensor:
        r"""
        Each component's credit split across the dimensions: ``u_{c,i} Ḡ_i``
        (``Ḡ`` an estimator's mean gradient along the segment) plus the rest of
        the credit in proportion to ``|u_{c,i} Ḡ_i|``.

        Args:

            credits (Tensor): ``(M, C)``: the components' credits.
            mean_gradient (Tensor): ``(M, d)``: ``Ḡ`` of each segment.

        Returns:
            *Tensor* ``(M, C, d)`` float32.
        """
        components = self.components[:]  # all rows (built here if on demand)
        linear = components * mean_gradient.unsqueeze(1)
        rest = credits - linear.sum(-1)
        spread = split_weights(linear.abs().sqrt(), components)
        return linear + rest.unsqueeze(-1) * spread


class Estimator(ABC):
    r"""
    An estimator of the Integrated Gradients of every segment of a path.

    The arguments shared by the methods: ``integration`` (:class:`Integration`)
    holds the readout that reads the points, the steps per segment, the most
    rows read at once and the ``grad_kwargs`` of ``torch.autograd.grad``;
    ``points`` ``(N, K, d)`` are the path points of ``N`` rows in the model's
    dtype; ``targets`` is the score ``f`` of each row (``N`` rows); ``layers``
    (broadcastable to ``(N, K)``) is the path point each column is (see
    :func:`~captum_iglens.attr._utils.path_math.layer_grid`; None for a path
    from its start).

    Attributes:

        name (str): The name ``method=`` takes.
        exact (bool): The credits add up to ``f(end) - f(start)`` at any
                    ``n_steps``.
        gradient_free_map (bool): :meth:`credits` needs only the values of
                    ``f`` at the points: the map runs without a backward pass.
        supports_unmultiplied (bool): Has a form without the displacement
                    (``multiply_by_inputs=False``): the path-averaged gradient.
        min_steps (int): The fewest ``n_steps`` it accepts.
        estimates_error (bool): :meth:`components_and_errors` gives each
                    credit an estimate of its own quadrature error.
    """

    name: str
    exact: bool
    gradient_free_map: bool
    supports_unmultiplied: bool
    min_steps: int = 1
    estimates_error: bool = False

    def check_steps(self, n_steps: int) -> None:
        r"""
        Checks ``n_steps`` before any work.

        Args:

            n_steps (int): The steps per segment the caller asked for.

        Raises:
            ValueError: If ``n_steps`` is not an int of at least
                ``min_steps``.
        """
        low = self.min_steps
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < low:
            raise ValueError(
                f"n_steps: expected an int >= {low} for method {self.name!r}, "
                f"got {n_steps!r}"
            )

    def check_multiply_by_inputs(self, multiply_by_inputs: bool) -> None:
        r"""
        Checks that the estimator can return what ``multiply_by_inputs`` asks.

        Args:

            multiply_by_inputs (bool): As :class:`LayerIGLens` was built.

        Raises:
            ValueError: If ``multiply_by_inputs`` is False and the estimator has
                no form without the displacement.
        """
        if not (multiply_by_inputs or self.supports_unmultiplied):
            raise ValueError(
                f"method: {self.name!r} has no form without the displacement; "
                "with multiply_by_inputs=False choose one of Captum's rules (e.g. "
                "method='gausslegendre')"
            )

    @abstractmethod
    def attributions(
        self,
        integration: "Integration",
        points: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""
        Per-dimension attributions of every segment of ``points``.

        Args:

            integration (Integration): The readout, steps, chunking and
                        ``multiply_by_inputs`` (False: the path-averaged
                        gradient of each segment, where ``supports_unmultiplied``).
            end_values (Tensor): ``(N,)``: ``f`` at the last point as the model
                        computed it (estimators that use the values there take
                        it in place of the readout's).

        Returns:
            *Tensor* ``(N, K - 1, d)``, in the work dtype of the points.
        """

    def credits(
        self,
        integration: "Integration",
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        r"""
        The scalar credit of every segment: its attributions (multiplied by the
        displacement) summed over ``d``.

        Args:

            values (Tensor): ``(N, K)``: ``f`` at the points, the last the
                        model's own.

        Returns:
            *Tensor* ``(N, K - 1)``, in the work dtype of the points.
        """
        multiplied = replace(integration, multiply_by_inputs=True)
        return self.attributions(
            multiplied, points, targets, values[:, -1], layers=layers
        ).sum(-1)

    @abstractmethod
    def components(self, integration: "Integration", segments: Segments) -> Tensor:
        r"""
        The credits of the components of each straight segment of
        ``segments``.

        Args:

            integration (Integration): As for :meth:`attributions`; its
                        ``per_dimension`` asks for per-dimension attributions
                        in place of scalar credits.
            segments (Segments): ``M`` segments and their ``C`` components.

        Returns:
            *Tensor* ``(M, C)``, or ``(M, C, d)`` with ``per_dimension``,
            float32.
        """

    def components_and_errors(
        self, integration: "Integration", segments: Segments
    ) -> Tuple[Tensor, Optional[Tensor]]:
        r"""
        :meth:`components`, and where the estimator ``estimates_error`` (and
        the credits are scalars), each credit's error estimate.

        Returns:
            2-element tuple: the credits of :meth:`components`, and an
            ``(M, C)`` float32 error estimate or None.
        """
        return self.components(integration, segments), None


@dataclass(frozen=True)
class SplitChains:
    r"""
    The chains of a granularity's path with some of their segments split into
    components that add up to them: what
    :meth:`~captum_iglens.attr.paths.IntegrationPath.split_segments` credits.

    Args:

        stream (Tensor): ``(N, K + 1, d)``: the path points of ``N`` chains.
        components (Tensor): ``(N·len(split), C, d)`` float32: each split
                    segment's components, as :class:`Segments` takes them.
        targets (TokenScore): ``N`` rows.
        values (Tensor): ``(N, K + 1)``: ``f`` at the points, the last the
                    model's own; or ``(N, K, 2)`` at both ends of every
                    segment (a learned readout per layer, see
                    :func:`~captum_iglens.attr._utils.path_math.segment_ends`).
        split (list[int]): The segments split into components.
        whole (list[int]): The segments credited whole.
        parents (Tensor, optional): ``(C,)``: a group per component, as
                    :class:`Segments` takes it. Default: None
        blocks (list[int], optional): ``K``: the path block of each segment,
                    as :meth:`~captum_iglens.attr.paths.IntegrationPath.segments`
                    takes it. Default: None
    """

    stream: Tensor
    components: Tensor
    targets: TokenScore
    values: Tensor
    split: Sequence[int]
    whole: Sequence[int]
    parents: Optional[Tensor] = None
    blocks: Optional[Sequence[int]] = None


class SegmentJoin(Protocol):
    r"""
    What the granularities ask of the integration path
    (:class:`~captum_iglens.attr.paths.IntegrationPath` implements it): the
    credits of a chain's segments, whole or split into components, integrated
    the path's way. A protocol rather than the class itself because the paths
    import the estimators, and the package has no import cycle, not even for
    type checking (``tests/test_layout.py``).
    """

    def segments(
        self,
        integration: "Integration",
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        blocks: Optional[Sequence[int]] = None,
    ) -> Tensor: ...

    def split_segments(
        self, integration: "Integration", chains: SplitChains
    ) -> Tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class Integration:
    r"""
    How a traced path is integrated: what the estimators, the granularities and
    the lens-change split take in place of the same settings one by one.

    Args:

        rule (Estimator): The estimator (``method=``).
        readout (PathReadout): What reads the path points.
        n_steps (int): Steps per segment.
        chunk_rows (int): The most rows read at once.
        path (SegmentJoin): How the segments are integrated (``path=``).
        grad_kwargs (dict, optional): Passed to ``torch.autograd.grad``.
                    Default: None
        per_dimension (bool, optional): Per-dimension attributions (for
                    ``attribute``) rather than scalar credits (for
                    ``attribute_map``). Default: False
        multiply_by_inputs (bool, optional): As :class:`LayerIGLens` was built:
                    False asks for the path-averaged gradients. Default: True
        errors (list, optional): Where a path appends the error estimates
                    ``(N, n)`` of the columns of :meth:`segments`, when its
                    estimator ``estimates_error``. Default: None, not kept
    """

    rule: Estimator
    readout: PathReadout
    n_steps: int
    chunk_rows: int
    path: SegmentJoin
    grad_kwargs: Optional[Dict[str, Any]] = None
    per_dimension: bool = False
    multiply_by_inputs: bool = True
    errors: Optional[List[Tensor]] = None

    def reading(self, readout: PathReadout) -> "Integration":
        """The same integration through another readout."""
        return replace(self, readout=readout)
