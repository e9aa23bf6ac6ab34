r"""
IG-Lens beside Captum's LayerConductance and LayerIntegratedGradients, the logit
lens and Direct Logit Attribution, measured on the same work: for the same
inputs, targets, positions and layers, each method's token-by-layer score, how far
its sum over layers is from the change in probability (the telescoping residual),
and what it cost (time, peak memory, passes through the model).

A tuned lens is not compared: it needs a trained translator per layer.
"""

import json
import textwrap
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import captum
import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.compared import RUNNERS, Work
from captum_iglens._utils.measure import Cost, measure, peak_memory_source
from captum_iglens.layer_ig_lens import BaselineType, LayerIGLens, PositionsType

#: The methods :func:`compare` runs, in the order of its table.
METHODS: Tuple[str, ...] = tuple(RUNNERS)
_COST_FIELDS = tuple(f.name for f in fields(Cost))
_TENSORS = ("scores", "expected", "prob_change", "delta")


@dataclass
class MethodResult:
    r"""
    One method's token-by-layer map for ``B`` sequences, ``P`` positions and ``k``
    layers, with its additivity check and its cost. Padding positions hold zeros.

    Attributes:

        scores (Tensor): ``(B, P, k)`` float32, in ``unit``.
        expected (Tensor): ``(B, P)``: what the sum over layers should equal if
                    the method were additive in its own unit (``Δp`` for IG-Lens,
                    ``F(x) − F(x')`` for Captum's methods, the logit difference
                    for DLA).
        prob_change (Tensor): ``(B, P)``: the change in the target's probability
                    over the method's path, ``Δp``.
        unit (str): ``"probability"`` or ``"logit"``.
        note (str): What the method computed, from which baseline, and what
                    happened.
        seconds, peak_bytes, forwards, forward_sequences, backwards,
        backward_sequences, readout_rows: The cost, see
                    :class:`~captum_iglens._utils.measure.Cost`.
        delta (Tensor, optional): Captum's convergence delta, ``Σ attributions −
                    (F(x) − F(x'))``: ``(B, P, k)`` for one call per block,
                    ``(B, P)`` for one call on all blocks; None for the others.
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
    The methods' maps side by side; see :func:`compare`.

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

    def residual_stats(
        self, method: str, sequence: Optional[int] = None
    ) -> Tuple[float, float]:
        r"""
        The largest and the median residual of ``method`` over the non-padding
        tokens of every sequence, or of ``sequence`` only.
        """
        residual, mask = self.methods[method].residual, self.mask
        if sequence is not None:
            residual, mask = residual[sequence], mask[sequence]
        return residual[mask].max().item(), residual[mask].median().item()

    def format_table(self) -> str:
        """The table: method, residual max / median, time, peak memory, passes."""
        b, p = self.targets.shape
        head = (
            f"{'method':<38}{'resid max':>10}{'resid med':>10}{'time s':>8}"
            f"{'peak MiB':>9}{'fwd (seqs)':>12}{'bwd (seqs)':>12}{'readouts':>9}"
        )
        lines = [
            f"{b} sequence(s) x {p} position(s) x {len(self.layer_names)} blocks "
            f"({', '.join(self.layer_names)}); n_steps={self.metadata.get('n_steps')}",
            head,
            "-" * len(head),
        ]
        for name, m in self.methods.items():
            top, median = self.residual_stats(name)
            fwd = f"{m.forwards} ({m.forward_sequences})"
            bwd = f"{m.backwards} ({m.backward_sequences})"
            lines.append(
                f"{name:<38}{top:>10.2e}{median:>10.2e}{m.seconds:>8.3f}"
                f"{m.peak_bytes / 2**20:>9.1f}{fwd:>12}{bwd:>12}{m.readout_rows:>9}"
            )
        lines += ["", "resid = |Σ_layers score − Δp| per token, in probability."]
        lines += [f"{name}: {m.note}" for name, m in self.methods.items()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary: every field, tensors as nested lists,
        and each method's ``layer_sum`` and ``residual``."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        out["methods"] = {
            name: {
                **{f.name: _plain(getattr(m, f.name)) for f in fields(m)},
                "layer_sum": m.layer_sum.tolist(),
                "residual": m.residual.tolist(),
            }
            for name, m in self.methods.items()
        }
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ComparisonResult":
        """Inverse of :meth:`to_dict`."""
        methods = {}
        for name, entry in data["methods"].items():
            kwargs = {f.name: entry[f.name] for f in fields(MethodResult)}
            for key in _TENSORS:
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
        """Write the result as JSON (no pickle)."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Union[str, Path]) -> "ComparisonResult":
        """Read a result written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def plot(self, sequence: int = 0) -> Tuple[Any, Dict[str, Any]]:
        r"""
        One heatmap per method (layers across, the attributed tokens down an axis
        shared by all), side by side, each with its own symmetric colour scale
        (Captum's red-white-green), and below them a bar chart of each method's
        residuals ``|Σ_layers − Δp|`` on a log scale. Works headless.

        Args:

            sequence (int, optional): Which sequence of the batch. Default: 0.

        Returns:
            2-element tuple of **figure**, **axes**: the ``matplotlib`` figure, and
            a dict from each method's name, and ``"residuals"``, to its axes.
        """
        import matplotlib.pyplot as plt

        from captum_iglens.plots import _color_map, _layer_ticks

        names = list(self.methods)
        rows = self.mask[sequence].nonzero()[:, 0].tolist()
        fig = plt.figure(
            figsize=(max(8.0, 2.4 * len(names)), 4.5 + 0.25 * len(rows)),
            layout="constrained",
        )
        fig.set_facecolor("white")
        grid = fig.add_gridspec(2, len(names), height_ratios=[1.2 + 0.1 * len(rows), 1])
        axes: Dict[str, Any] = {}
        for col, name in enumerate(names):
            ax = fig.add_subplot(grid[0, col], sharey=axes.get(names[0]))
            scores = self.methods[name].scores[sequence, rows]
            top = max(scores.abs().max().item(), 1e-12)
            image = ax.imshow(
                scores.numpy(), cmap=_color_map(), vmin=-top, vmax=top, aspect="auto"
            )
            fig.colorbar(image, ax=ax, location="bottom", shrink=0.9)
            title = textwrap.fill(name.replace("_", " "), 22)
            ax.set_title(f"{title}\n({self.methods[name].unit})", fontsize=9)
            _layer_ticks(ax, self.layer_names)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("layer", fontsize=8)
            if col == 0:
                labels = [self._label(sequence, i) for i in rows]
                ax.set_yticks(range(len(rows)), labels)
            else:
                ax.tick_params(axis="y", labelleft=False)
            axes[name] = ax
        bars = fig.add_subplot(grid[1, :])
        floor = 1e-12
        x = torch.arange(len(names), dtype=torch.float64)
        stats = [self.residual_stats(name, sequence) for name in names]
        for shift, label, column in ((-0.2, "max", 0), (0.2, "median", 1)):
            heights = [max(s[column], floor) for s in stats]
            bars.bar((x + shift).numpy(), heights, width=0.4, label=label)
            for xi, h in zip((x + shift).tolist(), heights):
                if h <= floor:
                    bars.annotate("0", (xi, floor), ha="center", fontsize=7)
        bars.set_yscale("log")
        bars.set_ylim(bottom=floor)
        bars.axhline(1e-6, color="grey", linestyle=":", linewidth=1)
        ticks = [textwrap.fill(n.replace("_", " "), 22) for n in names]
        bars.set_xticks(x.numpy(), ticks, fontsize=8)
        bars.set_ylabel("|Σ_layers − Δp| (probability)", fontsize=8)
        bars.set_title(
            f"Telescoping residual per token, sequence {sequence} (log scale; dotted: "
            "1e-6; exact zeros marked 0)",
            fontsize=9,
        )
        bars.legend(fontsize=8)
        axes["residuals"] = bars
        return fig, axes

    def _label(self, sequence: int, row: int) -> str:
        position = int(self.positions[row])
        if self.tokens is None or self.input_tokens is None:
            return f"{position}→{int(self.targets[sequence, row])}"
        given, target = self.input_tokens[sequence][row], self.tokens[sequence][row]
        return f"{position} {given!r}→{target!r}"


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, Tensor) else value


def compare(
    model: Module,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    positions: PositionsType = None,
    target: Union[None, int, Sequence[int], Tensor] = None,
    layers: Optional[Sequence[int]] = None,
    methods: Union[str, Sequence[str]] = METHODS,
    n_steps: int = 32,
    baselines: BaselineType = None,
    baseline_token: Optional[int] = None,
    internal_batch_size: Optional[int] = None,
    tokenizer: Optional[Any] = None,
) -> ComparisonResult:
    r"""
    Runs each method on the same inputs, targets, positions and blocks, and
    measures each: a token-by-layer score ``(B, P, k)``, its sum over layers, the
    telescoping residual ``|Σ_layers − Δp|`` in probability, wall time, peak
    memory, and passes through the model. A first IG-Lens pass (counted in no
    method's cost) fixes the targets and positions every method attributes.

    The methods, :data:`METHODS`:

    - ``"ig_lens"``: :meth:`LayerIGLens.attribute_map`. Its credits sum to
      ``Δp = p_model − f(h_base)``.
    - ``"logit_lens"``: the levels ``f(h_{L_j})``, read from IG-Lens's own pass
      (a logit lens costs what IG-Lens costs). Levels, not attributions: their
      sum is set against ``Δp = p_model − f(h_0)`` only to show it means nothing.
    - ``"logit_lens_diff"``: the first differences of those levels, starting
      from ``f(h_0)``. They telescope, and with IG-Lens's default baseline they
      are IG-Lens's map (by the gradient theorem; IG-Lens adds the split over
      hidden dimensions and the choice of baseline).
    - ``"dla"``: Direct Logit Attribution, in logits. Block ``L_j`` gets its
      update ``h_{L_j} − h_{L_{j−1}}`` (from ``h_0``; the updates of the blocks
      between two chosen ones together) read through the final norm with its
      scale taken from the final hidden state ``h_final`` (the usual convention,
      TransformerLens's ``apply_ln_to_stack`` with the final scale; a LayerNorm
      still centres, the norm's weight applies, its bias does not), any output
      projection, and the head without its bias. Cohere's and Granite's logit
      scaling are kept; final-logit softcapping, not linear, is left out. The
      scores sum to the logit difference ``ℓ(h_final) − ℓ̃(h_0)``, the target's
      logit minus that of ``h_0`` read at the same frozen scale; the residual
      shows what comes of reading that sum as ``Δp = p_model − f(h_0)``.
    - ``"layer_conductance"``: Captum's :class:`~captum.attr.LayerConductance`,
      one call per block (it takes one layer). It interpolates the model's inputs,
      so ``F`` runs the model on ``inputs_embeds``, the embedding module's output
      for the ids (the model treats them as it treats the ids).
    - ``"layer_integrated_gradients"``: Captum's
      :class:`~captum.attr.LayerIntegratedGradients`, one call per block, ``F`` on
      token ids.
    - ``"layer_integrated_gradients_multilayer"``: one LayerIntegratedGradients
      call on the list of blocks. The blocks depend on each other, and Captum
      0.9.0 raises ``RuntimeError``; the retry with
      ``grad_kwargs={"materialize_grads": True}`` runs, and gives zeros to every
      block but the last. The note records both.

    For Captum's methods ``F(x)`` is the model's probability of the target at the
    position: each sequence is repeated once per position, so one call per block
    attributes every position. Each block's total is the whole ``F(x) − F(x')``
    (up to Captum's convergence delta, kept in ``delta``), so the sum over ``k``
    blocks is about ``k`` times the change.

    **Captum's baseline input** ``x'`` has the one token ``baseline_token`` at
    every position: its embedding for LayerConductance, the ids themselves for
    LayerIntegratedGradients, so both start from the same ``x'``. Like IG-Lens's
    baselines it is the same at every position, and unlike the zero embedding it
    is an input the model has seen (and one LayerIntegratedGradients on ids can
    use). IG-Lens's default baseline ``h_0`` has no counterpart: ``h_0`` is the
    input's own embedding, and ``x' = x`` gives ``F(x) − F(x') = 0``.

    Args:

        model (transformers.PreTrainedModel): A causal LM of a supported
                    architecture, in eval mode.
        input_ids (Tensor): ``(B, T)`` token ids.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at (left) padding.
                    Default: None
        positions (int, list[int] or Tensor, optional): The positions to
                    attribute. Default: None (every non-padding position).
        target (int, list[int] or Tensor, optional): As in
                    :meth:`LayerIGLens.attribute`. Default: None (the model's
                    greedy prediction at each position).
        layers (list[int], optional): Indices of the chosen blocks; the last block
                    is always added. Captum's methods cost a full integral per
                    block, so choose a few. Default: None (all blocks).
        methods (str or list[str], optional): Names from :data:`METHODS`.
                    Default: all of them.
        n_steps (int, optional): Steps of Captum's integrals (with Captum's
                    default rule, ``"gausslegendre"``) and IG-Lens's ``n_steps``.
                    Default: 32
        baselines (scalar, Tensor or str, optional): IG-Lens's baseline, as in
                    :meth:`LayerIGLens.attribute`; the logit lens and DLA start at
                    ``h_0`` whatever it is. Default: None (``h_0``)
        baseline_token (int, optional): The token of Captum's baseline input.
                    Default: None (``model.config.pad_token_id``, else its
                    ``bos_token_id``)
        internal_batch_size (int, optional): Captum's ``internal_batch_size``:
                    rows per forward, at least ``2·B·P`` for LayerConductance.
                    Default: None (all steps in one forward)
        tokenizer (PreTrainedTokenizerBase, optional): Labels tokens with text.
                    Default: None

    Returns:
        :class:`ComparisonResult`; print it, or call
        :meth:`~ComparisonResult.format_table`, for the table. Peak memory on CPU
        is a lower bound (see :class:`~captum_iglens._utils.measure.Cost`), and
        times on a shared machine are noisy.

    Examples::

        >>> result = compare(model, ids, positions=[-3, -2, -1], layers=[9, 19])
        >>> print(result.format_table())
        >>> fig, axes = result.plot()
    """
    names = [methods] if isinstance(methods, str) else list(methods)
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise ValueError(f"methods: expected names from {list(METHODS)}, got {names}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps: expected an int >= 1, got {n_steps!r}")
    if baseline_token is None:
        config = getattr(model, "config", None)
        baseline_token = getattr(config, "pad_token_id", None)
        if baseline_token is None:
            baseline_token = getattr(config, "bos_token_id", None)
    vocab = model.get_input_embeddings().num_embeddings
    if (
        isinstance(baseline_token, bool)
        or not isinstance(baseline_token, int)
        or not 0 <= baseline_token < vocab
    ):
        raise ValueError(
            f"baseline_token: expected a token id in [0, {vocab}), got "
            f"{baseline_token!r} (None takes the config's pad_token_id, else its "
            "bos_token_id)"
        )
    lens = LayerIGLens.from_model(model, layers)
    extra = None if attention_mask is None else (attention_mask,)
    setup = lens.attribute_map(input_ids, None, target, extra, positions=positions)
    work = Work(
        model,
        lens,
        input_ids,
        attention_mask,
        targets=setup.targets.clone(),
        positions=setup.positions.clone(),
        model_prob=setup.model_prob.clone(),
        h0_prob=setup.base_prob.clone(),
        n_steps=n_steps,
        baselines=baselines,
        baseline_token=baseline_token,
        internal_batch_size=internal_batch_size,
    )
    device = next(lens.readout.parameters()).device
    mask = setup.mask.cpu().clone()
    results: Dict[str, MethodResult] = {}
    for name in dict.fromkeys(names):
        with measure(model, lens.readout.head, device) as cost:
            out = RUNNERS[name](work)
        delta = out.delta
        if delta is not None:
            real = mask if delta.dim() == 2 else mask[..., None]
            delta = delta.float().cpu() * real
        results[name] = MethodResult(
            scores=out.scores.float().cpu() * mask[..., None],
            expected=out.expected.float().cpu() * mask,
            prob_change=out.prob_change.float().cpu() * mask,
            unit=out.unit,
            note=out.note,
            delta=delta,
            **{key: getattr(cost, key) for key in _COST_FIELDS},
        )
    tokens = input_tokens = None
    if tokenizer is not None:
        given = input_ids[:, work.positions.to(input_ids.device)]
        tokens = [[tokenizer.decode([int(t)]) for t in row] for row in work.targets]
        input_tokens = [[tokenizer.decode([int(t)]) for t in row] for row in given]
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
        results,
        work.targets.cpu(),
        work.positions.cpu(),
        mask,
        list(lens.layer_names),
        tokens,
        input_tokens,
        metadata,
    )
