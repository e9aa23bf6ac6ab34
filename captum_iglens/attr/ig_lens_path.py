r"""
The path side of :class:`~captum_iglens.attr.layer_ig_lens.LayerIGLens`: its
granularities, the traced path, the names of its columns and the token-by-layer
map (everything beside Captum's ``attribute`` and
``compute_convergence_delta``).
"""

from typing import Any, Callable, List, NamedTuple, Optional, Tuple, Union

import torch
from captum._utils.typing import TargetType
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.budget import FLOAT32_BYTES, machine_memory
from captum_iglens.attr._utils.block_parts import BlockParts
from captum_iglens.attr._utils.checks import (
    BaselineType,
    PositionsType,
    check_settings,
)
from captum_iglens.attr.column_readout import ColumnReadout, column_readout
from captum_iglens.attr.estimators import Integration, estimator
from captum_iglens.attr.granularities import PathGranularity, granularity_of
from captum_iglens.attr.paths import IntegrationPath, integration_path
from captum_iglens.attr.tracing import TracedPath, Tracer
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.layer_readout import hidden_width
from captum_iglens.readout.scores import FoilType, TokenSetType, check_top_k
from captum_iglens.result import IGLensResult


class CallPlan(NamedTuple):
    r"""
    One call's choices, resolved from their names and checked together before
    any forward: what :meth:`IGLensPath.attribute_map` and
    :meth:`~captum_iglens.LayerIGLens.attribute` run.

    Attributes:

        granularity (PathGranularity): The columns and what is traced.
        path (IntegrationPath): How the columns are integrated.
        columns (ColumnReadout): How the columns are read (one readout, or
                    a learned readout's block and lens-change parts).
        integration (Integration): The estimator, its steps and chunks.
    """

    granularity: PathGranularity
    path: IntegrationPath
    columns: ColumnReadout
    integration: Integration


class IGLensPath:
    r"""
    The path of an IG-Lens attribution through its chosen blocks, and the map
    of its credits. :class:`~captum_iglens.attr.layer_ig_lens.LayerIGLens` sets
    the attributes.
    """

    forward_func: Callable[..., Any]
    layers: List[Module]
    input_layer: Module
    readout: LayerwiseReadout
    layer_names: List[str]
    sublayers: Optional[List[Module]]
    block_parts: Optional[BlockParts]

    def segment_names(self, granularity: str = "block") -> List[str]:
        r"""
        The names of the credited segments at a granularity: the layer names, or
        ``"<name>.attn"`` and ``"<name>.mlp"`` per block for ``"sublayer"``, or
        the columns of ``"head"``, ``"neuron"`` and ``"expert"`` (see
        :meth:`~captum_iglens.LayerIGLens.attribute`); for ``"source"`` and
        ``"source_head"``, one ``"<name>.attn.sources"`` per block stands for
        the source columns, whose number is the input's length.

        Args:

            granularity (str, optional): A name in
                        :data:`~captum_iglens.attr.granularities.GRANULARITIES`.
                        Default: ``"block"``

        Returns:
            *list[str]*: the names, in column order.

        Raises:
            ValueError: If the granularity is unknown or not available.
        """
        return self._granularity(granularity).path_points()[1]

    def trace_path(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        *,
        positions: PositionsType = None,
        granularity: str = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
    ) -> TracedPath:
        r"""
        The path that :meth:`~captum_iglens.LayerIGLens.attribute` integrates along,
        from one forward pass
        of the model, without gradients.

        Args:

            inputs (Tensor or tuple[Tensor, ...]): As in
                        :meth:`~captum_iglens.LayerIGLens.attribute`; so
                        are ``baselines``, ``target``, ``additional_forward_args``,
                        ``positions``, ``granularity``, ``foil`` and
                        ``target_tokens``.

        Returns:
            :class:`~captum_iglens.attr.tracing.TracedPath`: the path points
            ``(B, P, n + 1, d)`` (for ``"head"``, ``h_base, h_in, h_mid(1),
            h_out(1), ...`` and the heads' components ``(B, P, k, C, d)``), the
            targets, the model's own score of them, the mask and the column
            names.
        """
        return self._trace(
            self._granularity(granularity),
            inputs,
            baselines,
            target,
            additional_forward_args,
            positions,
            foil=foil,
            target_tokens=target_tokens,
        )

    def attribute_map(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        *,
        positions: PositionsType = None,
        granularity: str = "block",
        method: Optional[str] = None,
        n_steps: Optional[int] = None,
        internal_batch_size: Optional[int] = None,
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        top_k: int = 0,
        path: str = "telescoping",
    ) -> IGLensResult:
        r"""
        The token-by-layer map: each chosen block's scalar credit at every
        attributed position, with the logit-lens levels that come with it.

        With ``"prediction_aware"`` this is one forward pass of the model and
        ``B·P·(k+1)`` readouts, with no backward pass, under
        ``torch.inference_mode()``. With a Captum rule it sums the per-dimension
        attributions of :meth:`~captum_iglens.LayerIGLens.attribute`.

        Args:

            inputs (Tensor or tuple[Tensor, ...]): As in
                        :meth:`~captum_iglens.LayerIGLens.attribute`; so
                        are ``baselines``, ``target``, ``additional_forward_args``,
                        ``positions`` and ``granularity``.
            method (str, optional): As in :meth:`~captum_iglens.LayerIGLens.attribute`.
                        Default: None, the path's ``default_method``.
            n_steps (int, optional): As in
                        :meth:`~captum_iglens.LayerIGLens.attribute`; the
                        telescoping map of ``"prediction_aware"`` does not depend
                        on it. Default: None, the path's ``default_steps``.
            internal_batch_size (int, optional): As in
                        :meth:`~captum_iglens.LayerIGLens.attribute`.
                        Default: None.
            foil (int, list or Tensor, optional): As in
                        :meth:`~captum_iglens.LayerIGLens.attribute`, and
                        so is ``target_tokens``; both are recorded in the result's
                        ``foils`` and ``target_sets``.
            top_k (int, optional): With ``top_k >= 1``, the result also holds
                        what each layer's readout predicts, from the same readout
                        chunks as the credits: ``top_ids`` and ``top_probs``
                        ``(B, P, k, top_k)``, ``entropy``, ``kl`` (from the model's
                        final distribution) and ``rank`` (of the target)
                        ``(B, P, k)``. At the last layer they are the model's own
                        output distribution's. Default: 0 (no views).
            path (str, optional): How the columns are integrated, a name in
                        :data:`~captum_iglens.attr.paths.PATHS`:
                        ``"telescoping"``, one straight segment per column in
                        depth order (a block's credit is ``f(h_l) -
                        f(h_{l-1})``: when the final head can *read* the
                        answer); ``"joint"``, every column's update scaled
                        together along ``h_base → h_final`` (a column's credit
                        is ``∫ ∇f(γ(α))·u dα``: what it *writes*, in no order;
                        the model's own readout only, and a baseline other
                        than ``h_0`` only with an ``"input"`` column).
                        Default: ``"telescoping"``.

        Returns:
            :class:`~captum_iglens.IGLensResult` with ``attributions`` and ``levels``
            of shape ``(B, P, k)`` and ``delta`` of shape ``(B, P)``, always
            float32 and always credits (``multiply_by_inputs`` does not apply).
            With ``(t, v)`` targets, ``P`` runs over the distinct positions named
            and ``mask`` marks each example's own.
        """
        plan = self._plan(
            method,
            n_steps,
            internal_batch_size,
            granularity,
            path,
            True,
            False,
            baselines is not None,
        )
        check_top_k(top_k, self.readout.vocab_size)
        integration = plan.integration
        grad_free = (
            torch.no_grad
            if plan.path.map_needs_gradients(plan.granularity, integration.rule)
            else torch.inference_mode
        )
        with grad_free():
            traced = self._trace(
                plan.granularity,
                inputs,
                baselines,
                target,
                additional_forward_args,
                positions,
                foil=foil,
                target_tokens=target_tokens,
                top_k=top_k,
            )
            split = plan.columns.map(integration, traced, top_k)
        return plan.columns.result(
            traced, split, integration.rule.name, integration.n_steps
        )

    def _plan(
        self,
        method: Optional[str],
        n_steps: Optional[int],
        internal_batch_size: Optional[int],
        granularity: str,
        path: str,
        multiply_by_inputs: bool,
        attribute_to_layer_input: bool,
        baselines_given: bool,
    ) -> CallPlan:
        """A call's granularity, path, column readout and integration, from its
        arguments, each checked before any forward (``multiply_by_inputs``
        against the estimator, the granularity and the path)."""
        along = integration_path(path)
        rule = estimator(along.default_method if method is None else method)
        n_steps = along.default_steps if n_steps is None else n_steps
        rule.check_steps(n_steps)
        self._check_budget(n_steps)
        check_settings(internal_batch_size, attribute_to_layer_input)
        rule.check_multiply_by_inputs(multiply_by_inputs)
        path_granularity = self._granularity(granularity)
        path_granularity.check_multiply_by_inputs(multiply_by_inputs)
        along.check(type(path_granularity), multiply_by_inputs, baselines_given)
        columns = column_readout(self.readout, self.layers, path_granularity, along)
        integration = Integration(
            rule,
            columns.readout,
            n_steps,
            internal_batch_size or self.readout.rows_per_chunk(),
            along,
            multiply_by_inputs=multiply_by_inputs,
        )
        return CallPlan(path_granularity, along, columns, integration)

    def _check_budget(self, n_steps: int) -> None:
        """The ``n_steps`` points of one segment, which an estimator holds at
        once whatever the readout's chunk (a chunk holds at least one row), fit
        in this machine's memory, where the readout says its width."""
        width, memory = hidden_width(self.readout), machine_memory()
        if width is None or memory is None:
            return
        need = n_steps * width * FLOAT32_BYTES
        if need > memory:
            raise ValueError(
                f"n_steps: the {n_steps} points of one segment (each a hidden "
                f"state of {width} float32) need {need / 2**30:.3g} GiB, more "
                f"than this machine's {memory / 2**30:.3g} GiB of memory; give "
                "fewer steps"
            )

    def _granularity(self, granularity: str) -> PathGranularity:
        """The segments of this lens's path at ``granularity``."""
        return granularity_of(
            granularity,
            self.forward_func,
            self.layers,
            self.layer_names,
            self.sublayers,
            self.block_parts,
        )

    def _trace(
        self, path_granularity: PathGranularity, *args: Any, **kwargs: Any
    ) -> TracedPath:
        """:meth:`Tracer.trace` of this lens, without gradients."""
        tracer = Tracer(self.forward_func, self.input_layer, self.readout)
        with torch.no_grad():
            return tracer.trace(path_granularity, *args, **kwargs)
