r"""
IG-Lens beside Layer Conductance, Layer Integrated Gradients, the logit lens and
Direct Logit Attribution, measured on the same work: the same inputs, targets,
positions and layers, a token-by-layer score from each method, how far each
method's sum over layers is from the change in probability it explains, and
what each method cost.
"""

import json
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import captum
import torch
from captum.attr import LayerConductance, LayerIntegratedGradients
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.estimators import path_values
from captum_iglens._utils.measure import Cost, measure, peak_memory_source
from captum_iglens.layer_ig_lens import BaselineType, LayerIGLens, PositionsType
from captum_iglens.readout import LogitDivide, LogitScale, Softcap

#: Methods accepted by :func:`compare`, in the order of its table.
METHODS: Tuple[str, ...] = (
    "ig_lens",
    "logit_lens",
    "logit_lens_diff",
    "dla",
    "layer_conductance",
    "layer_integrated_gradients",
    "layer_integrated_gradients_multilayer",
)
_COST_FIELDS = tuple(f.name for f in fields(Cost))


@dataclass
class MethodResult:
    r"""
    One method's token-by-layer map, for ``B`` sequences, ``P`` positions and ``k``
    layers, with its additivity check and its cost (the fields of
    :class:`~captum_iglens._utils.measure.Cost`). Padding positions hold zeros.

    Attributes:

        scores (Tensor): ``(B, P, k)`` float32, in ``unit``.
        expected (Tensor): ``(B, P)``: what the sum over layers should equal if
                    the method were additive in its own unit.
        prob_change (Tensor): ``(B, P)``: the change in the target's probability
                    over the method's path (``Δp``).
        unit (str): ``"probability"`` or ``"logit"``.
        note (str): What the method is, its baseline, and what happened.
        delta (Tensor, optional): Captum's convergence delta: ``(B, P, k)`` for
                    one call per layer, ``(B, P)`` for one call on all layers.
    """

    scores: Tensor
    expected: Tensor
    prob_change: Tensor
    unit: str
    note: str
    seconds: float
    peak_bytes: int
    forwards: int
    forward_sequences: int
    backwards: int
    backward_sequences: int
    readout_rows: int
    delta: Optional[Tensor] = None

    @property
    def layer_sum(self) -> Tensor:
        """``(B, P)``: the sum of the scores over layers."""
        return self.scores.sum(-1)

    @property
    def residual(self) -> Tensor:
        """``(B, P)``: the telescoping residual in probability, ``|Σ_layers − Δp|``."""
        return (self.layer_sum - self.prob_change).abs()


@dataclass
class ComparisonResult:
    r"""
    The methods' maps side by side (see :func:`compare`).

    Attributes:

        methods (dict[str, MethodResult]): One entry per method, in the order run.
        targets (Tensor): ``(B, P)`` long, the attributed token ids.
        positions (Tensor): ``(P,)`` long, the attributed positions.
        mask (Tensor): ``(B, P)`` bool, False at padding.
        layer_names (list[str]): The ``k`` chosen blocks.
        tokens (list[list[str]], optional): The targets as text.
        input_tokens (list[list[str]], optional): The input tokens at
                    ``positions``, as text.
        metadata (dict): Settings and versions; JSON-serialisable.
    """

    methods: Dict[str, MethodResult]
    targets: Tensor
    positions: Tensor
    mask: Tensor
    layer_names: List[str]
    tokens: Optional[List[List[str]]] = None
    input_tokens: Optional[List[List[str]]] = None
    metadata: Dict[str, Any] = field(default_factory=dict)

    def residual_stats(self, method: str) -> Tuple[float, float]:
        """The largest and the median residual of ``method`` over non-padding tokens."""
        residual = self.methods[method].residual[self.mask]
        return residual.max().item(), residual.median().item()

    def format_table(self) -> str:
        """The table: method, residual max / median, time, peak memory and passes."""
        head = (
            f"{'method':<38}{'resid max':>10}{'resid med':>10}{'time s':>8}"
            f"{'peak MiB':>9}{'fwd (seqs)':>14}{'bwd (seqs)':>14}{'readouts':>9}"
        )
        lines = [head, "-" * len(head)]
        for name, m in self.methods.items():
            top, median = self.residual_stats(name)
            lines.append(
                f"{name:<38}{top:>10.2e}{median:>10.2e}{m.seconds:>8.3f}"
                f"{m.peak_bytes / 2**20:>9.1f}{f'{m.forwards} ({m.forward_sequences})':>14}"
                f"{f'{m.backwards} ({m.backward_sequences})':>14}{m.readout_rows:>9}"
            )
        lines.append("")
        lines.append("residual = |Σ_layers score − Δp| per token, in probability.")
        lines += [f"{name}: {m.note}" for name, m in self.methods.items()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary (tensors as nested lists)."""
        methods = {}
        for name, m in self.methods.items():
            entry = {f.name: _plain(getattr(m, f.name)) for f in fields(m)}
            entry.update(layer_sum=_plain(m.layer_sum), residual=_plain(m.residual))
            methods[name] = entry
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        out["methods"] = methods
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ComparisonResult":
        """Inverse of :meth:`to_dict`."""
        methods = {}
        for name, entry in data["methods"].items():
            kwargs = {f.name: entry[f.name] for f in fields(MethodResult)}
            for key in ("scores", "expected", "prob_change", "delta"):
                if kwargs[key] is not None:
                    kwargs[key] = torch.tensor(kwargs[key], dtype=torch.float32)
            methods[name] = MethodResult(**kwargs)
        kwargs = {f.name: data[f.name] for f in fields(cls)}
        kwargs.update(
            methods=methods,
            targets=torch.tensor(data["targets"], dtype=torch.long),
            positions=torch.tensor(data["positions"], dtype=torch.long),
            mask=torch.tensor(data["mask"], dtype=torch.bool),
        )
        return cls(**kwargs)

    def save(self, path: Union[str, Path]) -> None:
        """Write the result as JSON."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Union[str, Path]) -> "ComparisonResult":
        """Read a result written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def plot(self, sequence: int = 0) -> Tuple[Any, Dict[str, Any]]:
        r"""
        Side-by-side heatmaps (layers across, the attributed tokens down a shared
        axis) of one sequence, and a bar chart of each method's residuals on a log
        scale. Needs matplotlib; works headless.

        Args:

            sequence (int, optional): Which sequence of the batch. Default: 0.

        Returns:
            2-element tuple of **figure**, **axes**: the ``matplotlib`` figure, and
            a dict from method name (and ``"residuals"``) to its axes.
        """
        import matplotlib.pyplot as plt

        names = list(self.methods)
        rows = self.mask[sequence].nonzero()[:, 0].tolist()
        labels = [self._label(sequence, i) for i in rows]
        width = max(8.0, 2.6 * len(names))
        fig = plt.figure(figsize=(width, 3.0 + 0.3 * len(rows) + 2.8))
        grid = fig.add_gridspec(2, len(names), height_ratios=[1.0 + 0.12 * len(rows), 1.0])
        axes: Dict[str, Any] = {}
        for col, name in enumerate(names):
            ax = fig.add_subplot(grid[0, col], sharey=axes.get(names[0]))
            scores = self.methods[name].scores[sequence, rows].numpy()
            top = max(float(abs(scores).max()), 1e-12)
            if (scores >= 0).all():
                image = ax.imshow(scores, cmap="viridis", vmin=0.0, vmax=top, aspect="auto")
            else:
                image = ax.imshow(scores, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
            fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
            ax.set_title(f"{name}\n({self.methods[name].unit})", fontsize=9)
            ax.set_xticks(range(len(self.layer_names)), self.layer_names, fontsize=7)
            ax.set_xlabel("layer", fontsize=8)
            ax.set_yticks(range(len(rows)), labels, fontsize=7)
            ax.tick_params(axis="y", labelleft=col == 0)
            axes[name] = ax
        bars = fig.add_subplot(grid[1, :])
        stats = [self.residual_stats(name) for name in names]
        floor = 1e-12
        x = torch.arange(len(names)).numpy()
        for offset, (label, column) in enumerate((("max", 0), ("median", 1))):
            values = [max(s[column], floor) for s in stats]
            bars.bar(x + (offset - 0.5) * 0.38, values, width=0.38, label=label)
        bars.set_yscale("log")
        bars.set_ylim(bottom=floor)
        bars.set_xticks(x, names, fontsize=8, rotation=12)
        bars.set_ylabel("|Σ_layers − Δp|  (probability)", fontsize=8)
        bars.set_title(f"Residuals (sequence {sequence}; floored at {floor:g})", fontsize=9)
        bars.legend(fontsize=8)
        axes["residuals"] = bars
        fig.tight_layout()
        return fig, axes

    def _label(self, sequence: int, row: int) -> str:
        position = int(self.positions[row])
        if self.tokens is None or self.input_tokens is None:
            return f"{position}→{int(self.targets[sequence, row])}"
        return f"{position} {self.input_tokens[sequence][row]!r}→{self.tokens[sequence][row]!r}"


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, Tensor) else value


class _TargetProbability(Module):
    r"""
    ``F`` for Captum: the model's probability of ``target[i]`` at ``position[i]``
    of sequence ``i``, one scalar per sequence, from token ids or from
    ``inputs_embeds``. Position ids count from each sequence's first real token,
    as in :class:`~captum_iglens.architectures.CausalLMForward`.
    """

    def __init__(self, model: Module, embeddings: bool) -> None:
        super().__init__()
        self.model = model
        self.key = "inputs_embeds" if embeddings else "input_ids"

    def forward(
        self, inputs: Tensor, attention_mask: Optional[Tensor], position: Tensor, target: Tensor
    ) -> Tensor:
        position_ids = (
            None
            if attention_mask is None
            else (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        )
        logits = self.model(
            **{self.key: inputs},
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=position[:, None],
            use_cache=False,
        ).logits[:, 0]
        return logits.float().softmax(-1).gather(-1, target[:, None].to(logits.device))[:, 0]


@dataclass
class _Work:
    """What every method receives: the same inputs, targets, positions and layers."""

    model: Module
    lens: LayerIGLens
    input_ids: Tensor
    attention_mask: Optional[Tensor]
    targets: Tensor  # (B, P)
    positions: Tensor  # (P,)
    model_prob: Tensor  # (B, P)
    h0_prob: Tensor  # (B, P): f(h_0)
    n_steps: int
    baselines: BaselineType
    baseline_token: int

    @property
    def extra(self) -> Optional[Tuple[Tensor]]:
        return None if self.attention_mask is None else (self.attention_mask,)

    def stream(self) -> Tuple[Tensor, Tensor]:
        """One forward: rows ``(B·P, k + 1, d)`` of ``h_0, h_{L_1} ... h_{L_k}``, and targets."""
        path = self.lens._path(self.input_ids, None, self.targets, self.extra, self.positions)
        return path.points.flatten(0, 1), path.targets.flatten()

    def captum_rows(self) -> Tuple[Tensor, Tuple[Any, ...]]:
        """Each sequence once per position: ids ``(B·P, T)`` and ``F``'s extra arguments."""
        p = len(self.positions)
        mask = self.attention_mask
        rows = self.input_ids.repeat_interleave(p, 0)
        extra = (
            None if mask is None else mask.repeat_interleave(p, 0),
            self.positions.to(rows.device).repeat(self.input_ids.shape[0]),
            self.targets.flatten().to(rows.device),
        )
        return rows, extra


_Outcome = Tuple[Tensor, Tensor, Tensor, str, str, Optional[Tensor]]


def _ig_lens(work: _Work) -> _Outcome:
    result = work.lens.attribute_map(
        work.input_ids, work.baselines, work.targets, work.extra,
        positions=work.positions, n_steps=work.n_steps,
    )
    change = result.model_prob - result.base_prob
    start = "h_0" if work.baselines is None else f"baselines={work.baselines!r}"
    note = f"prediction-aware IG of f_y along {start} -> h_L1 -> ... -> h_final."
    return result.attributions, change, change, "probability", note, None


def _levels(work: _Work) -> Tensor:
    points, targets = work.stream()
    chunk = work.lens.readout.rows_per_chunk()
    return path_values(work.lens.readout, points, targets, chunk).view(*work.targets.shape, -1)


def _logit_lens(work: _Work) -> _Outcome:
    levels = _levels(work)
    change = work.model_prob - levels[..., 0]
    note = "levels f(h_L) (not attributions); their sum is compared with Δp = p − f(h_0)."
    return levels[..., 1:], change, change, "probability", note, None


def _logit_lens_diff(work: _Work) -> _Outcome:
    levels = _levels(work)
    change = work.model_prob - levels[..., 0]
    note = (
        "first differences f(h_L_j) − f(h_L_{j−1}) from f(h_0); they telescope, and "
        "equal IG-Lens's map when its baseline is h_0."
    )
    return levels.diff(dim=-1), change, change, "probability", note, None


def _frozen_logit(work: _Work) -> Tuple[Callable[[Tensor, Tensor, Tensor], Tensor], str]:
    r"""``ℓ̃(x; h_f)[y]``: the target's logit of ``x`` with the final norm's scale taken from ``h_f``."""
    readout = work.lens.readout
    parts = list(readout.norm) if isinstance(readout.norm, torch.nn.Sequential) else [readout.norm]
    norm, after = parts[0], [m for m in parts[1:]]
    kind = type(norm).__name__
    centered = isinstance(norm, torch.nn.LayerNorm) or "LayerNorm" in kind
    if norm is not None and not (centered or "RMSNorm" in kind):
        raise ValueError(f"dla: the final norm {kind} is neither a LayerNorm nor an RMSNorm")
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-5))
    post = readout.post
    if post is not None and not isinstance(post, (LogitScale, LogitDivide, Softcap)):
        raise ValueError(f"dla: the final transform {type(post).__name__} is not supported")
    skip_post = isinstance(post, Softcap)

    def scale(h: Tensor) -> Tensor:
        h = h.float()
        h = h - h.mean(-1, keepdim=True) if centered else h
        return (h.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    def logit(x: Tensor, h_f: Tensor, targets: Tensor) -> Tensor:
        z = x
        if norm is not None:
            zero = norm(torch.zeros_like(x[:1]))
            z = (norm(x) - zero) * (scale(x) / scale(h_f)).to(x.dtype) + zero
        for module in after:
            z = module(z)
        logits = readout.head(z)
        if post is not None and not skip_post:
            logits = post(logits)
        return logits.float().gather(-1, targets[:, None].to(logits.device))[:, 0]

    where = "before softcapping (not linear), " if skip_post else ""
    return logit, where


def _dla(work: _Work) -> _Outcome:
    points, targets = work.stream()
    n, k_plus_1, d = points.shape
    logit, where = _frozen_logit(work)
    # Rows per token: 0, h_0, Δ_1 ... Δ_k, h_final; all with h_final's norm scale.
    rows = torch.cat(
        [points.new_zeros(n, 1, d), points[:, :1], points.diff(dim=1), points[:, -1:]], dim=1
    ).flatten(0, 1)
    h_final = points[:, -1].repeat_interleave(k_plus_1 + 2, 0)
    row_targets = targets.repeat_interleave(k_plus_1 + 2)
    chunk = work.lens.readout.rows_per_chunk()
    values = torch.cat(
        [
            logit(rows[s : s + chunk], h_final[s : s + chunk], row_targets[s : s + chunk])
            for s in range(0, rows.shape[0], chunk)
        ]
    ).view(*work.targets.shape, k_plus_1 + 2)
    scores = values[..., 2:-1] - values[..., :1]
    logit_change = values[..., -1] - values[..., 1]
    note = (
        f"each update h_L_j − h_L_{{j−1}} (from h_0) through the head {where}with the "
        "final norm's scale from h_final; sums to logit(h_final) − that of h_0 "
        "(same scale), not to Δp = p − f(h_0)."
    )
    return scores, logit_change, work.model_prob - work.h0_prob, "logit", note, None


def _captum_per_layer(work: _Work, conductance: bool) -> _Outcome:
    rows, extra = work.captum_rows()
    baseline = torch.full_like(rows, work.baseline_token)
    forward = _TargetProbability(work.model, embeddings=conductance)
    if conductance:
        embed = work.model.get_input_embeddings()
        with torch.no_grad():
            rows, baseline = embed(rows), embed(baseline)
    totals, deltas = [], []
    for block in work.lens.layers:
        method = LayerConductance(forward, block) if conductance else (
            LayerIntegratedGradients(forward, block)
        )
        attributions, delta = method.attribute(
            rows, baselines=baseline, additional_forward_args=extra,
            n_steps=work.n_steps, return_convergence_delta=True,
        )
        totals.append(attributions.detach().float().flatten(1).sum(1))
        deltas.append(delta.detach().float())
    shape = work.targets.shape
    scores = torch.stack(totals, -1).view(*shape, -1)
    delta = torch.stack(deltas, -1).view(*shape, -1)
    change = scores[..., 0] - delta[..., 0]  # F(x) − F(x'), the same for every layer
    name = "LayerConductance over inputs_embeds" if conductance else (
        "LayerIntegratedGradients over input_ids"
    )
    note = (
        f"{name}, one call per block; F = p(target), baseline = token "
        f"{work.baseline_token} at every position; each block's total ≈ F(x) − F(x')."
    )
    return scores, change, change, "probability", note, delta


def _layer_conductance(work: _Work) -> _Outcome:
    return _captum_per_layer(work, conductance=True)


def _layer_integrated_gradients(work: _Work) -> _Outcome:
    return _captum_per_layer(work, conductance=False)


def _lig_multilayer(work: _Work) -> _Outcome:
    rows, extra = work.captum_rows()
    kwargs = dict(
        baselines=torch.full_like(rows, work.baseline_token), additional_forward_args=extra,
        n_steps=work.n_steps, return_convergence_delta=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Multiple layers provided..."
        lig = LayerIntegratedGradients(_TargetProbability(work.model, False), work.lens.layers)
    try:
        attributions, delta = lig.attribute(rows, **kwargs)
        happened = "the call on the list of blocks ran as is"
    except RuntimeError as error:
        first = str(error).splitlines()[0]
        attributions, delta = lig.attribute(
            rows, **kwargs, grad_kwargs={"materialize_grads": True}
        )
        happened = (
            f"on the list of blocks Captum raised RuntimeError ({first}); rerun with "
            "grad_kwargs={'materialize_grads': True} (this row's cost includes both calls)"
        )
    shape = work.targets.shape
    scores = torch.stack(
        [a.detach().float().flatten(1).sum(1) for a in attributions], -1
    ).view(*shape, -1)
    delta = delta.detach().float().view(shape)
    change = scores.sum(-1) - delta
    zeros = [name for name, s in zip(work.lens.layer_names, scores.unbind(-1)) if not s.any()]
    note = (
        f"LayerIntegratedGradients, one call on the list of all {scores.shape[-1]} "
        f"blocks (captum {captum.__version__}): {happened}; blocks with all-zero "
        f"scores: {zeros or 'none'}."
    )
    return scores, change, change, "probability", note, delta


_RUNNERS: Dict[str, Callable[[_Work], _Outcome]] = {
    "ig_lens": _ig_lens,
    "logit_lens": _logit_lens,
    "logit_lens_diff": _logit_lens_diff,
    "dla": _dla,
    "layer_conductance": _layer_conductance,
    "layer_integrated_gradients": _layer_integrated_gradients,
    "layer_integrated_gradients_multilayer": _lig_multilayer,
}


def compare(
    model: Module,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    positions: PositionsType = None,
    target: Union[None, int, Sequence[int], Tensor] = None,
    layers: Optional[Sequence[int]] = None,
    methods: Sequence[str] = METHODS,
    n_steps: int = 32,
    baselines: BaselineType = None,
    baseline_token: Optional[int] = None,
    tokenizer: Optional[Any] = None,
) -> ComparisonResult:
    r"""
    Runs each method on the same inputs, targets, positions and layers, and
    measures each: a token-by-layer score ``(B, P, k)``, its sum over layers, the
    telescoping residual ``|Σ_layers − Δp|`` in probability, wall time, peak memory,
    and passes through the model.

    The methods (the names of :data:`METHODS`):

    - ``"ig_lens"``: :meth:`LayerIGLens.attribute_map`; its credits sum to
      ``Δp = p_model − f(h_base)``.
    - ``"logit_lens"``: the levels ``f(h_L)``. Levels, not attributions: their sum
      is compared with ``Δp = p_model − f(h_0)`` only to show that it means nothing.
    - ``"logit_lens_diff"``: the first differences of those levels, from
      ``f(h_0)``. They telescope; with IG-Lens's default baseline they are
      IG-Lens's map (the gradient theorem); IG-Lens adds the per-dimension split.
    - ``"dla"``: Direct Logit Attribution. Block ``L_j`` gets the update
      ``h_{L_j} − h_{L_{j−1}}`` (from ``h_0``; the updates of the blocks between
      two chosen ones together) through the final norm with its scale frozen at
      ``h_final`` (centring kept for a LayerNorm, the norm's weight applied, its
      bias left out), any output projection, and the head, without the head's
      bias: the convention of TransformerLens's ``apply_ln_to_stack`` with the
      final scale. Final-logit softcapping is not linear and is left out;
      Cohere's and Granite's logit scaling are kept. In logits, the scores sum to
      ``logit(h_final) − ℓ̃(h_0)``, the target's logit minus that of ``h_0`` read
      with the same frozen scale. The residual in probability shows what comes of
      reading these logit sums as ``Δp = p_model − f(h_0)``.
    - ``"layer_conductance"``: Captum's :class:`~captum.attr.LayerConductance`,
      one call per chosen block (it takes one layer). It interpolates the model's
      inputs, so ``F`` runs the model on ``inputs_embeds`` (the embedding module's
      output for the ids, which the model treats as it treats the ids).
    - ``"layer_integrated_gradients"``: Captum's
      :class:`~captum.attr.LayerIntegratedGradients`, one call per chosen block,
      with ``F`` on token ids.
    - ``"layer_integrated_gradients_multilayer"``: one LayerIntegratedGradients
      call on the list of chosen blocks. Captum 0.9.0 raises ``RuntimeError``
      because the blocks depend on each other; the retry with
      ``grad_kwargs={"materialize_grads": True}`` returns zeros for every block
      but the last. Both are recorded in the note.

    For Captum's methods ``F(x)`` is the model's probability of the target at the
    position, one scalar per (sequence, position): each sequence is repeated once
    per position, so one call attributes all positions. Every block's total is
    the whole ``F(x) − F(x')`` (up to Captum's convergence delta), so the sum over
    ``k`` blocks is about ``k`` times the change.

    **Baseline of Captum's methods.** The input ``x'`` with one token,
    ``baseline_token``, at every position: its embedding for LayerConductance,
    the same ids for LayerIntegratedGradients, so both run from the same ``x'``.
    It is the same at every position, as IG-Lens's baselines are, and it is a real
    token, so ``x'`` is an input the model was trained on, unlike the zero
    embedding (which LayerIntegratedGradients on ids could not use). IG-Lens's own
    default baseline, ``h_0``, cannot be used: ``h_0`` is the input's own
    embedding, and ``x' = x`` would give ``F(x) − F(x') = 0``.

    Args:

        model (transformers.PreTrainedModel): A causal LM of a supported
                    architecture, in eval mode.
        input_ids (Tensor): ``(B, T)`` token ids.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at (left) padding.
                    Default: None
        positions (int, list[int] or Tensor, optional): Positions to attribute.
                    Default: every non-padding position.
        target (int, list[int] or Tensor, optional): As in
                    :meth:`LayerIGLens.attribute`. Default: None (the model's greedy
                    prediction at each position).
        layers (list[int], optional): Indices of the chosen blocks; the last block
                    is always added. Default: all blocks.
        methods (list[str], optional): Names from :data:`METHODS`.
                    Default: all of them.
        n_steps (int, optional): Steps of every integral (Captum's default rule,
                    ``"gausslegendre"``, for Captum's methods). Default: 32.
        baselines (scalar, Tensor or str, optional): IG-Lens's baseline, as in
                    :meth:`LayerIGLens.attribute`. The lenses and DLA start at
                    ``h_0``. Default: None (``h_0``).
        baseline_token (int, optional): The token of Captum's baseline input.
                    Default: ``model.config.pad_token_id``, else its
                    ``bos_token_id``.
        tokenizer (PreTrainedTokenizerBase, optional): To label tokens as text.
                    Default: None

    Returns:
        :class:`ComparisonResult`; print it for the table.

    Peak memory is read with :func:`~captum_iglens._utils.measure.measure` (on CPU
    a lower bound: the growth of resident memory during the method).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"methods: expected names from {list(METHODS)}, got {list(methods)}")
    config = getattr(model, "config", None)
    if baseline_token is None:
        pad, bos = getattr(config, "pad_token_id", None), getattr(config, "bos_token_id", None)
        baseline_token = pad if pad is not None else bos
    if not isinstance(baseline_token, int):
        raise ValueError(
            "baseline_token: the model's config has no pad_token_id or bos_token_id; "
            "pass the token id of Captum's baseline input"
        )
    lens = LayerIGLens.from_model(model, layers)
    extra = None if attention_mask is None else (attention_mask,)
    with torch.no_grad():
        path = lens._path(input_ids, None, target, extra, positions)
        h0_prob = path_values(
            lens.readout, path.points[:, :, :1].flatten(0, 1), path.targets.flatten(),
            lens.readout.rows_per_chunk(),
        ).view(path.targets.shape)
    work = _Work(
        model, lens, input_ids, attention_mask, path.targets, path.positions,
        path.model_prob, h0_prob, n_steps, baselines, baseline_token,
    )
    device = next(lens.readout.parameters()).device
    mask = path.mask
    results: Dict[str, MethodResult] = {}
    for name in dict.fromkeys(methods):
        with measure(model, lens.readout.head, device) as cost:
            scores, expected, change, unit, note, delta = _RUNNERS[name](work)
        masked = mask if delta is None or delta.dim() == 2 else mask[..., None]
        results[name] = MethodResult(
            scores=scores.float().cpu() * mask[..., None].cpu(),
            expected=expected.float().cpu() * mask.cpu(),
            prob_change=change.float().cpu() * mask.cpu(),
            unit=unit,
            note=note,
            delta=None if delta is None else delta.cpu() * masked.cpu(),
            **{key: getattr(cost, key) for key in _COST_FIELDS},
        )
    tokens = input_tokens = None
    if tokenizer is not None:
        at = input_ids[:, path.positions.to(input_ids.device)]
        tokens = [[tokenizer.decode([int(t)]) for t in row] for row in path.targets]
        input_tokens = [[tokenizer.decode([int(t)]) for t in row] for row in at]
    metadata = dict(
        n_steps=n_steps,
        ig_lens_baseline="h_0" if baselines is None else repr(baselines),
        baseline_token=baseline_token,
        peak_memory=peak_memory_source(device),
        captum=captum.__version__,
        torch=torch.__version__,
        model=type(model).__name__,
    )
    return ComparisonResult(
        results, path.targets.cpu(), path.positions.cpu(), mask.cpu(),
        list(lens.layer_names), tokens, input_tokens, metadata,
    )
