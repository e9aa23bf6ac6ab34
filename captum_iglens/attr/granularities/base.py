r"""
The interface every granularity implements: which residual-stream states a
path runs through, what its credit columns are called, and how the estimator
credits them.
"""

from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import replace
from typing import (
    Any,
    Callable,
    ClassVar,
    ContextManager,
    List,
    Optional,
    Sequence,
    Tuple,
)

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.block_parts import BlockParts
from captum_iglens.attr.estimators import Estimator, Integration
from captum_iglens.attr.tracing import TracedPath


class PathGranularity(ABC):
    r"""
    The segments of a path and their credits.

    Args:

        forward_func (Callable): The lens's forward function.
        layers (list[Module]): The chosen blocks, in execution order.
        layer_names (list[str]): A name per block.
        sublayers (list[Module], optional): Per block, the module whose input is
                    the mid-block state.
        block_parts (BlockParts, optional): The modules inside each block that
                    the component granularities split.

    Attributes:

        name (str): The name ``granularity=`` takes.
        summary (str): What its columns are, in a few words (for help texts).
        supports_unmultiplied (bool): Has attributions without the displacement
                    (``multiply_by_inputs=False``).
        input_column (bool): Its first column is ``"input"``, the segment from
                    the baseline to the first chosen block's input (where a
                    baseline other than ``h_0`` shows as its own column).
        learned_readout (bool): Its columns are whole segments of blocks
                    (:meth:`column_blocks` is not None) or components of them
                    (:meth:`segment_blocks` is not None), so a learned readout
                    per layer can split them.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    supports_unmultiplied: ClassVar[bool] = True
    input_column: ClassVar[bool] = False
    learned_readout: ClassVar[bool] = False

    def __init__(
        self,
        forward_func: Callable[..., Any],
        layers: Sequence[Module],
        layer_names: Sequence[str],
        sublayers: Optional[Sequence[Module]],
        block_parts: Optional[BlockParts],
    ) -> None:
        self.forward_func = forward_func
        self.layers = list(layers)
        self.layer_names = list(layer_names)
        self.sublayers = None if sublayers is None else list(sublayers)
        self.block_parts = block_parts

    def check_multiply_by_inputs(self, multiply_by_inputs: bool) -> None:
        r"""
        Checks that the granularity can return what ``multiply_by_inputs`` asks.

        Args:

            multiply_by_inputs (bool): As :class:`LayerIGLens` was built.

        Raises:
            ValueError: If ``multiply_by_inputs`` is False and the granularity
                has no attributions without the displacement.
        """
        if not (multiply_by_inputs or self.supports_unmultiplied):
            raise ValueError(
                "multiply_by_inputs: False is not supported with "
                f'granularity="{self.name}"; use "block" or "sublayer"'
            )

    @abstractmethod
    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        r"""
        The hooked modules of the path, and a name for each credit column.

        Raises:
            ValueError: If the lens lacks what this granularity needs.
        """

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        """The captured states as residual-stream states and other states."""
        return states, []

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        """The components ``(B, P, k, C, d)`` of the segments split apart."""
        return None

    def recording(self, positions: Tensor, device: torch.device) -> ContextManager[Any]:
        """What else is recorded during the traced forward (nothing here)."""
        return nullcontext()

    def second_pass(
        self, positions: Tensor, device: torch.device
    ) -> Optional[ContextManager[Any]]:
        """What is recorded during a second forward of the same inputs, run
        after the traced one, under numerics of its own (the eager attention
        that returns a source split's weights): the traced forward, whose
        output and states are the model's own, is left as a plain forward
        runs. None (here): no second forward."""
        return None

    def column_names(self, names: List[str]) -> List[str]:
        """The credit columns' names once the traced forward has run."""
        return names

    def column_blocks(self) -> Optional[List[int]]:
        r"""
        For a learned readout per layer: the path block (an index into the
        chosen blocks) each credit column belongs to, the columns of a block
        being consecutive straight segments from its input to its output.
        None where the granularity has no such columns (a learned readout is
        then refused).
        """
        return None

    def segment_blocks(self) -> Optional[List[int]]:
        r"""
        For a learned readout per layer, where the columns are components of
        the stream's straight segments (:meth:`column_blocks` is None): the
        path block each segment belongs to. None where the granularity has
        neither (it then sets ``learned_readout`` False).
        """
        return None

    def column_segments(self, n_columns: int) -> List[int]:
        """With :meth:`segment_blocks`: the segment each of the ``n_columns``
        credit columns is a component of, in order."""
        raise NotImplementedError(f"granularity {self.name!r} has no segments")

    def component_columns(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        r"""
        With :meth:`segment_blocks`: the columns of the components, from ``f``
        at the path points ``(B, P, K)`` or at both ends of every segment
        ``(B, P, K - 1, 2)`` (a learned readout per layer), zero at padding:
        credits ``(B, P, n)``, or attributions ``(B, P, n, d)`` where
        ``integration.per_dimension``.
        """
        raise NotImplementedError(f"granularity {self.name!r} has no segments")

    def map_needs_gradients(self, rule: Estimator) -> bool:
        """Whether :meth:`credits` with ``rule`` takes a backward pass."""
        return not rule.gradient_free_map

    def attributions(self, integration: Integration, path: TracedPath) -> Tensor:
        r"""
        Per-dimension attributions of every column, zero at padding (the
        path-averaged gradients with ``multiply_by_inputs=False``): the
        path's :meth:`~captum_iglens.attr.paths.IntegrationPath.segments`.

        Returns:
            *Tensor* ``(B, P, n, d)``.
        """
        b, p, k_plus_1, d = path.points.shape
        attrs = integration.path.segments(
            replace(integration, per_dimension=True),
            path.points.flatten(0, 1),
            path.score.flatten(),
            path.model_prob.flatten()[:, None],
            self.column_blocks(),
        )
        return attrs.view(b, p, k_plus_1 - 1, d) * path.mask[..., None, None]

    def credits(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        r"""
        The scalar credit of every column from the levels ``values``
        ``(B, P, k + 1)`` (:func:`~captum_iglens.attr.tracing.path_levels`):
        the path's :meth:`~captum_iglens.attr.paths.IntegrationPath.segments`.

        Returns:
            *Tensor* ``(B, P, n)``.
        """
        b, p, k_plus_1 = values.shape
        credits = integration.path.segments(
            replace(integration, per_dimension=False),
            path.points.flatten(0, 1),
            path.score.flatten(),
            values.flatten(0, 1),
            self.column_blocks(),
        )
        return credits.view(b, p, k_plus_1 - 1)

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """``f`` at the start and after each column, ``(B, P, n + 1)``."""
        return values
