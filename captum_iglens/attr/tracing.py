r"""
Path tracing: the inputs, targets and positions of a call resolved, the residual
stream captured along a path in one forward pass, and the model's own output
read and checked against the readout. Used by
:class:`~captum_iglens.attr.layer_ig_lens.LayerIGLens` and by the studies that
read the same path.
"""

from contextlib import nullcontext
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    ContextManager,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

import torch
from captum._utils.common import _format_additional_forward_args, _run_forward
from captum._utils.typing import TargetType
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import NEEDS, PathPoint, ResidualCapture
from captum_iglens.attr._utils.checks import (
    BaselineType,
    PositionsType,
    attention_mask_of,
    baseline_inputs,
    baseline_states,
    check_baselines,
    check_last_position_real,
    check_token_ids,
    format_inputs,
    forward_module,
    output_logits,
    resolve_positions,
    resolve_targets,
    target_positions,
)
from captum_iglens.attr._utils.path_math import path_values, work_dtype
from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import (
    FoilType,
    TokenScore,
    TokenSetType,
    Views,
    resolve_token_sets,
)


@dataclass
class TracedPath:
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


class TracedGranularity(Protocol):
    """What tracing needs of a granularity: the hooked points and the names of
    the credit columns, the residual states among the captured ones, and the
    components of the segments it splits."""

    def path_points(self) -> Tuple[List[PathPoint], List[str]]: ...

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]: ...

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]: ...

    def recording(
        self, positions: Tensor, device: torch.device
    ) -> ContextManager[Any]: ...

    def second_pass(
        self, positions: Tensor, device: torch.device
    ) -> Optional[ContextManager[Any]]: ...

    def column_names(self, names: List[str]) -> List[str]: ...


@dataclass
class _Request:
    """A call's inputs, positions and targets, resolved before any forward."""

    inputs: Tuple[Tensor, ...]
    extra: Any  # Captum's additional forward args
    batch: int
    length: int
    attention_mask: Optional[Tensor]  # (B, T)
    named: Optional[Tensor]  # (B,): each example's position, from (t, v) targets
    positions: Tensor  # (P,)
    targets: Optional[Tensor]  # (B, P)
    target_sets: Optional[Tensor]  # (B, P, S)
    foils: Optional[Tensor]  # (B, P, F)


class Tracer:
    r"""
    Traces the path of a lens: ``forward_func`` runs once with hooks on
    ``input_layer`` (``h_0``) and the points of a granularity, and ``readout``
    reads the model's output.

    Args:

        forward_func (Callable): As :class:`LayerIGLens` takes it.
        input_layer (Module): The model's first block.
        readout (PathReadout): The readout; read without a layer index, it is
                    the model's own (the last block's output).
    """

    def __init__(
        self,
        forward_func: Callable[..., Any],
        input_layer: Module,
        readout: PathReadout,
    ) -> None:
        self.forward_func = forward_func
        self.input_layer = input_layer
        self.readout = readout

    def trace(
        self,
        granularity: TracedGranularity,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        baselines: BaselineType,
        target: TargetType,
        additional_forward_args: Optional[object],
        positions: PositionsType,
        *,
        foil: FoilType = None,
        target_tokens: TokenSetType = None,
        top_k: int = 0,
    ) -> TracedPath:
        r"""
        The path of every attributed row, with ``inputs``, ... as
        :meth:`LayerIGLens.attribute` takes them.

        Args:

            granularity (TracedGranularity): What is hooked, what is split.

        Returns:
            :class:`TracedPath`.
        """
        request = self._resolve(
            inputs, target, additional_forward_args, positions, foil, target_tokens
        )
        check_baselines(baselines)
        reference_inputs = baseline_inputs(
            baselines, request.inputs, self.readout.vocab_size
        )
        hooked, names = granularity.path_points()
        with granularity.recording(request.positions, self.device):
            output, h_0, states, kept = self._capture(request.inputs, request, hooked)
        second = granularity.second_pass(request.positions, self.device)
        if second is not None:  # the traced forward stays the model's own
            with second:
                self._capture(request.inputs, request, [])
        states, extras = granularity.split(states)
        if reference_inputs is not None:  # the first block's input for them
            h_0 = self._capture(reference_inputs, request, [])[1]
            baselines = None
        n_kept = len(request.positions) if kept else 0
        logits = output_logits(
            output, request.batch, request.length, self.readout.vocab_size, n_kept
        )
        one_output = _one_output(request, logits, positions)
        index = torch.arange(n_kept) if kept else request.positions
        if logits.dim() == 2:  # last-position logits: only the last position
            states, extras = _last_position(request, positions, states, extras)
            logits, index = logits[:, None], torch.zeros(1, dtype=torch.long)
        mask = _mask(request, self.device)
        check_states(states, mask, names)
        target_sets, foils = (
            None if x is None else x.to(self.device)
            for x in (request.target_sets, request.foils)
        )
        targets, model_prob, top_views = self.read_output(
            logits, index, request.targets, mask, target_sets, foils, top_k
        )
        self.check_top(states[-1], logits, index, mask, states[0].shape[-1])
        pos = request.positions.to(self.device)
        start = baseline_states(baselines, h_0, request.attention_mask)
        points = torch.stack([start.index_select(1, pos), *states], dim=2)
        components = granularity.components(points, extras, mask)
        return TracedPath(
            points=points,
            targets=targets,
            model_prob=model_prob,
            mask=mask,
            positions=pos,
            names=granularity.column_names(names),
            one_output=one_output,
            components=components,
            score=TokenScore.build(targets, target_sets, foils),
            target_sets=target_sets,
            foils=foils,
            top_views=top_views,
            final_logits=_final_rows(logits, index, self.device) if top_k else None,
        )

    @property
    def device(self) -> torch.device:
        """The readout's device, where captured states and results go."""
        return self.readout.device

    def _resolve(
        self,
        inputs: Union[Tensor, Tuple[Tensor, ...]],
        target: TargetType,
        additional_forward_args: Optional[object],
        positions: PositionsType,
        foil: FoilType,
        target_tokens: TokenSetType,
    ) -> _Request:
        """The inputs, the attention mask, the positions and the targets."""
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
        vocab = self.readout.vocab_size
        targets = resolve_targets(target, batch, len(pos), vocab)
        target_sets, foils = resolve_token_sets(
            foil, target_tokens, batch, len(pos), vocab
        )
        return _Request(
            formatted,
            extra,
            batch,
            length,
            attention_mask,
            named,
            pos,
            targets,
            target_sets,
            foils,
        )

    def _capture(
        self,
        inputs: Tuple[Tensor, ...],
        request: _Request,
        hooked: Sequence[PathPoint],
    ) -> Tuple[Any, Tensor, List[Tensor], bool]:
        """One forward of ``inputs``: its output, ``h_0``, the hooked states and
        whether the output holds the attributed positions' logits only. They
        are kept alone where the forward can (a ``keeping`` context, as
        :class:`~captum_iglens.hf.forward.CausalLMForward` has) and all of them
        would not fit in one readout chunk (8 GiB at ``T = 16,384`` and a 128k
        vocabulary); the head's product over fewer rows can differ from the full
        forward's in its last bits, so shorter inputs read every logit."""
        owner = forward_module(self.forward_func)
        in_eval = [m for m in (self.readout, owner) if isinstance(m, Module)]
        capture = ResidualCapture(
            self.input_layer, hooked, request.positions, self.device, in_eval
        )
        keeping = getattr(self.forward_func, "keeping", None)
        fits = request.batch * request.length <= self.readout.rows_per_chunk()
        context = (
            nullcontext(False)
            if keeping is None or fits
            else keeping(request.positions)
        )
        with capture, context as kept:
            output = _run_forward(self.forward_func, inputs, None, request.extra)
        h_0, states = capture.path()
        return output, h_0, states, kept

    def read_output(
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

    def check_top(
        self,
        h_final: Tensor,
        logits: Tensor,
        index: Tensor,
        mask: Tensor,
        width: int,
    ) -> None:
        """The readout of the last block must reproduce the model's own logits,
        checked in full at one real position of every sequence. A readout that
        fails on an output as wide as the stream (``width``) fails on its own:
        its error goes through as raised."""
        first = mask.float().argmax(-1)  # one real position per sequence
        rows = torch.arange(h_final.shape[0], device=h_final.device)
        try:
            ours = self.readout(h_final[rows, first]).float()
        except RuntimeError as error:  # e.g. a layer whose output is no stream
            if h_final.shape[-1] == width:  # a stream: the model's own error
                raise
            raise ValueError(
                "layer/readout: the readout cannot read the last layer's output "
                f"(shape {tuple(h_final.shape)}): {str(error).splitlines()[0]}. "
                + NEEDS
            ) from None
        theirs = logits[rows.to(logits.device), index[first.cpu()].to(logits.device)]
        theirs = theirs.to(ours.device).float()
        scale = 1.0 + theirs.abs().max().item()
        gap = (ours - theirs).abs().max().item()
        if gap > _tolerance(h_final.dtype) * scale:  # a softmax forward's log?
            gap = _shifted_error(ours, theirs)
        if gap > _tolerance(h_final.dtype) * scale:
            raise ValueError(
                "layer/readout: the readout of the last block's output does not "
                f"reproduce the model's logits (max difference {gap:.3g}). The last "
                "entry of `layer` must be the model's final block, and `readout` "
                "must be its final norm, head and final transforms."
            )


def _shifted_error(ours: Tensor, theirs: Tensor) -> float:
    """The largest difference of the log-softmax of ``ours`` and ``theirs``
    rows, over the tokens of probability above 1e-17 (a forward returning
    probabilities gives logits up to a per-row constant, with its smallest
    probabilities cut off at the dtype's tiniest number)."""
    ours, theirs = ours.log_softmax(-1), theirs.log_softmax(-1)
    kept = theirs > -40.0
    return (ours - theirs)[kept].abs().max().item() if kept.any() else float("inf")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def _one_output(request: _Request, logits: Tensor, positions: PositionsType) -> bool:
    """Whether one output is attributed per example (a ``(B,)`` delta)."""
    if logits.dim() == 2 and request.named is not None:
        raise ValueError(
            "target: forward_func returns last-position logits (B, V), which "
            "have no position axis; pass the token id alone (an int, (v,), or "
            "one per example), not (t, v)"
        )
    return (
        logits.dim() == 2
        or request.named is not None
        or (
            isinstance(positions, (int, Tensor))
            and torch.as_tensor(positions).dim() == 0
        )
    )


def _last_position(
    request: _Request,
    positions: PositionsType,
    states: List[Tensor],
    extras: List[Tensor],
) -> Tuple[List[Tensor], List[Tensor]]:
    """The request and the captured states cut to the last position, for a
    forward that returns last-position logits ``(B, V)``."""
    length = request.length
    check_last_position_real(request.attention_mask)
    if positions is not None and request.positions.tolist() != [length - 1]:
        raise ValueError(
            "positions: forward_func returns last-position logits (B, V), "
            f"so only position {length - 1} (or -1) can be attributed"
        )
    request.positions = request.positions[-1:]
    request.targets, request.target_sets, request.foils = (
        None if x is None else x[:, -1:]
        for x in (request.targets, request.target_sets, request.foils)
    )
    return [h[:, -1:] for h in states], [z[:, -1:] for z in extras]


def _mask(request: _Request, device: torch.device) -> Tensor:
    """``(B, P)``: False at padding, and with ``(t, v)`` targets away from each
    example's own position."""
    pos = request.positions
    mask = (
        torch.ones(request.batch, len(pos), dtype=torch.bool, device=device)
        if request.attention_mask is None
        else request.attention_mask.to(device)[:, pos].bool()
    )
    if request.named is not None:  # each example's own position only
        mask = mask & (pos[None, :] == request.named[:, None]).to(device)
    return mask


def check_states(states: List[Tensor], mask: Tensor, names: List[str]) -> None:
    r"""
    Raises:
        ValueError: If a captured state is NaN or inf at a real position.
    """
    for name, state in zip(names, states):
        if not torch.isfinite(state[mask]).all():
            raise ValueError(
                f"layer: block {name} produced NaN or inf hidden states; check the "
                "model's dtype and inputs"
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


def path_levels(
    readout: PathReadout,
    path: TracedPath,
    chunk_rows: int,
    top_k: int = 0,
    layers: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Views]]:
    r"""
    ``f`` at every path point, ``(B, P, k + 1)``; the last is the model's own.
    ``layers`` ``(k,)``: the hidden-state index each point but the last is
    read as (None: the readout ignores it).

    Returns:
        2-element tuple of the levels and, with ``top_k``, the views of the
        ``k`` layers, ``(B, P, k)``, the last being the model's own
        distribution's (else None).
    """
    b, p, k_plus_1 = path.points.shape[:3]
    below_top, below_views = path_values(
        readout,
        path.points[:, :, :-1].flatten(0, 1),
        path.score.flatten(),
        chunk_rows,
        top_k,
        path.final_logits,
        layers,
    )
    values = torch.cat([below_top.view(b, p, -1), path.model_prob[..., None]], -1)
    if below_views is None or path.top_views is None:
        return values, None
    below = below_views.reshape(b, p, k_plus_1 - 1)
    above_base = below[:, :, 1:]  # h_base has no view
    return values, Views.cat([above_base, path.top_views[:, :, None]], dim=2)
