r"""
The runners of the methods the studies score (registered in
:mod:`~captum_iglens.studies.methods.registry`). Each takes the same
:class:`Work` (the inputs, positions, targets and blocks IG-Lens got) and returns
an :class:`Outcome` with a token-by-layer score.

The logit lens reads its levels from IG-Lens's own pass; DLA records the residual
stream with its own hooks on the same blocks; Captum's methods are Captum's own
classes, called through :class:`TargetProbability`.
"""

import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import captum
import torch
from captum.attr import LayerConductance, LayerIntegratedGradients
from torch import Tensor
from torch.nn import Module, Sequential

from captum_iglens.attr._utils.path_math import interleave
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.hf.forward import causal_lm_logits
from captum_iglens.hf.parts import ModelParts
from captum_iglens.readout import LogitDivide, LogitScale, Readout, Softcap
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings

_UNUSED_IN_GRAPH = "not have been used in the graph"


@dataclass
class Work:
    """What every method receives: the same inputs, targets, positions and blocks."""

    parts: ModelParts  # the model's, bound once
    ig_lens: LayerIGLens
    input_ids: Tensor  # (B, T)
    attention_mask: Optional[Tensor]  # (B, T)
    targets: Tensor  # (B, P)
    positions: Tensor  # (P,)
    model_prob: Tensor  # (B, P): the model's own probability of each target
    h0_prob: Tensor  # (B, P): f(h_0)
    settings: Settings  # IG-Lens's; n_steps and internal_batch_size also Captum's
    baseline_token: int  # the token of Captum's baseline input
    # Each method's outcome once run (or read from a pass already made), by name.
    outcomes: Dict[str, "Outcome"] = field(default_factory=dict, repr=False)
    # The lens under a learned readout per layer (a fitted lens), if any, and
    # its map once made.
    learned: Optional[LayerIGLens] = None
    learned_map: Optional[IGLensResult] = field(default=None, repr=False)

    @classmethod
    def from_map(
        cls,
        parts: ModelParts,
        ig_lens: LayerIGLens,
        input_ids: Tensor,
        attention_mask: Optional[Tensor],
        found: IGLensResult,
        h0_prob: Tensor,
        settings: Settings,
        baseline_token: int,
        learned: Optional[LayerIGLens] = None,
    ) -> "Work":
        """The work of the targets and positions of an IG-Lens map ``found``."""
        return cls(
            parts,
            ig_lens,
            input_ids,
            attention_mask,
            targets=found.targets.clone(),
            positions=found.positions.clone(),
            model_prob=found.model_prob.clone(),
            h0_prob=h0_prob.clone(),
            settings=settings,
            baseline_token=baseline_token,
            learned=learned,
        )

    @property
    def model(self) -> Module:
        """The (unwrapped) model."""
        return self.parts.model

    @property
    def extra(self) -> Optional[Tuple[Tensor]]:
        return None if self.attention_mask is None else (self.attention_mask,)

    def levels(self) -> Tuple[Tensor, List[str]]:
        """``(B, P, k + 1)``: ``f(h_0), f(h_{L_1}), ...``, from IG-Lens's own pass
        at the settings' granularity, and the names of the ``k`` columns."""
        result = self.ig_lens.attribute_map(
            self.input_ids,
            None,
            self.targets,
            self.extra,
            positions=self.positions,
            granularity=self.settings.granularity,
        )
        levels = torch.cat([result.base_prob[..., None], result.levels], -1).clone()
        return levels, result.layer_names

    def stream(self) -> Tensor:
        """One forward: rows ``(B·P, k + 1, d)`` of ``h_0, h_{L_1}, ..., h_{L_k}``."""
        return self._path("block").points.flatten(0, 1)

    def head_stream(self) -> Tuple[Tensor, Tensor, List[str]]:
        r"""
        One forward on the path of ``granularity="head"``: rows ``(B·P, 2k + 2,
        d)`` of ``h_0, h_in, h_mid(1), h_out(1), ...``, each column's displacement
        ``(B·P, n, d)`` (``h_in - h_0``, each head's ``u_h`` and the bias, each
        MLP's update), and the ``n`` column names.
        """
        path = self._path("head")
        stream = path.points
        updates = stream.float().diff(dim=2)[:, :, 0::2]  # "input" and the MLPs
        assert path.components is not None  # traced with the head granularity
        parts = interleave(updates.flatten(0, 1), path.components.flatten(0, 1))
        return stream.flatten(0, 1), parts, path.names

    def _path(self, granularity: str) -> TracedPath:
        """IG-Lens's path of the work's rows at ``granularity``."""
        return self.ig_lens.trace_path(
            self.input_ids,
            None,
            self.targets,
            self.extra,
            positions=self.positions,
            granularity=granularity,
        )

    def captum_rows(self) -> Tuple[Tensor, Tuple[Any, ...]]:
        """Each sequence once per position: ids ``(B·P, T)``, and ``F``'s other args."""
        p = len(self.positions)
        rows = self.input_ids.repeat_interleave(p, 0)
        mask = self.attention_mask
        return rows, (
            None if mask is None else mask.repeat_interleave(p, 0),
            self.positions.to(rows.device).repeat(self.input_ids.shape[0]),
            self.targets.flatten().to(rows.device),
        )


def default_baseline_token(model: Module) -> Optional[int]:
    r"""The token of Captum's baseline input when none is given: the config's
    ``pad_token_id``, else its ``bos_token_id``."""
    config = getattr(model, "config", None)
    token = getattr(config, "pad_token_id", None)
    return getattr(config, "bos_token_id", None) if token is None else token


@dataclass
class Outcome:
    """A method's ``(B, P, k)`` scores, what their sum should be, and ``Δp``."""

    scores: Tensor
    expected: Tensor
    prob_change: Tensor
    unit: str
    note: str
    delta: Optional[Tensor] = None
    layer_names: Optional[List[str]] = None  # when not the chosen blocks


class TargetProbability(Module):
    r"""
    ``F`` for Captum: the model's probability of ``target[i]`` at ``position[i]``
    of sequence ``i``, one scalar per sequence, from token ids or from
    ``inputs_embeds``. Position ids count from each sequence's first real token,
    as in :func:`~captum_iglens.hf.forward.causal_lm_logits`; logits are
    computed at ``position[i]`` only.

    The inputs are detached: the layer methods compared take gradients at a
    layer, never at ``F``'s inputs, and LayerConductance makes its interpolated
    embeddings require grad, so each layer output it keeps would otherwise hold
    the graph of every block before it, through all its internal batches.

    Args:

        model (transformers.PreTrainedModel): The causal LM.
        embeddings (bool): Take ``inputs_embeds`` (True) or ``input_ids`` (False).
    """

    def __init__(self, model: Module, embeddings: bool) -> None:
        super().__init__()
        self.model = model
        self.key = "inputs_embeds" if embeddings else "input_ids"

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Optional[Tensor],
        position: Tensor,
        target: Tensor,
    ) -> Tensor:
        logits = causal_lm_logits(
            self.model,
            **{self.key: inputs.detach()},
            attention_mask=attention_mask,
            logits_to_keep=position[:, None],
        )[:, 0]
        probs = logits.float().softmax(-1)
        return probs.gather(-1, target[:, None].to(probs.device))[:, 0]


def ig_lens(work: Work) -> Outcome:
    result = work.ig_lens.attribute_map(
        work.input_ids,
        target=work.targets,
        additional_forward_args=work.extra,
        positions=work.positions,
        **work.settings.map_kwargs(),
    )
    return ig_lens_outcome(result, work.settings)


def ig_lens_joint(work: Work) -> Outcome:
    r"""IG-Lens on the joint path, whatever the work's own path: every block's
    update integrated along ``h_0 → h_final`` at once."""
    settings = replace(work.settings, path="joint")
    result = work.ig_lens.attribute_map(
        work.input_ids,
        target=work.targets,
        additional_forward_args=work.extra,
        positions=work.positions,
        **settings.map_kwargs(),
    )
    return ig_lens_outcome(result, settings)


def ig_lens_outcome(result: IGLensResult, settings: Settings) -> Outcome:
    """IG-Lens's outcome from its map ``result``, made with ``settings``."""
    change = result.model_prob - result.base_prob
    start = "h_0" if settings.baselines is None else f"baselines={settings.baselines!r}"
    note = (
        f"{settings.estimator.replace('_', '-')} IG of f_y from {start} to h_final, "
        f"{result.path} path."
    )
    return Outcome(
        result.attributions,
        change,
        change,
        "probability",
        note,
        layer_names=result.layer_names,
    )


def _learned_map(work: Work) -> IGLensResult:
    """IG-Lens's map under the work's learned readout, made once."""
    if work.learned is None:
        raise ValueError(
            "methods: the fitted-lens methods need a learned readout (lens=, "
            "--lens DIR)"
        )
    if work.learned_map is None:
        work.learned_map = work.learned.attribute_map(
            work.input_ids,
            target=work.targets,
            additional_forward_args=work.extra,
            positions=work.positions,
            **work.settings.map_kwargs(),
        )
    return work.learned_map


def ig_lens_fitted(work: Work) -> Outcome:
    """IG-Lens under the learned readout: each block's whole term
    ``f_j(h_j) − f_{j−1}(h_{j−1})`` (block part plus lens-change part)."""
    outcome = ig_lens_outcome(_learned_map(work), work.settings)
    return replace(outcome, note="under the fitted lens: " + outcome.note)


def ig_lens_fitted_block(work: Work) -> Outcome:
    """IG-Lens under the learned readout, block parts only."""
    found = _learned_map(work)
    outcome = ig_lens_outcome(found, work.settings)
    return replace(
        outcome,
        scores=found.block_part,
        note="block parts under the fitted lens (lens-change parts left out)",
    )


def fitted_lens(work: Work) -> Outcome:
    """The learned readout's levels ``f_j(h_j)`` (the tuned lens's trajectory)."""
    found = _learned_map(work)
    levels = torch.cat([found.base_prob[..., None], found.levels], -1)
    outcome = logit_lens_outcome(levels, found.layer_names)
    return replace(outcome, note="fitted-lens " + outcome.note)


def logit_lens(work: Work) -> Outcome:
    return logit_lens_outcome(*work.levels())


def logit_lens_outcome(levels: Tensor, names: List[str]) -> Outcome:
    """The logit lens's outcome from the levels ``(B, P, k + 1)`` of
    :meth:`Work.levels` and the names of their ``k`` columns."""
    change = levels[..., -1] - levels[..., 0]
    note = "levels f(h_L), not attributions; their sum is set against Δp = p − f(h_0)."
    return Outcome(
        levels[..., 1:], change, change, "probability", note, layer_names=names
    )


def logit_lens_diff(work: Work) -> Outcome:
    return logit_lens_diff_outcome(*work.levels())


def logit_lens_diff_outcome(levels: Tensor, names: List[str]) -> Outcome:
    """The logit lens differences' outcome from the same levels as
    :func:`logit_lens_outcome`."""
    change = levels[..., -1] - levels[..., 0]
    note = (
        "first differences f(h_Lj) − f(h_Lj−1), from f(h_0): they telescope, and "
        "are IG-Lens's map when its baseline is h_0."
    )
    return Outcome(
        levels.diff(dim=-1), change, change, "probability", note, layer_names=names
    )


def _frozen_logits(
    readout: Readout, norm_kind: str, linear: bool
) -> Tuple[Callable[[Tensor, Tensor], Tensor], bool]:
    r"""
    ``ℓ̃(x; h_f)``: the logits of ``x`` through the readout with the final
    norm's scale taken from ``h_f``, which is affine in ``x`` when ``linear``
    (softcapping, not affine, is then left out); and whether softcapping was
    left out.
    """
    norm = readout.norm
    parts: List[Any] = list(norm) if isinstance(norm, Sequential) else [norm]
    norm, after = parts[0], parts[1:]
    centered = norm_kind == "layer"
    # OLMo's parameter-free LayerNorm stores no eps; it uses torch's default, 1e-5.
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-5))
    post = readout.post
    if post is not None and not isinstance(post, (LogitScale, LogitDivide, Softcap)):
        raise ValueError(f"dla: unsupported final transform {type(post).__name__}")
    skip_post = linear and isinstance(post, Softcap)

    def scale(h: Tensor) -> Tensor:
        h = h.float()
        h = h - h.mean(-1, keepdim=True) if centered else h
        return (h.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    def logits(x: Tensor, h_f: Tensor) -> Tensor:
        z = x
        if norm is not None:
            # norm(x) − norm(0) = weight · centred(x) / scale(x): rescale to h_f's.
            zero = norm(torch.zeros_like(x[:1]))
            z = (norm(x) - zero) * (scale(x) / scale(h_f)).to(x.dtype) + zero
        for module in after:
            z = module(z)
        out = readout.head(z)
        if post is not None and not skip_post:
            out = post(out)
        return out.float()

    return logits, skip_post


def _dla_columns(work: Work) -> Tuple[Tensor, Tensor, Optional[List[str]]]:
    """Rows ``(B·P, k + 1, d)`` of the path points, each column's update
    ``(B·P, n, d)`` (each head's output apart at the head granularity) and the
    column names when not the chosen blocks."""
    if work.settings.granularity == "head":  # each head's output u_h apart
        points, parts, names = work.head_stream()
        return points, parts.to(points.dtype), names
    points = work.stream()
    return points, points.diff(dim=1), None


def _frozen_rows(
    work: Work,
    rows: Tensor,
    h_final: Tensor,
    read: Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """``(B, P, width)``: ``read`` (logits to the target's score) of the
    ``(B·P, width, d)`` ``rows``, each at its token's ``h_final``, in chunks."""
    chunk = work.ig_lens.readout.rows_per_chunk()
    width = rows.shape[1]
    flat = rows.flatten(0, 1)
    h_f = h_final.repeat_interleave(width, 0)
    targets = work.targets.flatten().repeat_interleave(width).to(flat.device)
    values = torch.cat(
        [
            read(flat[c], h_f[c]).gather(-1, targets[c, None])[:, 0]
            for c in (slice(s, s + chunk) for s in range(0, flat.shape[0], chunk))
        ]
    )
    return values.view(*work.targets.shape, width)


def dla(work: Work) -> Outcome:
    readout = cast(Readout, work.ig_lens.readout)  # the work's IG-Lens reads logits
    logits, skip_post = _frozen_logits(readout, work.parts.norm_kind, linear=True)
    with torch.no_grad():
        points, parts, names = _dla_columns(work)
        zeros = points.new_zeros(points.shape[0], 1, points.shape[2])
        # Per token: 0, h_0, Δ_1, ..., Δ_k, h_final; all at h_final's norm scale.
        rows = torch.cat([zeros, points[:, :1], parts, points[:, -1:]], 1)
        values = _frozen_rows(work, rows, points[:, -1], logits)
    scores = values[..., 2:-1] - values[..., :1]  # the linear part: no biases
    where = " before softcapping" if skip_post else ""
    note = (
        f"update h_Lj − h_Lj−1 (from h_0) in logits{where}, final norm's scale from "
        "h_final; sums to logit(h_final) − logit(h_0) at that scale, read against "
        "Δp = p − f(h_0)."
    )
    if names is not None:
        note += " Per head: each head's output W_O[:, head] z_h (and the bias) apart."
    change = values[..., -1] - values[..., 1]
    return Outcome(
        scores, change, work.model_prob - work.h0_prob, "logit", note, None, names
    )


def dla_prob(work: Work) -> Outcome:
    r"""DLA mapped to probability: each column's update alone on ``h_0``,
    ``p̃(h_0 + Δ_j) − p̃(h_0)``, through the readout with the final norm's
    scale from ``h_final`` (DLA's), softmax over the whole vocabulary. Their
    sum is read against ``Δp``: how far DLA is from additive in probability."""
    readout = cast(Readout, work.ig_lens.readout)
    logits, _ = _frozen_logits(readout, work.parts.norm_kind, linear=False)

    def probs(x: Tensor, h_f: Tensor) -> Tensor:
        return logits(x, h_f).softmax(-1)

    with torch.no_grad():
        points, parts, names = _dla_columns(work)
        # Per token: h_0, h_0 + Δ_1, ..., h_0 + Δ_k; at h_final's norm scale.
        rows = torch.cat([points[:, :1], points[:, :1] + parts], 1)
        values = _frozen_rows(work, rows, points[:, -1], probs)
    change = work.model_prob - work.h0_prob
    note = (
        "each update alone on h_0, p̃(h_0 + Δ_j) − p̃(h_0), final norm's scale "
        "from h_final (DLA's, in probability); the sum is not Δp = p − f(h_0)."
    )
    scores = values[..., 1:] - values[..., :1]
    return Outcome(scores, change, change, "probability", note, None, names)


#: Memory that one of Captum's calls may hold at once (activations kept for the
#: backward pass), when ``internal_batch_size`` is not set.
CAPTUM_BUDGET = 1 << 30


def sequence_bytes(model: Module, length: int) -> int:
    """A generous estimate of the activations one sequence of ``length`` tokens
    keeps for a backward pass through ``model`` (float32)."""
    config: Any = model.config
    d = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * d
    heads = config.num_attention_heads
    per_token = 20 * d + 4 * inner + 2 * heads * length
    return 4 * config.num_hidden_layers * length * per_token


def _captum_chunks(work: Work, rows: Tensor) -> Tuple[int, int]:
    """Rows per Captum call and its ``internal_batch_size`` (interpolated
    sequences per forward/backward pass), under :data:`CAPTUM_BUDGET` unless
    the settings fix ``internal_batch_size``. LayerConductance needs at least
    two sequences per row in one pass, hence at most ``size // 2`` rows."""
    per_sequence = sequence_bytes(work.model, rows.shape[1])
    size = work.settings.internal_batch_size
    if size is None:
        size = CAPTUM_BUDGET // per_sequence
    size = max(size, 2)
    need, have = size * per_sequence, _machine_memory()
    if have is not None and need > have:
        warnings.warn(
            f"Captum's methods will need about {need / 2**30:.1f} GiB at once "
            f"(internal_batch_size={size}), more than this machine's "
            f"{have / 2**30:.1f} GiB; lower --internal-batch-size",
            stacklevel=2,
        )
    return max(1, min(len(rows), size // 2)), size


def _machine_memory() -> Optional[int]:
    """Physical memory in bytes, where the platform says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


@contextmanager
def _weights_frozen(model: Module) -> Iterator[None]:
    """The model's parameters do not require grad inside the block, so that no
    activation is kept for their gradients; their flags are restored on exit."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for parameter in trainable:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


def _detached(attributions: Any) -> Any:
    """A tensor, or a list of them, without the graph Captum built them with."""
    if isinstance(attributions, (list, tuple)):
        return [a.detach() for a in attributions]
    return attributions.detach()


def _attribute_in_chunks(
    method: Any,
    work: Work,
    rows: Tensor,
    baseline: Tensor,
    extra: Tuple[Any, ...],
    **kwargs: Any,
) -> Tuple[Any, Tensor]:
    """``method.attribute`` on groups of rows, so that memory stays bounded; the
    attributions (a tensor or a list of them) and deltas are joined."""
    group, size = _captum_chunks(work, rows)
    pieces, deltas = [], []
    for start in range(0, len(rows), group):
        cut = slice(start, start + group)
        with _weights_frozen(work.model):
            attributions, delta = method.attribute(
                rows[cut],
                baselines=baseline[cut],
                additional_forward_args=tuple(
                    None if a is None else a[cut] for a in extra
                ),
                n_steps=work.settings.steps,
                internal_batch_size=size,
                return_convergence_delta=True,
                **kwargs,
            )
        pieces.append(_detached(attributions))
        deltas.append(delta.detach().float())
    if isinstance(pieces[0], (list, tuple)):
        return [torch.cat(layer) for layer in zip(*pieces)], torch.cat(deltas)
    return torch.cat(pieces), torch.cat(deltas)


def _captum_per_block(work: Work, conductance: bool) -> Outcome:
    rows, extra = work.captum_rows()
    baseline = torch.full_like(rows, work.baseline_token)
    forward = TargetProbability(work.model, embeddings=conductance)
    if conductance:
        embed = cast(Any, work.model).get_input_embeddings()
        with torch.no_grad():
            rows, baseline = embed(rows), embed(baseline)
    totals, deltas = [], []
    for block in work.ig_lens.layers:
        method = (
            LayerConductance(forward, block)
            if conductance
            else LayerIntegratedGradients(forward, block)
        )
        attributions, delta = _attribute_in_chunks(method, work, rows, baseline, extra)
        totals.append(attributions.detach().float().flatten(1).sum(1))
        deltas.append(delta)
    shape = work.targets.shape
    scores = torch.stack(totals, -1).view(*shape, -1)
    delta = torch.stack(deltas, -1).view(*shape, -1)
    change = scores[..., 0] - delta[..., 0]  # F(x) − F(x'), the same for every block
    what = "LayerIntegratedGradients"
    if conductance:
        what = "LayerConductance on inputs_embeds"
    note = (
        f"{what}, one call per block, F = p(target), x' = token "
        f"{work.baseline_token} everywhere; each block's total ≈ F(x) − F(x') (up "
        "to delta), so Σ ≈ k·Δp."
    )
    return Outcome(scores, change, change, "probability", note, delta)


def layer_conductance(work: Work) -> Outcome:
    return _captum_per_block(work, conductance=True)


def layer_integrated_gradients(work: Work) -> Outcome:
    return _captum_per_block(work, conductance=False)


def layer_integrated_gradients_multilayer(work: Work) -> Outcome:
    rows, extra = work.captum_rows()
    call = (work, rows, torch.full_like(rows, work.baseline_token), extra)
    forward = TargetProbability(work.model, embeddings=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Multiple layers provided..."
        lig = LayerIntegratedGradients(forward, work.ig_lens.layers)
    try:
        attributions, delta = _attribute_in_chunks(lig, *call)
        happened = "the call on the list of blocks ran as it is"
    except RuntimeError as error:
        if _UNUSED_IN_GRAPH not in str(error):
            raise
        attributions, delta = _attribute_in_chunks(
            lig, *call, grad_kwargs={"materialize_grads": True}
        )
        happened = (
            f"Captum raised RuntimeError ({str(error).splitlines()[0]}); rerun with "
            "grad_kwargs={'materialize_grads': True} (cost counts both calls)"
        )
    shape = work.targets.shape
    totals = [a.detach().float().flatten(1).sum(1) for a in attributions]
    scores = torch.stack(totals, -1).view(*shape, -1)
    delta = delta.detach().float().view(shape)
    names = work.ig_lens.layer_names
    zeros = [name for name, s in zip(names, scores.unbind(-1)) if not s.any()]
    note = (
        f"LayerIntegratedGradients on all {len(names)} blocks at once (captum "
        f"{captum.__version__}): {happened}; all-zero blocks: {zeros or 'none'}."
    )
    change = scores.sum(-1) - delta
    return Outcome(scores, change, change, "probability", note, delta)
