r"""LayerIGLens: exact layer-wise attribution of a token's probability."""

import typing
from dataclasses import replace
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import torch
from captum._utils.typing import TargetType
from captum.attr import GradientAttribution, LayerAttribution
from captum.log import log_usage
from torch import Tensor
from torch.nn import Module, ModuleList

from captum_iglens.attr._utils.checks import (
    BaselineType,
    Granularity,
    PositionsType,
    check_construction,
    check_settings,
    hf_model_of,
)
from captum_iglens.attr._utils.block_parts import BlockParts
from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.attr.estimators import Estimator, estimator
from captum_iglens.attr._utils.path_math import work_dtype
from captum_iglens.attr.granularities import (
    PathGranularity,
    check_learned_readout,
    granularity_of,
)
from captum_iglens.attr.lens_change import (
    ReadoutPlan,
    ReadoutSplit,
    SegmentReadout,
    plan,
    split_attributions,
    split_components,
    split_map,
)
from captum_iglens.attr.tracing import TracedPath, Tracer, path_levels
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import CausalLMForward
from captum_iglens.hf.parts import ModelParts
from captum_iglens.readout.layer_readout import LayerReadout
from captum_iglens.readout.readout import Readout
from captum_iglens.readout.translators import Translators
from captum_iglens.readout.scores import (
    FoilType,
    TokenSetType,
    Views,
    check_top_k,
)
from captum_iglens.result import IGLensResult


#: One tensor per layer: alone, in a list, or in a tuple (as ``layer`` was given).
_Attributions = Union[Tensor, List[Tensor], Tuple[Tensor, ...]]


class LayerIGLens(LayerAttribution, GradientAttribution):
    r"""
    IG-Lens attributes the probability of a predicted token across the blocks of a
    transformer. The residual stream is followed along one path,
    ``h_base → h_{L_1} → ... → h_{L_k} = h_final``, and layer ``L_j`` is credited
    the Integrated Gradients of ``f_y(h) = softmax(readout(h))[y]`` along the
    straight segment from ``h_{L_{j-1}}`` to ``h_{L_j}``, where ``readout`` is the
    model's own final norm and head. The credits telescope: they add up to
    ``p_model(y) - f_y(h_base)``, exactly for the default ``"prediction_aware"``
    estimator, at any ``n_steps``.

    The last path point, ``h_final``, is valued by the model's own output
    probability, so that the credits add up to the change in the model's real
    probability. The readout's evaluation of ``h_final`` is checked against the
    model's logits on every call (and differs only by floating-point matrix-product
    noise, which depends on the batch shape).

    A credit measures how much more probability the readout can get out of
    ``h_{L_j}`` than out of ``h_{L_{j-1}}`` (a conditional marginal of readout), not
    the total causal effect of a block through the blocks above it.

    The ``"prediction_aware"`` estimator splits each step's observed change in
    probability across hidden dimensions with the rule of Integrated Decision
    Gradients: https://arxiv.org/abs/2305.20052

    Integrated Gradients: https://arxiv.org/abs/1703.01365
    """

    def __init__(
        self,
        forward_func: Callable[..., Any],
        layer: Union[Module, Sequence[Module]],
        device_ids: Optional[List[int]] = None,
        multiply_by_inputs: bool = True,
        *,
        readout: Optional[Union[Readout, LayerReadout]] = None,
        input_layer: Optional[Module] = None,
        layer_names: Optional[Sequence[str]] = None,
        sublayers: Optional[Sequence[Module]] = None,
        block_parts: Optional[BlockParts] = None,
    ) -> None:
        r"""
        Args:

            forward_func (Callable): The model's forward function. Called as
                        ``forward_func(*inputs, *additional_forward_args)``, it
                        must return logits ``(B, T, V)``, an object with a
                        ``.logits`` attribute holding them, or last-position logits
                        ``(B, V)``.
            layer (torch.nn.Module or list[torch.nn.Module]): The decoder blocks
                        on the path, in execution order. The last one must be the
                        block whose output feeds ``readout``. An
                        ``nn.ModuleList`` is accepted. With a list, attributions
                        are returned as a list (one tensor per block), as
                        LayerIntegratedGradients does; with a tuple, as a tuple
                        (which ``NoiseTunnel`` needs: it refuses lists).
            device_ids (list[int], optional): Kept for Captum compatibility
                        (``nn.DataParallel``); blocks on different devices need no
                        setting, captured states are moved to the readout's
                        device. Default: None
            multiply_by_inputs (bool, optional): Captum's meaning, for Captum's
                        rules (``method="riemann_*"``, ``"gausslegendre"``): if
                        True, each segment's path-averaged gradient is multiplied
                        by that segment's displacement ``h_{L_j} - h_{L_{j-1}}``
                        (local attributions, which add up to the credit). If
                        False, the path-averaged gradient of each segment is
                        returned alone (global attributions): every block gets
                        the average gradient of ``f`` along *its own* segment,
                        not along one straight line from the baseline, so
                        multiplying block ``j``'s result by ``h_{L_j} -
                        h_{L_{j-1}}`` (not by ``inputs - baselines``) gives its
                        attributions. ``method="prediction_aware"`` splits
                        observed changes of probability, not gradients, and has
                        no form without the displacement: ``attribute`` refuses
                        it with False. The returned ``delta`` and
                        :meth:`attribute_map` always use the multiplied
                        attributions. Default: True
            readout (Readout or LayerReadout, optional): What the model does
                        between its last block and its logits (final norm,
                        head, final transforms): the logit readout, the same
                        at every layer. A
                        :class:`~captum_iglens.readout.layer_readout.LayerReadout`
                        reads each block's output through its own learned
                        translator (and the model's readout at the last block);
                        then every credit is a block part plus a lens-change
                        part (see :meth:`attribute_map`). Default: None, only
                        when ``forward_func``
                        is a supported Hugging Face causal LM, a bound method of
                        one, or a wrapper holding one in ``.module``
                        (``nn.DataParallel``, DDP) or ``.model``: then
                        ``model_parts(model).readout()`` of it, and ``input_layer``
                        defaults to the model's first decoder block.
            input_layer (torch.nn.Module, optional): The model's first block; the
                        input it receives is ``h_0``, the default baseline and the
                        start of the path. Default: the first entry of
                        ``layer`` (the model's first block when ``readout`` is
                        found from the model).
            layer_names (list[str], optional): A name for each block in ``layer``,
                        used in results and plots. Default: the blocks' qualified
                        names in ``forward_func`` when it is a module, else their
                        indices.
            sublayers (list[torch.nn.Module], optional): For each block in
                        ``layer``, the module whose *input* is the block's
                        mid-block residual state ``h + attn(...)`` (after
                        attention, before the MLP), e.g. Llama's
                        ``post_attention_layernorm``. Needed for
                        ``granularity="sublayer"``. Default: None
            block_parts (BlockParts, optional): The modules inside each block
                        that the component granularities split: its attention
                        output projection and the number of heads (for
                        ``"head"`` and ``"source"``, which also need
                        ``sublayers``), MLP output projection (``"neuron"``) or
                        experts (``"expert"``). Default: None
        """
        if isinstance(multiply_by_inputs, bool) is False:
            raise TypeError(
                f"multiply_by_inputs: expected a bool, got {multiply_by_inputs!r}"
            )
        if readout is None:
            parts = model_parts(hf_model_of(forward_func))
            readout = parts.readout()
            if input_layer is None:
                input_layer = parts.blocks[0]
        layers, input_layer, names, sublayers = check_construction(
            forward_func, layer, readout, input_layer, layer_names, sublayers
        )
        is_list = isinstance(layer, (list, tuple, ModuleList))
        LayerAttribution.__init__(
            self, forward_func, layers if is_list else layers[0], device_ids
        )
        GradientAttribution.__init__(self, forward_func)
        self.layers: List[Module] = layers
        self.input_layer = input_layer
        self.readout = readout
        self.layer_names: List[str] = names
        self.sublayers: Optional[List[Module]] = sublayers
        if block_parts is not None and (
            not isinstance(block_parts, BlockParts)
            or len(block_parts.attn_out) != len(layers)
        ):
            raise ValueError(
                f"block_parts: expected a BlockParts with one attention output "
                f"projection per block ({len(layers)}), got {block_parts!r}"
            )
        self.block_parts = block_parts
        self._multiply_by_inputs = multiply_by_inputs
        self._as_tuple = isinstance(layer, tuple)

    @classmethod
    def from_model(
        cls,
        model: Union[Module, ModelParts],
        layers: Optional[Sequence[int]] = None,
        *,
        max_chunk_bytes: int = 256 * 2**20,
        lens: Union[None, str, Path, Translators] = None,
    ) -> "LayerIGLens":
        r"""
        IG-Lens for a Hugging Face causal language model, from the architecture
        registry (see :func:`captum_iglens.register_architecture`).

        Args:

            model (transformers.PreTrainedModel or ModelParts): A causal LM of a
                        supported architecture; a TransformerLens
                        ``TransformerBridge``, nnsight ``LanguageModel`` or
                        ``nn.DataParallel`` wrapping one (unwrapped, and checked
                        to give the same logits); or its parts from
                        :func:`captum_iglens.hf.model_parts`.
            layers (list[int], optional): Indices of the decoder blocks to put on
                        the path (negative indices count from the end). The last
                        block is always appended. Default: all blocks.
            max_chunk_bytes (int, optional): Memory budget of one readout chunk.
                        Default: 256 MiB.
            lens (str, Path or Translators, optional): A learned readout per
                        layer: a tuned-lens folder (``params.pt`` and
                        ``config.json``; this model's cached fit is
                        ``captum_iglens.lens_fit.cached_lens(parts, tokenizer)``)
                        or :class:`~captum_iglens.readout.translators.Translators`;
                        refused, before any forward, if made for another model.
                        ``"logit"`` is the model's own readout, as None.
                        Default: None (the logit readout)

        Returns:
            *LayerIGLens* whose ``forward_func`` is
            :class:`~captum_iglens.hf.forward.CausalLMForward` (called with
            ``input_ids`` and, optionally, ``attention_mask``), whose ``layer`` is
            a list of blocks, whose layer names are the block indices, and whose
            ``sublayers`` come from the architecture table (None for blocks that
            add attention and MLP in parallel).
        """
        parts = model_parts(model)
        chosen = parts.choose(layers)
        readout: Union[Readout, LayerReadout]
        readout = parts.readout(max_chunk_bytes=max_chunk_bytes)
        if lens == "linear":
            raise ValueError(
                "lens: 'linear' names the cached fit on the command line; in Python "
                "pass its folder, captum_iglens.lens_fit.cached_lens(model_parts("
                "model), tokenizer), which fits and caches it when there is none"
            )
        if lens is not None and lens != "logit":
            # The caller's translators stay where they are: the readout casts
            # them to the states' device and dtype, once per parameter version.
            translators = (
                lens if isinstance(lens, Translators) else Translators.load(lens)
            )
            readout = LayerReadout(readout, translators, parts.blocks)
        return cls(
            CausalLMForward(parts.model),
            [parts.blocks[i] for i in chosen],
            readout=readout,
            input_layer=parts.blocks[0],
            layer_names=[str(i) for i in chosen],
            sublayers=None if parts.mid is None else [parts.mid[i] for i in chosen],
            block_parts=BlockParts.of_model(parts, chosen),
        )

    def segment_names(self, granularity: Granularity = "block") -> List[str]:
        r"""
        The names of the credited segments at a granularity: the layer names, or
        ``"<name>.attn"`` and ``"<name>.mlp"`` per block for ``"sublayer"``, or
        the columns of ``"head"``, ``"neuron"`` and ``"expert"`` (see
        :meth:`attribute`); for ``"source"`` and ``"source_head"``, one
        ``"<name>.attn.sources"`` per block stands for the source columns,
        whose number is the input's length.

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
        granularity: Granularity = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
    ) -> TracedPath:
        r"""
        The path that :meth:`attribute` integrates along, from one forward pass
        of the model, without gradients.

        Args:

            inputs (Tensor or tuple[Tensor, ...]): As in :meth:`attribute`; so
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

    @classmethod
    def get_name(cls) -> str:
        return "Layer IG-Lens"

    def has_convergence_delta(self) -> bool:
        return True

    @property
    def multiplies_by_inputs(self) -> bool:
        return self._multiply_by_inputs

    def attribute_future(self) -> Callable[..., Any]:
        raise NotImplementedError("attribute_future is not implemented for LayerIGLens")

    @typing.overload
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        n_steps: int = 50,
        method: str = "prediction_aware",
        internal_batch_size: Optional[int] = None,
        *,
        return_convergence_delta: Literal[True],
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        positions: PositionsType = None,
        granularity: Granularity = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
    ) -> Tuple[_Attributions, Tensor]: ...

    @typing.overload
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        n_steps: int = 50,
        method: str = "prediction_aware",
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: Literal[False] = False,
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        *,
        positions: PositionsType = None,
        granularity: Granularity = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
    ) -> _Attributions: ...

    @log_usage(part_of_slo=True)
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        n_steps: int = 50,
        method: str = "prediction_aware",
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: bool = False,
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        *,
        positions: PositionsType = None,
        granularity: Granularity = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
    ) -> Union[_Attributions, Tuple[_Attributions, Tensor]]:
        r"""
        Per-dimension IG-Lens attributions of every chosen block.

        Args:

            inputs (Tensor or tuple[Tensor, ...]): What ``forward_func`` takes
                        first: token ids ``(B, T)`` or embeddings ``(B, T, d)``.
            baselines (scalar, Tensor, tuple or str, optional): The start of the
                        path. ``None``: ``h_0``, the input of the first block
                        (after any embedding scaling the model applies). Token
                        ids shaped like integer ``inputs`` ``(B, T)`` (alone, in
                        a 1-tuple, or leading a tuple of one tensor per input),
                        as passed to LayerIntegratedGradients: the model runs on
                        them (with the other inputs, or their baselines) and the
                        path starts at the first block's input for them. A
                        scalar or a float tensor broadcastable to the hidden
                        states ``(B, T, d)``: that hidden state (so ``0`` is a
                        zero hidden state, not token id 0). ``"mean"``: the
                        mean of ``h_0`` over each sequence's (non-padding)
                        positions. Default: None
            target (int, tuple, list or Tensor, optional): The token whose
                        probability is attributed, in Captum's ``TargetType``
                        forms with Captum's meaning. ``None``: the model's own
                        greedy prediction at each position. Token id ``v`` for
                        every example: ``v``, ``(v,)`` or a one-element tensor.
                        One id per example: a list of ``B`` ints, a list of
                        ``B`` one-tuples, or a ``(B,)`` or ``(B, 1)`` tensor.
                        Position and id, on a forward that returns ``(B, T,
                        V)``: ``(t, v)`` attributes position ``t`` of every
                        example, and a list of ``B`` tuples ``(t_b, v_b)``
                        position ``t_b`` of example ``b`` (``positions`` must
                        then be None; the attributions run over the distinct
                        positions named, zero where they are not the example's
                        own). This project's own form: a ``(B, P)`` tensor with
                        ``P > 1``, one id per attributed position in the order
                        of ``positions``. The rule that decides: a one-element
                        tensor is one id; a 1-D tensor, or a 2-D one whose
                        second size is 1, is one id per example; any other 2-D
                        tensor is one id per position; tuples index Captum's
                        output without the batch axis, vocabulary last.
                        Default: None
            additional_forward_args (Any, optional): Further positional arguments
                        of ``forward_func`` (e.g. an attention mask ``(B, T)``,
                        batch first). When ``forward_func`` has a parameter named
                        ``attention_mask`` that receives a tensor, its zeros mark
                        padding. Default: None
            n_steps (int, optional): Steps per segment, at least 1 (2 for the
                        Riemann rules). Default: 50.
            method (str, optional): ``"prediction_aware"`` (exact at any
                        ``n_steps``), or one of Captum's rules ``"riemann_left"``,
                        ``"riemann_right"``, ``"riemann_middle"``,
                        ``"riemann_trapezoid"``, ``"gausslegendre"`` with Captum's
                        own step sizes and alphas (and their discretisation error,
                        reported in ``delta``; Captum 0.9's trapezoid weights sum to
                        ``1 - 1/n_steps``). Default: ``"prediction_aware"``.
            internal_batch_size (int, optional): The most interpolation points
                        that go through the readout (and its backward) at once.
                        Default: None (the readout's memory budget decides).
            return_convergence_delta (bool, optional): Also return ``delta``.
                        Default: False.
            attribute_to_layer_input (bool, optional): Must be False: the path
                        runs through block outputs. Default: False.
            grad_kwargs (dict, optional): Passed to ``torch.autograd.grad``.
                        Default: None.
            positions (int, list[int] or Tensor, optional): Keyword only. The
                        positions to attribute (negative values count from the
                        end); an int (or 0-d tensor) attributes one output per
                        example, so ``delta`` is ``(B,)``. Default: every
                        position that is not padding in some sequence of the
                        batch (all positions without a mask); the last position
                        when ``forward_func`` returns ``(B, V)``.
            granularity (str, optional): Keyword only. ``"block"``: one credit per
                        block. ``"sublayer"``: two per block, ``"<name>.attn"``
                        (up to the mid-block state ``h + attn(...)``) and
                        ``"<name>.mlp"`` (the rest of the block); they add up to
                        the block's credit. Needs ``sublayers``.
                        ``"head"``: a first column ``"input"`` (from the baseline
                        to the first chosen block's input), then per block
                        ``"<name>.attn.h<i>"`` per head (and
                        ``"<name>.attn.bias"``), the attention update split as
                        ``Σ_h W_O[:, head h] z_h (+ b)``, and ``"<name>.mlp"``;
                        needs ``sublayers``, ``block_parts`` and consecutive blocks.
                        ``"source"`` and ``"source_head"``: the attention update
                        split over the source positions it reads (per head).
                        ``"neuron"``: ``"<name>.attn"``, then the MLP update
                        split per neuron, ``"<name>.mlp.n<i>"``. ``"expert"``:
                        the MLP update of a mixture of experts split per
                        routed expert, ``"<name>.mlp.e<i>"``. Every name in
                        :data:`~captum_iglens.attr.granularities.GRANULARITIES`.
                        Default: ``"block"``.
            foil (int, list[int], Tensor or set[int], optional): Keyword only.
                        Contrastive target: attribute ``p(target) - p(foil)``.
                        A token id, one per example (a list of ``B`` ids or a
                        ``(B,)`` tensor), one per attributed position (a
                        ``(B, P)`` tensor), or a set of ids whose probabilities
                        are all subtracted. A foil equal to the target gives zero
                        credits. Default: None
            target_tokens (set[int] or Tensor, optional): Keyword only. A set of
                        token ids (e.g. every spelling of an answer) whose total
                        probability is attributed in place of the target's (a
                        set, list or 1-D tensor for every position, or a
                        ``(B, P, S)`` tensor padded with -1). ``target`` then
                        only labels the position (and is the model's greedy
                        token if None). With ``foil`` too, the score is
                        ``Σ_{y∈S} p(y) - Σ_{y∈F} p(y)``. Default: None

        Returns:
            **attributions** or 2-element tuple of **attributions**, **delta**:
            - **attributions** (*Tensor*, *list[Tensor]* or *tuple[Tensor]*):
              one tensor ``(B, P, d)`` per block (two with
              ``granularity="sublayer"``, one per column with ``"head"``) over
              the ``P`` attributed positions, in a list (a tuple) when ``layer``
              is a list (a tuple) or there are several. Summed over ``d``, it is
              the column's credit; zero at padding. Float64 for a float64 model,
              else float32.
            - **delta** (*Tensor*, returned if return_convergence_delta=True):
              ``Σ_layers Σ_d attributions - (f_model - f(h_base))``, measured
              against the model's real output distribution (``f`` is ``p(y)``,
              or the token-set / contrastive score); under a learned readout
              (:class:`~captum_iglens.readout.layer_readout.LayerReadout`) the
              attributions are the block parts only, and ``delta`` adds the
              lens-change parts (``Σ block + Σ lens - (f_model - f_0(h_base))``),
              so ``Σ attributions`` alone does not reach ``Δp``; zero at
              padding: ``(B,)``
              when one output is attributed per example (a ``(B, V)`` forward,
              an int ``positions``, a ``(t, v)`` target), else ``(B, P)``.
              :meth:`compute_convergence_delta` recomputes it.

        Examples::

            >>> lens = LayerIGLens.from_model(model)
            >>> ids = tokenizer("The capital of France is", return_tensors="pt")
            >>> attr, delta = lens.attribute(
            ...     ids.input_ids, return_convergence_delta=True)
            >>> len(attr), attr[0].shape  # one (B, T, d) tensor per block
        """
        check_settings(n_steps, method, internal_batch_size, attribute_to_layer_input)
        rule = estimator(method)
        rule.check_multiply_by_inputs(self.multiplies_by_inputs)
        chunk_rows = internal_batch_size or self.readout.rows_per_chunk()
        shape = self._granularity(granularity)
        shape.check_multiply_by_inputs(self.multiplies_by_inputs)
        path = self._trace(
            shape,
            inputs,
            baselines,
            target,
            additional_forward_args,
            positions,
            foil=foil,
            target_tokens=target_tokens,
        )
        route, split = self._route(shape), None
        if route is None:
            attrs = shape.attributions(
                rule,
                self._model_readout,
                path,
                n_steps,
                chunk_rows,
                grad_kwargs,
                self.multiplies_by_inputs,
            )
        else:
            split = self._learned_split(
                shape,
                rule,
                path,
                route,
                n_steps,
                chunk_rows,
                grad_kwargs=grad_kwargs,
                per_dimension=True,
            )
            attrs = split.block.to(work_dtype(path.points.dtype))
        per_layer = list(attrs.unbind(dim=2))
        out: _Attributions = (
            per_layer[0]
            if len(per_layer) == 1 and not isinstance(self.layer, list)
            else tuple(per_layer)
            if self._as_tuple
            else per_layer
        )
        if not return_convergence_delta:
            return out
        if not self.multiplies_by_inputs:  # the delta of the multiplied attributions
            points = path.points.to(attrs.dtype)
            attrs = attrs * points.diff(dim=2)
        with torch.no_grad():
            if split is not None:
                return out, _learned_delta(path, split, attrs.sum((-1, -2)))
            return out, self._delta(path, attrs.sum((-1, -2)), chunk_rows)

    @log_usage()
    def compute_convergence_delta(
        self,
        attributions: Union[Tensor, Sequence[Tensor]],
        start_point: BaselineType,
        end_point: Union[Tensor, Tuple[Tensor, ...]],
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        *,
        positions: PositionsType = None,
    ) -> Tensor:
        r"""
        The IG-Lens convergence delta of given attributions, in probability
        space: ``Σ_layers Σ_d attributions - (p_model(y) - f(h_base))``, the
        number :meth:`attribute` returns with ``return_convergence_delta=True``.
        It runs one forward pass of the model (and reads out ``h_base``), no
        backward pass.

        Args:

            attributions (Tensor or list[Tensor]): As returned by
                        :meth:`attribute` (with ``multiply_by_inputs=True``), at
                        either granularity: ``(B, P, d)`` per block or
                        sub-layer.
            start_point (scalar, Tensor, str or None): The ``baselines`` the
                        attributions were computed with (Captum's meaning of
                        the start point); None for ``h_0``.
            end_point (Tensor or tuple[Tensor, ...]): The ``inputs`` the
                        attributions were computed for.
            target (int, tuple, list or Tensor, optional): As in
                        :meth:`attribute`. Default: None
            additional_forward_args (Any, optional): As in :meth:`attribute`.
                        Default: None
            positions (int, list[int] or Tensor, optional): Keyword only. As in
                        :meth:`attribute`. Default: None

        Returns:
            *Tensor* of convergence deltas, zero at padding: ``(B,)`` when one
            output is attributed per example, else ``(B, P)`` (as
            :meth:`attribute` returns it).
        """
        parts = [attributions] if isinstance(attributions, Tensor) else attributions
        blocks = self._granularity("block")
        with torch.no_grad():
            path = self._trace(
                blocks,
                end_point,
                start_point,
                target,
                additional_forward_args,
                positions,
            )
            shape = tuple(path.targets.shape)
            if not parts or any(
                not isinstance(a, Tensor) or a.dim() != 3 or a.shape[:2] != shape
                for a in parts
            ):
                raise ValueError(
                    f"attributions: expected a tensor (or a list of tensors) of shape "
                    f"{shape + ('d',)} as attribute returns for these arguments"
                )
            credits = torch.stack([a.sum(-1) for a in parts]).sum(0)
            credits = credits.to(path.model_prob.device)
            chunk_rows = self.readout.rows_per_chunk()
            route = self._route(blocks)
            if route is not None:  # the attributions are block parts
                split = split_map(
                    estimator("prediction_aware"),
                    self._layer_readout,
                    path,
                    route,
                    1,
                    chunk_rows,
                )
                return _learned_delta(path, split, credits)
            return self._delta(path, credits, chunk_rows)

    def attribute_map(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        *,
        positions: PositionsType = None,
        granularity: Granularity = "block",
        method: str = "prediction_aware",
        n_steps: int = 50,
        internal_batch_size: Optional[int] = None,
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        top_k: int = 0,
    ) -> IGLensResult:
        r"""
        The token-by-layer map: each chosen block's scalar credit at every
        attributed position, with the logit-lens levels that come with it.

        With ``"prediction_aware"`` this is one forward pass of the model and
        ``B·P·(k+1)`` readouts, with no backward pass, under
        ``torch.inference_mode()``. With a Captum rule it sums the per-dimension
        attributions of :meth:`attribute`.

        Args:

            inputs (Tensor or tuple[Tensor, ...]): As in :meth:`attribute`; so
                        are ``baselines``, ``target``, ``additional_forward_args``,
                        ``positions`` and ``granularity``.
            method (str, optional): As in :meth:`attribute`.
                        Default: ``"prediction_aware"``.
            n_steps (int, optional): As in :meth:`attribute`; the map of
                        ``"prediction_aware"`` does not depend on it. Default: 50.
            internal_batch_size (int, optional): As in :meth:`attribute`.
                        Default: None.
            foil (int, list or Tensor, optional): As in :meth:`attribute`, and
                        so is ``target_tokens``; both are recorded in the result's
                        ``foils`` and ``target_sets``.
            top_k (int, optional): With ``top_k >= 1``, the result also holds
                        what each layer's readout predicts, from the same readout
                        chunks as the credits: ``top_ids`` and ``top_probs``
                        ``(B, P, k, top_k)``, ``entropy``, ``kl`` (from the model's
                        final distribution) and ``rank`` (of the target)
                        ``(B, P, k)``. At the last layer they are the model's own
                        output distribution's. Default: 0 (no views).

        Returns:
            :class:`~captum_iglens.IGLensResult` with ``attributions`` and ``lens``
            of shape ``(B, P, k)`` and ``delta`` of shape ``(B, P)``, always
            float32 and always credits (``multiply_by_inputs`` does not apply).
            With ``(t, v)`` targets, ``P`` runs over the distinct positions named
            and ``mask`` marks each example's own.
        """
        check_settings(n_steps, method, internal_batch_size, False)
        check_top_k(top_k, self.readout.vocab_size)
        rule = estimator(method)
        chunk_rows = internal_batch_size or self.readout.rows_per_chunk()
        shape = self._granularity(granularity)
        route = self._route(shape)
        grad_free = (
            torch.no_grad if shape.map_needs_gradients(rule) else torch.inference_mode
        )
        with grad_free():
            path = self._trace(
                shape,
                inputs,
                baselines,
                target,
                additional_forward_args,
                positions,
                foil=foil,
                target_tokens=target_tokens,
                top_k=top_k,
            )
            if route is not None:
                split = self._learned_split(
                    shape, rule, path, route, n_steps, chunk_rows, top_k
                )
                return self._learned_result(path, split, method, n_steps)
            readout = self._model_readout
            values, views = path_levels(readout, path, chunk_rows, top_k)
        credits = shape.credits(rule, readout, path, values, n_steps, chunk_rows)
        values = shape.levels(path, values)
        views = None if views is None else _column_views(shape, path, views)
        mask = path.mask
        credits = credits.float() * mask[..., None]
        values, model_prob = values.float(), path.model_prob.float()
        delta = (credits.sum(-1) - (model_prob - values[..., 0])) * mask
        return self._with_readout(
            IGLensResult(
                attributions=credits,
                levels=values[..., 1:],
                base_prob=values[..., 0],
                model_prob=model_prob,
                delta=delta,
                targets=path.targets,
                positions=path.positions,
                mask=mask,
                layer_names=path.names,
                method=method,
                n_steps=n_steps,
                target_sets=path.target_sets,
                foils=path.foils,
                **({} if views is None else _view_fields(views)),
            )
        )

    # ------------------------------------------------------------------ internals

    @property
    def _model_readout(self) -> Readout:
        """The model's own readout (that of a learned readout's last block)."""
        readout = self.readout
        return readout.base if isinstance(readout, LayerReadout) else readout

    @property
    def _layer_readout(self) -> LayerReadout:
        """The learned readout, where a route (:meth:`_route`) says there is one."""
        return cast(LayerReadout, self.readout)

    def _route(self, shape: PathGranularity) -> Optional[ReadoutPlan]:
        """The readouts of the columns under a learned readout; None under the
        logit readout, or where every translator on the path is the identity
        (the logit readout's numbers, exactly)."""
        if not isinstance(self.readout, LayerReadout):
            return None
        check_learned_readout(shape.name, self.readout.kind)
        blocks = shape.column_blocks()
        if blocks is None:
            blocks = shape.segment_blocks()
        assert blocks is not None  # granularities with learned_readout have them
        route = plan(self.readout, self.layers, blocks)
        return None if route.uniform else route

    def _learned_split(
        self,
        shape: PathGranularity,
        rule: Estimator,
        path: TracedPath,
        route: ReadoutPlan,
        n_steps: int,
        chunk_rows: int,
        top_k: int = 0,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        per_dimension: bool = False,
    ) -> ReadoutSplit:
        """The block and lens parts of the columns under a learned readout:
        columns that are segments (:func:`split_map`, :func:`split_attributions`)
        or components of segments (:func:`split_components`)."""
        readout = self._layer_readout
        if shape.column_blocks() is not None:
            if per_dimension:
                return split_attributions(
                    rule,
                    readout,
                    path,
                    route,
                    n_steps,
                    chunk_rows,
                    grad_kwargs,
                    self.multiplies_by_inputs,
                )
            return split_map(rule, readout, path, route, n_steps, chunk_rows, top_k)

        def columns(segments: SegmentReadout, ends: Tensor) -> Tensor:
            if per_dimension:
                return shape.segment_attributions(
                    rule, segments, path, ends, n_steps, chunk_rows, grad_kwargs
                )
            return shape.credits(rule, segments, path, ends, n_steps, chunk_rows)

        split = split_components(
            readout,
            path,
            route,
            shape.column_segments(len(path.names)),
            columns,
            chunk_rows,
            top_k,
        )
        views = None if split.views is None else _column_views(shape, path, split.views)
        return replace(split, levels=shape.levels(path, split.levels), views=views)

    def _with_readout(self, result: IGLensResult) -> IGLensResult:
        """The result of a learned readout whose translators on the path are
        all the identity: the logit readout's numbers, lens-change parts 0."""
        if not isinstance(self.readout, LayerReadout):
            return result
        return replace(
            result,
            lens_change=torch.zeros_like(result.attributions),
            readout_kind=self.readout.kind,
            readout_checksum=self.readout.checksum(),
        )

    def _learned_result(
        self, path: TracedPath, split: ReadoutSplit, method: str, n_steps: int
    ) -> IGLensResult:
        """The map under a learned readout: credits are block plus lens parts."""
        mask = path.mask
        credits = ((split.block + split.lens).float()) * mask[..., None]
        levels, model_prob = split.levels.float(), path.model_prob.float()
        delta = _learned_delta(path, split, split.block.sum(-1), one_output=False)
        return IGLensResult(
            attributions=credits,
            levels=levels[..., 1:],
            base_prob=levels[..., 0],
            model_prob=model_prob,
            delta=delta.float(),
            targets=path.targets,
            positions=path.positions,
            mask=mask,
            layer_names=path.names,
            method=method,
            n_steps=n_steps,
            target_sets=path.target_sets,
            foils=path.foils,
            lens_change=split.lens.float() * mask[..., None],
            readout_kind=self._layer_readout.kind,
            readout_checksum=self._layer_readout.checksum(),
            **({} if split.views is None else _view_fields(split.views)),
        )

    def _delta(self, path: TracedPath, credits: Tensor, chunk_rows: int) -> Tensor:
        """``credits - (f_model - f(h_base))`` from the credits ``(B, P)``, zero at
        padding; ``(B,)`` when one output is attributed per example."""
        b, p = path.targets.shape
        base_prob = path_values(
            self._model_readout,
            path.points[:, :, :1].flatten(0, 1),
            path.score.flatten(),
            chunk_rows,
        )[0].view(b, p)
        delta = (credits - (path.model_prob - base_prob)) * path.mask
        return delta.sum(-1) if path.one_output else delta

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

    def _trace(self, shape: PathGranularity, *args: Any, **kwargs: Any) -> TracedPath:
        """:meth:`Tracer.trace` of this lens, without gradients."""
        tracer = Tracer(self.forward_func, self.input_layer, self.readout)
        with torch.no_grad():
            return tracer.trace(shape, *args, **kwargs)


def _learned_delta(
    path: TracedPath, split: ReadoutSplit, block: Tensor, one_output: bool = True
) -> Tensor:
    r"""``Σ block parts + Σ lens parts - (f_model - f_0(h_base))`` from the
    block parts' sums ``(B, P)``, zero at padding; ``(B,)`` when one output is
    attributed per example (and ``one_output``)."""
    change = path.model_prob.double() - split.levels[..., 0].double()
    delta = (block.double() + split.lens.sum(-1) - change) * path.mask
    delta = delta.to(work_dtype(path.points.dtype))
    return delta.sum(-1) if path.one_output and one_output else delta


def _column_views(shape: PathGranularity, path: TracedPath, views: Views) -> Views:
    r"""
    The views of the path points ``(B, P, K)`` (points ``1 .. K``) as the views
    of the credit columns ``(B, P, n)``: each column shows the distribution of
    the path point whose level it reads. Which point that is comes from the
    granularity's own :meth:`~PathGranularity.levels`, applied to the points'
    indices, so every granularity's columns get their views the same way.
    """
    b, p, k_plus_1 = path.points.shape[:3]
    index = torch.arange(k_plus_1, device=views.rank.device).expand(b, p, k_plus_1)
    point = shape.levels(path, index)[0, 0, 1:].to(views.rank.device)
    return views[:, :, point - 1]


def _view_fields(views: Views) -> Dict[str, Any]:
    """The view fields of :class:`IGLensResult` (float32, like the credits)."""
    return dict(
        top_ids=views.top_ids,
        top_probs=views.top_probs.float(),
        entropy=views.entropy.float(),
        kl=views.kl.float(),
        rank=views.rank,
    )
