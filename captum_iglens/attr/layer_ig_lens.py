r"""LayerIGLens: exact layer-wise attribution of a token's probability."""

import contextlib
import typing
from dataclasses import replace
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import torch
from captum._utils.typing import TargetType
from captum.attr import GradientAttribution, LayerAttribution
from captum.log import log_usage
from torch import Tensor
from torch.nn import Module, ModuleList

from captum_iglens.attr._utils.checks import (
    BaselineType,
    PositionsType,
    check_construction,
    hf_model_of,
    summed_credits,
)
from captum_iglens.attr._utils.block_parts import BlockParts, check_block_parts
from captum_iglens.attr.column_readout import column_readout
from captum_iglens.attr.paths import integration_path
from captum_iglens.attr.ig_lens_path import IGLensPath
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import CausalLMForward
from captum_iglens.hf.parts import ModelParts
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.layer_readout import LensType, resolve_readout
from captum_iglens.readout.scores import (
    FoilType,
    TokenSetType,
)


#: One tensor per layer: alone, in a list, or in a tuple (as ``layer`` was given).
_Attributions = Union[Tensor, List[Tensor], Tuple[Tensor, ...]]


class LayerIGLens(IGLensPath, LayerAttribution, GradientAttribution):
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
        readout: Optional[LayerwiseReadout] = None,
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
            readout (LayerwiseReadout, optional): What the model does
                        between its last block and its logits (final norm,
                        head, final transforms): the logit readout, the same
                        at every layer. Any other
                        :class:`~captum_iglens.readout.interface.LayerwiseReadout`
                        (e.g. learned translators, ``LayerReadout``) reads each
                        block's output its own way; then every credit is a block
                        part plus a lens-change part (see
                        :meth:`attribute_map`). Default: None, only
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
        self.block_parts = check_block_parts(block_parts, len(layers))
        self._multiply_by_inputs = multiply_by_inputs
        self._as_tuple = isinstance(layer, tuple)

    @classmethod
    def from_model(
        cls,
        model: Union[Module, ModelParts],
        layers: Optional[Sequence[int]] = None,
        *,
        max_chunk_bytes: int = 256 * 2**20,
        lens: LensType = None,
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
            lens (str, Path, Translators or LayerwiseReadout, optional): A
                        readout per layer: a tuned-lens folder (``params.pt``
                        and ``config.json``; this model's cached fit is
                        ``captum_iglens.lens_fit.cached_lens(parts, tokenizer)``)
                        or :class:`~captum_iglens.readout.translators.Translators`,
                        refused, before any forward, if made for another model;
                        or a ``LayerwiseReadout`` of any kind, taken as it is.
                        ``"logit"`` is the model's own readout, as None.
                        Default: None (the logit readout)

        Returns:
            *LayerIGLens* on :class:`~captum_iglens.hf.forward.CausalLMForward`
            (called with ``input_ids`` and, optionally, ``attention_mask``), a
            list of blocks named by their indices, and ``sublayers`` and
            ``block_parts`` from the architecture table.
        """
        parts = model_parts(model)
        chosen = parts.choose(layers)
        readout = resolve_readout(
            parts.readout(max_chunk_bytes=max_chunk_bytes), lens, parts.blocks
        )
        return cls(
            CausalLMForward(parts.model),
            [parts.blocks[i] for i in chosen],
            readout=readout,
            input_layer=parts.blocks[0],
            layer_names=[str(i) for i in chosen],
            sublayers=None if parts.mid is None else [parts.mid[i] for i in chosen],
            block_parts=BlockParts.of_model(parts, chosen),
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
        n_steps: Optional[int] = None,
        method: Optional[str] = None,
        internal_batch_size: Optional[int] = None,
        *,
        return_convergence_delta: Literal[True],
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        positions: PositionsType = None,
        granularity: str = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        path: str = "telescoping",
    ) -> Tuple[_Attributions, Tensor]: ...

    @typing.overload
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        n_steps: Optional[int] = None,
        method: Optional[str] = None,
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: Literal[False] = False,
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        *,
        positions: PositionsType = None,
        granularity: str = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        path: str = "telescoping",
    ) -> _Attributions: ...

    @log_usage(part_of_slo=True)
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType = None,
        target: TargetType = None,
        additional_forward_args: Optional[object] = None,
        n_steps: Optional[int] = None,
        method: Optional[str] = None,
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: bool = False,
        attribute_to_layer_input: bool = False,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        *,
        positions: PositionsType = None,
        granularity: str = "block",
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        path: str = "telescoping",
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
                        Riemann rules). Default: None, the path's
                        (``default_steps``: 50 telescoping, 128 joint).
            method (str, optional): A name in :data:`~captum_iglens.ESTIMATORS`:
                        ``"prediction_aware"`` or ``"adaptive"`` (exact at any
                        ``n_steps``; see the estimators page), or Captum's
                        ``"riemann_*"`` and ``"gausslegendre"``, with their
                        discretisation error in ``delta``. Default: None, the
                        path's ``default_method``.
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
                        ``"source"`` (``"source_head"``): the attention split
                        per source position (and head); ``"neuron"``
                        (``"expert"``): the MLP split per neuron (routed expert):
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
            path (str, optional): Keyword only. As in :meth:`attribute_map`.
                        Default: ``"telescoping"``.

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
              or the token-set / contrastive score); under a readout per layer
              (:class:`~captum_iglens.readout.interface.LayerwiseReadout`) the
              attributions are the block parts only, and ``delta`` adds the
              lens-change parts (``Σ block + Σ lens - (f_model - f_0(h_base))``),
              so ``Σ attributions`` alone does not reach ``Δp``; zero at
              padding: ``(B,)``
              when one output is attributed per example (a ``(B, V)`` forward,
              an int ``positions``, a ``(t, v)`` target), else ``(B, P)``.
              :meth:`compute_convergence_delta` recomputes it.

        Examples::

            >>> ig_lens = LayerIGLens.from_model(model)
            >>> ids = tokenizer("The capital of France is", return_tensors="pt")
            >>> attr, delta = ig_lens.attribute(
            ...     ids.input_ids, return_convergence_delta=True)
            >>> len(attr), attr[0].shape  # one (B, T, d) tensor per block
        """
        plan = self._plan(
            method,
            n_steps,
            internal_batch_size,
            granularity,
            path,
            self.multiplies_by_inputs,
            attribute_to_layer_input,
            baselines is not None,
        )
        integration = replace(
            plan.integration, grad_kwargs=grad_kwargs, per_dimension=True
        )
        traced = self._trace(
            plan.granularity,
            inputs,
            baselines,
            target,
            additional_forward_args,
            positions,
            foil=foil,
            target_tokens=target_tokens,
        )
        attrs, delta_of = plan.columns.attributions(integration, traced)
        out = _per_layer(attrs, isinstance(self.layer, list), self._as_tuple)
        if not return_convergence_delta:
            return out
        if not self.multiplies_by_inputs:  # the delta of the multiplied attributions
            points = traced.points.to(attrs.dtype)
            attrs = attrs * points.diff(dim=2)
        with torch.no_grad():
            return out, delta_of(attrs.double().sum((-1, -2)))

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
        path: str = "telescoping",
    ) -> Tensor:
        r"""
        The IG-Lens convergence delta of given attributions, in probability
        space: ``Σ_layers Σ_d attributions - (p_model(y) - f(h_base))``, the
        number :meth:`attribute` returns with ``return_convergence_delta=True``.
        It runs one forward pass (reading out ``h_base``), no backward pass.

        Args:

            attributions (Tensor or list[Tensor]): As returned by
                        :meth:`attribute` (``multiply_by_inputs=True``): ``(B, P,
                        d)`` per block or per sub-layer, one for each, else a
                        ``ValueError``.
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
            path (str, optional): Keyword only. As in :meth:`attribute` (the
                        delta is the same on every path; the path is checked
                        against the readout). Default: ``"telescoping"``

        Returns:
            *Tensor* of convergence deltas, zero at padding: ``(B,)`` when one
            output is attributed per example, else ``(B, P)`` (as
            :meth:`attribute` returns it).
        """
        blocks, along = self._granularity("block"), integration_path(path)
        counts = _column_counts(self)
        with torch.no_grad():
            traced = self._trace(
                blocks,
                end_point,
                start_point,
                target,
                additional_forward_args,
                positions,
            )
            credits = summed_credits(attributions, traced.targets.shape, counts)
            credits = credits.to(traced.model_prob.device)
            columns = column_readout(self.readout, self.layers, blocks, along)
            return columns.delta(traced, credits, self.readout.rows_per_chunk())


def _column_counts(ig_lens: IGLensPath) -> Set[int]:
    """How many ``(B, P, d)`` tensors :meth:`LayerIGLens.attribute` returns per
    block and, where the model has them, per sub-layer."""
    counts = {len(ig_lens.segment_names("block"))}
    with contextlib.suppress(ValueError):  # a model without sub-layers
        counts.add(len(ig_lens.segment_names("sublayer")))
    return counts


def _per_layer(attrs: Tensor, is_list: bool, as_tuple: bool) -> _Attributions:
    """The columns of ``attrs`` ``(B, P, n, d)`` as Captum returns layers: one
    tensor alone (one column and ``layer`` not a list), else a list or a
    tuple, as ``layer`` was given."""
    per_layer = list(attrs.unbind(dim=2))
    if len(per_layer) == 1 and not is_list:
        return per_layer[0]
    return tuple(per_layer) if as_tuple else per_layer
