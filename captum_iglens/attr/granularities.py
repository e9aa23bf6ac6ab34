r"""
The granularities of IG-Lens: which residual-stream states a path runs through,
what its credit columns are called, and how the estimator credits them.

A new granularity is one :class:`PathGranularity` subclass and one line in
:data:`GRANULARITIES`.
"""

from abc import ABC, abstractmethod
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
)

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.heads import (
    HeadSplit,
    check_consecutive,
    head_attributions,
    head_components,
    head_path_points,
    split_states,
    split_tolerance,
)
from captum_iglens.attr.estimators import Estimator
from captum_iglens.attr.tracing import TracedPath, path_levels
from captum_iglens.readout.interface import PathReadout


class PathGranularity(ABC):
    r"""
    The segments of a path and their credits.

    Args:

        forward_func (Callable): The lens's forward function.
        layers (list[Module]): The chosen blocks, in execution order.
        layer_names (list[str]): A name per block.
        sublayers (list[Module], optional): Per block, the module whose input is
                    the mid-block state.
        heads (HeadSplit, optional): Each block's attention output projection.

    Attributes:

        name (str): The name ``granularity=`` takes.
        supports_unmultiplied (bool): Has attributions without the displacement
                    (``multiply_by_inputs=False``).
    """

    name: ClassVar[str]
    supports_unmultiplied: ClassVar[bool] = True

    def __init__(
        self,
        forward_func: Callable[..., Any],
        layers: Sequence[Module],
        layer_names: Sequence[str],
        sublayers: Optional[Sequence[Module]],
        heads: Optional[HeadSplit],
    ) -> None:
        self.forward_func = forward_func
        self.layers = list(layers)
        self.layer_names = list(layer_names)
        self.sublayers = None if sublayers is None else list(sublayers)
        self.heads = heads

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

    def map_needs_gradients(self, rule: Estimator) -> bool:
        """Whether :meth:`credits` with ``rule`` takes a backward pass."""
        return not rule.gradient_free_map

    def attributions(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        multiply_by_inputs: bool = True,
    ) -> Tensor:
        r"""
        Per-dimension attributions of every column, zero at padding (the
        path-averaged gradients with ``multiply_by_inputs=False``).

        Returns:
            *Tensor* ``(B, P, n, d)``.
        """
        b, p, k_plus_1, d = path.points.shape
        attrs = rule.attributions(
            readout,
            path.points.flatten(0, 1),
            path.score.flatten(),
            path.model_prob.flatten(),
            n_steps,
            chunk_rows,
            grad_kwargs,
            multiply_by_inputs,
        )
        return attrs.view(b, p, k_plus_1 - 1, d) * path.mask[..., None, None]

    def credits(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
    ) -> Tensor:
        r"""
        The scalar credit of every column from the levels ``values``
        ``(B, P, k + 1)`` (:func:`~captum_iglens.attr.tracing.path_levels`).

        Returns:
            *Tensor* ``(B, P, n)``.
        """
        b, p, k_plus_1 = values.shape
        credits = rule.credits(
            readout,
            path.points.flatten(0, 1),
            path.score.flatten(),
            values.flatten(0, 1),
            n_steps,
            chunk_rows,
        )
        return credits.view(b, p, k_plus_1 - 1)

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """``f`` at the start and after each column, ``(B, P, n + 1)``."""
        return values


class Blocks(PathGranularity):
    """One column per block: the segment from the previous block's output."""

    name = "block"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        return [(m, False) for m in self.layers], list(self.layer_names)


class Sublayers(PathGranularity):
    """Two columns per block, ``"<name>.attn"`` (up to the mid-block state) and
    ``"<name>.mlp"`` (the rest of the block)."""

    name = "sublayer"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        points: List[PathPoint] = []
        names: List[str] = []
        for name, mid, block in zip(self.layer_names, mids, self.layers):
            points += [(mid, True), (block, False)]
            names += [f"{name}.attn", f"{name}.mlp"]
        return points, names

    def _mids(self) -> List[Module]:
        if self.sublayers is None:
            raise ValueError(
                f"granularity: {self.name!r} needs the module in front of each "
                "block's MLP "
                "(sublayers=); from_model sets it except for architectures that add "
                "attention and MLP in parallel (GPT-J, Phi, Cohere, parallel Falcon, "
                "GPT-NeoX/StableLM with use_parallel_residual, ...), which have no "
                "residual state between the two, and for model types probed or "
                "registered without mid= (register_architecture(..., mid=...))"
            )
        return self.sublayers


class Heads(Sublayers):
    r"""A first column ``"input"``, then per block ``"<name>.attn.h<i>"`` per head
    (and ``"<name>.attn.bias"``), the attention update split as ``Σ_h W_O[:, head
    h] z_h (+ b)``, and ``"<name>.mlp"``."""

    name = "head"
    supports_unmultiplied = False

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        if self.heads is None:
            raise ValueError(
                "granularity: 'head' needs each block's attention output "
                "projection (heads=); from_model sets it from the architecture "
                "table's attn_out, which is None for this architecture (no "
                "split: e.g. Gemma 2/3 and OLMo 2 normalise the attention "
                "output before adding it to the stream)"
            )
        check_consecutive(self.forward_func, self.layers)
        return head_path_points(self.layers, mids, self.heads, self.layer_names)

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return split_states(states)

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        tolerance = split_tolerance(points.dtype)
        return head_components(self.heads, extras, points, mask, tolerance)

    def map_needs_gradients(self, rule: Estimator) -> bool:
        return True  # the attention segments are split by gradients

    def attributions(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        multiply_by_inputs: bool = True,
    ) -> Tensor:
        self.check_multiply_by_inputs(multiply_by_inputs)
        with torch.no_grad():
            values = path_levels(readout, path, chunk_rows)[0]
        return self._columns(
            rule, readout, path, values, n_steps, chunk_rows, grad_kwargs, True
        )

    def credits(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
    ) -> Tensor:
        with torch.no_grad():  # the gradients along the attention segments
            return self._columns(rule, readout, path, values, n_steps, chunk_rows)

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """A head's column reads the level after its block's attention,
        ``f(h_mid)``."""
        c = path.components.shape[3]
        mids = values[..., 2:-1:2, None].expand(-1, -1, -1, c)
        per_column = torch.cat([mids, values[..., 3::2, None]], -1).flatten(2)
        return torch.cat([values[..., :2], per_column], -1)

    def _columns(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        per_dimension: bool = False,
    ) -> Tensor:
        """The columns ``(B, P, n)``, or ``(B, P, n, d)`` per dimension."""
        b, p = path.targets.shape
        attrs = head_attributions(
            rule,
            readout,
            path.points.flatten(0, 1),
            path.components.flatten(0, 1),
            path.score.flatten(),
            values.flatten(0, 1),
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
        )
        mask = path.mask.view(b, p, *[1] * (attrs.dim() - 1))
        return attrs.view(b, p, *attrs.shape[1:]) * mask


#: The granularities ``granularity=`` takes, by name (iterating gives the names).
GRANULARITIES: Dict[str, Type[PathGranularity]] = {
    g.name: g for g in (Blocks, Sublayers, Heads)
}


def check_granularity(granularity: str) -> None:
    r"""
    Raises:
        ValueError: If no granularity has the name ``granularity``.
    """
    if not isinstance(granularity, str) or granularity not in GRANULARITIES:
        raise ValueError(
            f"granularity: expected one of {list(GRANULARITIES)}, got {granularity!r}"
        )


def granularity_of(
    name: str,
    forward_func: Callable[..., Any],
    layers: Sequence[Module],
    layer_names: Sequence[str],
    sublayers: Optional[Sequence[Module]],
    heads: Optional[HeadSplit],
) -> PathGranularity:
    r"""
    The granularity named ``name`` of the path through ``layers`` (the other
    arguments as :class:`PathGranularity` takes them).

    Raises:
        ValueError: If no granularity has that name.
    """
    check_granularity(name)
    return GRANULARITIES[name](forward_func, layers, layer_names, sublayers, heads)
