r"""LayerIGLens: exact layer-wise attribution of a token's probability."""

import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch
from captum._utils.common import _format_additional_forward_args, _run_forward
from captum._utils.typing import TargetType
from captum.attr import GradientAttribution, LayerAttribution
from captum.log import log_usage
from torch import Tensor
from torch.nn import Module, ModuleList

from captum_iglens.attr._utils.capture import PathPoint, ResidualCapture
from captum_iglens.attr._utils.checks import (
    BaselineType,
    Granularity,
    PositionsType,
    attention_mask_of,
    baseline_inputs,
    baseline_states,
    check_baselines,
    check_construction,
    check_granularity,
    check_settings,
    check_token_ids,
    format_inputs,
    forward_module,
    hf_model_of,
    output_logits,
    resolve_positions,
    resolve_targets,
    target_positions,
)
from captum_iglens.attr._utils.path_math import path_values, work_dtype
from captum_iglens.attr._utils.heads import (
    HeadSplit,
    check_consecutive,
    head_attributions,
    head_components,
    head_path_points,
    split_states,
    split_tolerance,
)
from captum_iglens.attr.estimators import Estimator, estimator
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import CausalLMForward
from captum_iglens.hf.parts import ModelParts
from captum_iglens.readout.readout import Readout
from captum_iglens.readout.scores import (
    FoilType,
    TokenScore,
    TokenSetType,
    Views,
    check_top_k,
    resolve_token_sets,
)
from captum_iglens.result import IGLensResult


#: One tensor per layer: alone, in a list, or in a tuple (as ``layer`` was given).
_Attributions = Union[Tensor, List[Tensor], Tuple[Tensor, ...]]


@dataclass
class _Path:
    """The captured path of every attributed row, and what the model said."""

    points: Tensor  # (B, P, k + 1, d): h_base, h_{L_1}, ..., h_{L_k}
    targets: Tensor  # (B, P)
    model_prob: Tensor  # (B, P)
    mask: Tensor  # (B, P)
    positions: Tensor  # (P,)
    names: List[str]  # one per credit column
    one_output: bool  # one attributed output per example: delta (B,)
    score: TokenScore  # (B, P, M): what f is (target, token set, foils)
    components: Optional[Tensor] = None  # (B, P, k, C, d): "head" only
    target_sets: Optional[Tensor] = None  # (B, P, S), PAD-padded
    foils: Optional[Tensor] = None  # (B, P, F), PAD-padded
    top_views: Optional[Views] = None  # (B, P): the model's own distribution
    final_logits: Optional[Callable[[slice], Tensor]] = None  # rows of (B·P)


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


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
        readout: Optional[Readout] = None,
        input_layer: Optional[Module] = None,
        layer_names: Optional[Sequence[str]] = None,
        sublayers: Optional[Sequence[Module]] = None,
        heads: Optional[HeadSplit] = None,
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
            readout (Readout, optional): What the model does between its last
                        block and its logits (final norm, head, final
                        transforms). Default: None, only when ``forward_func``
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
            heads (HeadSplit, optional): Each block's attention output
                        projection and the number of heads, for
                        ``granularity="head"`` (which also needs ``sublayers``).
                        Default: None
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
        if heads is not None and (
            not isinstance(heads, HeadSplit) or len(heads.projections) != len(layers)
        ):
            raise ValueError(
                f"heads: expected a HeadSplit with one projection per block "
                f"({len(layers)}), got {heads!r}"
            )
        self.heads = heads
        self._multiply_by_inputs = multiply_by_inputs
        self._as_tuple = isinstance(layer, tuple)

    @classmethod
    def from_model(
        cls,
        model: Union[Module, ModelParts],
        layers: Optional[Sequence[int]] = None,
        *,
        max_chunk_bytes: int = 256 * 2**20,
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
        layer, sublayers, projections = (
            None if modules is None else [modules[i] for i in chosen]
            for modules in (parts.blocks, parts.mid_modules, parts.attention_outputs)
        )
        return cls(
            CausalLMForward(parts.model),
            layer,
            readout=parts.readout(max_chunk_bytes=max_chunk_bytes),
            input_layer=parts.blocks[0],
            layer_names=[str(i) for i in chosen],
            sublayers=sublayers,
            heads=(
                None
                if projections is None
                else HeadSplit(projections, parts.n_heads, parts.attention_scale)
            ),
        )

    def segment_names(self, granularity: Granularity = "block") -> List[str]:
        r"""
        The names of the credited segments at a granularity: the layer names, or
        ``"<name>.attn"`` and ``"<name>.mlp"`` per block for ``"sublayer"``, or
        the columns of ``"head"`` (see :meth:`attribute`).

        Raises:
            ValueError: If the granularity is unknown or not available.
        """
        return self._path_points(granularity)[1]

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
                        needs ``sublayers``, ``heads`` and consecutive blocks.
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
              or the token-set / contrastive score), zero at padding: ``(B,)``
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
        with torch.no_grad():
            path = self._path(
                inputs,
                baselines,
                target,
                additional_forward_args,
                positions,
                granularity,
                foil=foil,
                target_tokens=target_tokens,
            )
        if path.components is not None:
            if not self.multiplies_by_inputs:
                raise ValueError(
                    "multiply_by_inputs: False is not supported with "
                    'granularity="head"; use "block" or "sublayer"'
                )
            with torch.no_grad():
                values = self._values(path, chunk_rows)[0]
            attrs = self._heads(
                path, values, rule, n_steps, chunk_rows, grad_kwargs, True
            )
        else:
            attrs = self._per_dimension(
                path,
                rule,
                n_steps,
                chunk_rows,
                grad_kwargs,
                self.multiplies_by_inputs,
            )
        per_layer = list(attrs.unbind(dim=2))
        out: _Attributions = (
            per_layer[0]
            if len(per_layer) == 1 and not isinstance(self.layer, list)
            else tuple(per_layer) if self._as_tuple else per_layer
        )
        if not return_convergence_delta:
            return out
        if not self.multiplies_by_inputs:  # the delta of the multiplied attributions
            points = path.points.to(attrs.dtype)
            attrs = attrs * points.diff(dim=2)
        with torch.no_grad():
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
        with torch.no_grad():
            path = self._path(
                end_point, start_point, target, additional_forward_args, positions
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
            chunk_rows = self.readout.rows_per_chunk()
            return self._delta(path, credits.to(path.model_prob.device), chunk_rows)

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

            inputs, baselines, target, additional_forward_args, positions,
            granularity: As in :meth:`attribute`.
            method (str, optional): As in :meth:`attribute`.
                        Default: ``"prediction_aware"``.
            n_steps (int, optional): As in :meth:`attribute`; the map of
                        ``"prediction_aware"`` does not depend on it. Default: 50.
            internal_batch_size (int, optional): As in :meth:`attribute`.
                        Default: None.
            foil, target_tokens: As in :meth:`attribute`; recorded in the
                        result's ``foils`` and ``target_sets``.
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
        grad_free = (
            torch.inference_mode
            if rule.gradient_free_map and granularity != "head"
            else torch.no_grad
        )
        with grad_free():
            path = self._path(
                inputs,
                baselines,
                target,
                additional_forward_args,
                positions,
                granularity,
                foil=foil,
                target_tokens=target_tokens,
                top_k=top_k,
            )
            values, views = self._values(path, chunk_rows, top_k)
        if path.components is not None:  # gradients along the attention segments
            with torch.no_grad():
                credits = self._heads(path, values, rule, n_steps, chunk_rows)
            values = self._head_levels(path, values)
        else:
            credits = self._credits(path, values, rule, n_steps, chunk_rows)
        mask = path.mask
        credits = credits.float() * mask[..., None]
        values, model_prob = values.float(), path.model_prob.float()
        delta = (credits.sum(-1) - (model_prob - values[..., 0])) * mask
        return IGLensResult(
            attributions=credits,
            lens=values[..., 1:],
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

    # ------------------------------------------------------------------ internals

    def _delta(self, path: _Path, credits: Tensor, chunk_rows: int) -> Tensor:
        """``credits - (f_model - f(h_base))`` from the credits ``(B, P)``, zero at
        padding; ``(B,)`` when one output is attributed per example."""
        b, p = path.targets.shape
        base_prob = path_values(
            self.readout,
            path.points[:, :, :1].flatten(0, 1),
            path.score.flatten(),
            chunk_rows,
        )[0].view(b, p)
        delta = (credits - (path.model_prob - base_prob)) * path.mask
        return delta.sum(-1) if path.one_output else delta

    def _values(
        self, path: _Path, chunk_rows: int, top_k: int = 0
    ) -> Tuple[Tensor, Optional[Views]]:
        """``f`` at every path point, ``(B, P, k + 1)``; the last is the model's own.
        With ``top_k``, the views of the ``k`` layers, ``(B, P, k)``, the last
        being the model's own distribution's."""
        b, p, k_plus_1 = path.points.shape[:3]
        below_top, below_views = path_values(
            self.readout,
            path.points[:, :, :-1].flatten(0, 1),
            path.score.flatten(),
            chunk_rows,
            top_k,
            path.final_logits,
        )
        values = torch.cat([below_top.view(b, p, -1), path.model_prob[..., None]], -1)
        if below_views is None or path.top_views is None:
            return values, None
        below = below_views.reshape(b, p, k_plus_1 - 1)
        layers = below[:, :, 1:]  # h_base has no view
        return values, Views.cat([layers, path.top_views[:, :, None]], dim=2)

    def _per_dimension(
        self,
        path: _Path,
        rule: Estimator,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        multiply_by_inputs: bool = True,
    ) -> Tensor:
        """Per-dimension attributions ``(B, P, k, d)``, zero at padding (the
        path-averaged gradients with ``multiply_by_inputs=False``)."""
        b, p, k_plus_1, d = path.points.shape
        attrs = rule.attributions(
            self.readout,
            path.points.flatten(0, 1),
            path.score.flatten(),
            path.model_prob.flatten(),
            n_steps,
            chunk_rows,
            grad_kwargs,
            multiply_by_inputs,
        )
        return attrs.view(b, p, k_plus_1 - 1, d) * path.mask[..., None, None]

    def _credits(
        self,
        path: _Path,
        values: Tensor,
        rule: Estimator,
        n_steps: int,
        chunk_rows: int,
    ) -> Tensor:
        """Scalar credits ``(B, P, k)`` from the values ``(B, P, k + 1)``."""
        b, p, k_plus_1 = values.shape
        credits = rule.credits(
            self.readout,
            path.points.flatten(0, 1),
            path.score.flatten(),
            values.flatten(0, 1),
            n_steps,
            chunk_rows,
        )
        return credits.view(b, p, k_plus_1 - 1)

    def _heads(
        self,
        path: _Path,
        values: Tensor,
        rule: Estimator,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        per_dimension: bool = False,
    ) -> Tensor:
        """Credits of ``granularity="head"``, ``(B, P, n)`` or ``(B, P, n, d)``."""
        b, p = path.targets.shape
        attrs = head_attributions(
            rule,
            self.readout,
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

    @staticmethod
    def _head_levels(path: _Path, values: Tensor) -> Tensor:
        """``f`` at the start and after each column: a head's column reads the
        level after its block's attention, ``f(h_mid)``."""
        c = path.components.shape[3]
        mids = values[..., 2:-1:2, None].expand(-1, -1, -1, c)
        per_column = torch.cat([mids, values[..., 3::2, None]], -1).flatten(2)
        return torch.cat([values[..., :2], per_column], -1)

    def _path(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType,
        target: TargetType,
        additional_forward_args: Optional[object],
        positions: PositionsType,
        granularity: Granularity = "block",
        *,
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        top_k: int = 0,
    ) -> _Path:
        formatted, batch, length = format_inputs(inputs)
        check_token_ids(self.forward_func, formatted[0])
        extra = _format_additional_forward_args(additional_forward_args)
        attention_mask = attention_mask_of(
            self.forward_func, formatted, extra, batch, length
        )
        named = target_positions(target, batch, length)
        if named is not None and positions is not None:
            raise ValueError(
                "positions: the target's (t, v) tuples already name the positions; "
                "leave positions=None (or pass token ids as target)"
            )
        pos = (
            resolve_positions(positions, length, attention_mask)
            if named is None
            else named.unique()
        )
        targets = resolve_targets(target, batch, len(pos), self.readout.vocab_size)
        target_sets, foils = resolve_token_sets(
            foil, target_tokens, batch, len(pos), self.readout.vocab_size
        )
        check_baselines(baselines)
        reference_inputs = baseline_inputs(baselines, formatted)
        points, names = self._path_points(granularity)

        device = next(self.readout.parameters()).device
        owner = forward_module(self.forward_func)
        in_eval = [self.readout] if owner is None else [self.readout, owner]
        capture = ResidualCapture(self.input_layer, points, pos, device, in_eval)
        with capture:
            output = _run_forward(self.forward_func, formatted, None, extra)
        h_0, outputs = capture.path()
        heads_in: List[Tensor] = []
        if granularity == "head":
            outputs, heads_in = split_states(outputs)
        if reference_inputs is not None:  # the first block's input for them
            with ResidualCapture(
                self.input_layer, [], pos, device, in_eval
            ) as reference:
                _run_forward(self.forward_func, reference_inputs, None, extra)
            h_0, baselines = reference.path()[0], None
        logits = output_logits(output, batch, length, self.readout.vocab_size)
        if logits.dim() == 2 and named is not None:
            raise ValueError(
                "target: forward_func returns last-position logits (B, V), which "
                "have no position axis; pass the token id alone (an int, (v,), or "
                "one per example), not (t, v)"
            )
        one_output = (
            logits.dim() == 2
            or named is not None
            or (
                isinstance(positions, (int, Tensor))
                and torch.as_tensor(positions).dim() == 0
            )
        )
        if logits.dim() == 2:  # last-position logits: only the last position
            if positions is not None and pos.tolist() != [length - 1]:
                raise ValueError(
                    "positions: forward_func returns last-position logits (B, V), "
                    f"so only position {length - 1} (or -1) can be attributed"
                )
            outputs, pos = [h[:, -1:] for h in outputs], pos[-1:]
            heads_in = [z[:, -1:] for z in heads_in]
            targets = None if targets is None else targets[:, -1:]
            target_sets = None if target_sets is None else target_sets[:, -1:]
            foils = None if foils is None else foils[:, -1:]
            logits, index = logits[:, None], torch.zeros(1, dtype=torch.long)
        else:
            index = pos
        mask = (
            torch.ones(batch, len(pos), dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.to(device)[:, pos].bool()
        )
        if named is not None:  # each example's own position only
            mask = mask & (pos[None, :] == named[:, None]).to(device)
        self._check_states(outputs, mask, names)
        if target_sets is not None:
            target_sets = target_sets.to(device)
        if foils is not None:
            foils = foils.to(device)
        targets, model_prob, top_views = self._read_output(
            logits, index, targets, mask, target_sets, foils, top_k
        )
        self._check_top(outputs[-1], logits, index, mask)
        pos = pos.to(device)
        base = baseline_states(baselines, h_0, attention_mask).index_select(1, pos)
        points = torch.stack([base, *outputs], dim=2)
        components = None
        if granularity == "head":
            tolerance = split_tolerance(points.dtype)
            components = head_components(self.heads, heads_in, points, mask, tolerance)
        return _Path(
            points=points,
            targets=targets,
            model_prob=model_prob,
            mask=mask,
            positions=pos,
            names=names,
            one_output=one_output,
            components=components,
            score=TokenScore.build(targets, target_sets, foils),
            target_sets=target_sets,
            foils=foils,
            top_views=top_views,
            final_logits=_final_rows(logits, index, device) if top_k else None,
        )

    def _path_points(
        self, granularity: Granularity
    ) -> Tuple[List[PathPoint], List[str]]:
        """The hooked modules of the path, and a name for each segment's credit."""
        check_granularity(granularity)
        if granularity == "block":
            return [(m, False) for m in self.layers], list(self.layer_names)
        if granularity == "head" and self.sublayers is not None:
            if self.heads is None:
                raise ValueError(
                    "granularity: 'head' needs each block's attention output "
                    "projection (heads=); from_model sets it from the architecture "
                    "table's attn_out, which is None for this architecture (no "
                    "split: e.g. Gemma 2/3 and OLMo 2 normalise the attention "
                    "output before adding it to the stream)"
                )
            check_consecutive(self.forward_func, self.layers)
            return head_path_points(
                self.layers, self.sublayers, self.heads, self.layer_names
            )
        if self.sublayers is None:
            raise ValueError(
                f"granularity: {granularity!r} needs the module in front of each "
                "block's MLP "
                "(sublayers=); from_model sets it except for architectures that add "
                "attention and MLP in parallel (GPT-J, Phi, Cohere, parallel Falcon, "
                "GPT-NeoX/StableLM with use_parallel_residual, ...), which have no "
                "residual state between the two, and for model types probed or "
                "registered without mid= (register_architecture(..., mid=...))"
            )
        points: List[PathPoint] = []
        names: List[str] = []
        for name, mid, block in zip(self.layer_names, self.sublayers, self.layers):
            points += [(mid, True), (block, False)]
            names += [f"{name}.attn", f"{name}.mlp"]
        return points, names

    @staticmethod
    def _check_states(outputs: List[Tensor], mask: Tensor, names: List[str]) -> None:
        for name, state in zip(names, outputs):
            if not torch.isfinite(state[mask]).all():
                raise ValueError(
                    f"layer: block {name} produced NaN or inf hidden states; check the "
                    "model's dtype and inputs"
                )

    def _read_output(
        self,
        logits: Tensor,
        index: Tensor,
        targets: Optional[Tensor],
        mask: Tensor,
        target_sets: Optional[Tensor] = None,
        foils: Optional[Tensor] = None,
        top_k: int = 0,
    ) -> Tuple[Tensor, Tensor, Optional[Views]]:
        """Targets (greedy unless given), the model's score ``f`` of them,
        ``(B, P)`` each, and with ``top_k`` the views of the model's own
        distribution, from the model's logits at the attributed positions; read
        in chunks of positions under the readout's memory budget."""
        batch, device = logits.shape[0], mask.device
        step = max(1, self.readout.rows_per_chunk() // batch)
        chosen, scores, views = [], [], []
        for start in range(0, len(index), step):
            cols = slice(start, start + step)
            rows = logits.index_select(1, index[cols].to(logits.device))
            work = work_dtype(rows.dtype)
            rows = rows.to(device=device, dtype=work)  # a copy we own
            if not torch.isfinite(rows.amax(-1))[mask[:, cols]].all():
                raise ValueError("forward_func: the model's logits contain NaN or inf")
            y = rows.argmax(-1) if targets is None else targets[:, cols].to(device)
            chosen.append(y)
            log_probs = torch.log_softmax(rows.flatten(0, 1), dim=-1)
            del rows  # free this chunk before the next is read
            score = TokenScore.build(
                y,
                None if target_sets is None else target_sets[:, cols],
                None if foils is None else foils[:, cols],
            ).flatten()
            scores.append(score.of(log_probs).view_as(y))
            if top_k:
                views.append(Views.of(log_probs, score, top_k, None).reshape(*y.shape))
            del log_probs
        targets = torch.cat(chosen, dim=1)
        found = Views.cat(views, dim=1) if views else None
        return targets, torch.cat(scores, dim=1), found

    def _check_top(
        self, h_final: Tensor, logits: Tensor, index: Tensor, mask: Tensor
    ) -> None:
        """The readout of the last block must reproduce the model's own logits,
        checked in full at one real position of every sequence."""
        first = mask.float().argmax(-1)  # one real position per sequence
        rows = torch.arange(h_final.shape[0], device=h_final.device)
        ours = self.readout(h_final[rows, first]).float()
        theirs = logits[rows.to(logits.device), index[first.cpu()].to(logits.device)]
        theirs = theirs.to(ours.device).float()
        scale = 1.0 + theirs.abs().max().item()
        error = (ours - theirs).abs().max().item()
        if error > _tolerance(h_final.dtype) * scale:
            raise ValueError(
                "layer/readout: the readout of the last block's output does not "
                f"reproduce the model's logits (max difference {error:.3g}). The last "
                "entry of `layer` must be the model's final block, and `readout` "
                "must be its final norm, head and final transforms."
            )


def _final_rows(
    logits: Tensor, index: Tensor, device: torch.device
) -> Callable[[slice], Tensor]:
    """The model's logits of flat rows ``(b, p)`` of the attributed positions, as
    float32 ``(n, V)`` on ``device``, a slice of rows at a time."""
    n_positions = len(index)

    def rows(part: slice) -> Tensor:
        flat = torch.arange(part.start, part.stop)
        picked = logits[flat // n_positions, index[flat % n_positions].cpu()]
        return picked.to(device=device, dtype=torch.float32)

    return rows


def _view_fields(views: Views) -> Dict[str, Tensor]:
    """The view fields of :class:`IGLensResult`."""
    return dict(
        top_ids=views.top_ids,
        top_probs=views.top_probs,
        entropy=views.entropy,
        kl=views.kl,
        rank=views.rank,
    )
