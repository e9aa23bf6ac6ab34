r"""
The split of each block's MLP update into its neurons, for
``granularity="neuron"``.

The MLP's output projection computes ``W_out a + b`` from the neurons'
activations ``a`` (its input: ``act(W_gate x) ⊙ W_up x`` in a gated MLP). With
``a`` fixed from the real forward, the MLP update at a position is
``factor ⊙ (Σ_n a_n W_out[:, n] + b)`` (``factor`` the block's residual
multiplier, or a post-MLP RMSNorm's per-position factor,
:func:`~captum_iglens.attr._utils.block_parts.output_factors`): one component
``u_n = factor ⊙ a_n W_out[:, n]`` per neuron (and the bias), adding up to the
segment ``h_mid → h_out``. The components are built a group of rows at a time
(:class:`NeuronComponents`), never ``(rows, neurons, d)`` for all rows at once.

The neuron granularity: each block's MLP update split per neuron, and the
top neurons of a result.
"""

from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.block_parts import (
    BlockParts,
    output_factors,
    projection_bias,
    projection_weight,
    split_tolerance,
)
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.float32 import float32_parts
from captum_iglens.attr.estimators import Integration, SplitChains
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.readout.scores import TokenScore
from captum_iglens.attr.granularities.components import (
    ComponentSplit,
)
from captum_iglens.columns import Column, parse_columns


class NeuronComponents:
    r"""
    The components ``u_n`` (and the bias) of every row's MLP segment, built on
    demand: a ``(R, C, d)`` float32 array, ``C = I (+ 1)``, rows ordered
    ``(b, p, block)``.

    Args:
        activations (Tensor): ``(R, I)`` float32: the neurons' activations.
        weights (list[Tensor]): Per block, ``(I, d)``: ``W_out[:, n]`` (the
                    model's own weights, any dtype: read in float32 a slice of
                    neurons at a time).
        factors (Tensor): ``(R, d)`` float32, or ``(1, 1)``: the factor of each row.
        bias (Tensor, optional): ``(k, d)`` float32: the bias per block.
    """

    def __init__(
        self,
        activations: Tensor,
        weights: Sequence[Tensor],
        factors: Tensor,
        bias: Optional[Tensor],
    ) -> None:
        self.activations = activations
        self.weights = list(weights)
        self.factors = factors
        self.bias = bias

    @property
    def shape(self) -> torch.Size:
        n, d = self.weights[0].shape
        return torch.Size([self.activations.shape[0], n + (self.bias is not None), d])

    def __getitem__(self, index: Union[slice, Tensor]) -> Tensor:
        """The components of the rows ``index``, ``(g, C, d)``."""
        flat, block, factor = self._rows(index)
        terms = factor.new_empty(len(flat), *self.weights[0].shape)
        for b, sel in _by_block(block):
            acts = self.activations[flat[sel]].unsqueeze(-1)
            for neurons, weight in self._weight_parts(b):
                terms[sel, neurons] = acts[:, neurons] * weight
        if self.bias is not None:
            terms = torch.cat([terms, self.bias[block].unsqueeze(1)], dim=1)
        return terms * factor.unsqueeze(1)

    def dots(self, index: Union[slice, Tensor], grads: Tensor) -> Tensor:
        r"""``g_s · u_n`` for the rows ``index`` and their vectors ``grads``
        ``(g, S, d)``: ``(g, S, C)``, through ``W_out^T (f ⊙ g_s)``, never the
        components themselves."""
        flat, block, factor = self._rows(index)
        grads = grads * factor.unsqueeze(1)
        out = grads.new_empty(*grads.shape[:2], self.weights[0].shape[0])
        for b, sel in _by_block(block):
            acts = self.activations[flat[sel]].unsqueeze(1)
            for neurons, weight in self._weight_parts(b):
                along = torch.einsum("gsd,id->gsi", grads[sel], weight)
                out[sel, :, neurons] = along * acts[..., neurons]
        if self.bias is None:
            return out
        return torch.cat([out, grads @ self.bias[block].unsqueeze(-1)], dim=2)

    def norms(self, index: Union[slice, Tensor]) -> Tuple[Tensor, Tensor]:
        r"""``‖u_n‖²`` ``(g, C)`` for the rows ``index``, twice (each component
        its own group)."""
        flat, block, factor = self._rows(index)
        square = factor.new_empty(len(flat), self.weights[0].shape[0])
        for b, sel in _by_block(block):
            acts = self.activations[flat[sel]].square()
            for neurons, weight in self._weight_parts(b):
                columns = torch.einsum(
                    "gd,id->gi", factor[sel].square(), weight.square()
                )
                square[sel, neurons] = acts[:, neurons] * columns
        if self.bias is not None:
            bias = (self.bias[block] * factor).square().sum(-1, keepdim=True)
            square = torch.cat([square, bias], dim=1)
        return square, square

    def _rows(self, index: Union[slice, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """The rows ``index``, their blocks and their factors ``(g, d)``."""
        flat = torch.arange(self.activations.shape[0], device=self.factors.device)
        flat = flat[index]
        rows, d = self.activations.shape[0], self.weights[0].shape[1]
        factor = self.factors.expand(rows, d)[flat]
        return flat, flat % len(self.weights), factor

    def _weight_parts(self, block: int) -> Iterator[Tuple[slice, Tensor]]:
        """The block's ``W_out`` rows in float32 on the factors' device, a
        slice of neurons at a time."""
        return float32_parts(self.weights[block], 0, self.factors.device)

    def __len__(self) -> int:
        return self.activations.shape[0]


def _by_block(block: Tensor) -> Iterator[Tuple[int, Tensor]]:
    """Each block among the rows and where its rows are."""
    for b in block.unique().tolist():
        yield b, (block == b).nonzero()[:, 0]


def neuron_path_points(
    mids: Sequence[Module],
    layers: Sequence[Module],
    parts: BlockParts,
    layer_names: Sequence[str],
) -> Tuple[List[PathPoint], List[str]]:
    r"""
    The hooked modules of the neuron path, in execution order, and the column
    names: per block the mid-block state, the MLP output projection's input and
    the block's output; columns ``"<b>.attn"``, ``"<b>.mlp.n<i>"`` per neuron
    (and ``"<b>.mlp.bias"``).
    """
    if parts.mlp_out is None:
        raise ValueError(
            "granularity: 'neuron' needs each block's MLP output projection; the "
            "architecture table's mlp_out is None for this model (a mixture of "
            "experts, a parallel block, or a block that rescales the whole "
            'stream after its MLP). Use granularity="sublayer" or "head"'
        )
    points: List[PathPoint] = []
    names: List[str] = []
    for j, (name, mid, block) in enumerate(zip(layer_names, mids, layers)):
        down = parts.mlp_out[j]
        points += [(mid, True), (down, True), (block, False)]
        n_neurons = projection_weight(down).shape[1]
        names.append(Column("sublayer", name, "attn").name)
        names += [Column("neuron", name, index=i).name for i in range(n_neurons)]
        if projection_bias(down) is not None:
            names.append(Column("bias", name, "mlp").name)
    return points, names


def split_neuron_states(states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
    """The captured states as the stream ``h_mid(1), h_out(1), ...`` and the
    activations per block."""
    k = len(states) // 3
    stream = [s for j in range(k) for s in (states[3 * j], states[3 * j + 2])]
    return stream, [states[3 * j + 1] for j in range(k)]


def neuron_components(
    parts: BlockParts,
    activations: List[Tensor],
    points: Tensor,
    mask: Tensor,
    tolerance: float,
) -> NeuronComponents:
    r"""
    The neurons' components of every block's MLP segment, checked: they add up
    to ``h_out - h_mid`` at the attributed rows.

    Args:
        activations (list[Tensor]): Per block, ``(B, P, I)``.
        points (Tensor): ``(B, P, 2k + 1, d)``: ``h_base, h_mid(1), h_out(1), ...``.
        mask (Tensor): ``(B, P)``, False at padding.
        tolerance (float): Allowed error relative to ``1 + max |update|``.

    Returns:
        :class:`NeuronComponents` of ``B·P·k`` rows.

    Raises:
        ValueError: If the components do not add up to the MLP update.
    """
    device = points.device
    modules = parts.mlp_out or []
    weights = [projection_weight(m).detach().t() for m in modules]  # (I, d) views
    biases = [projection_bias(m) for m in modules]
    bias = (
        None
        if biases[0] is None
        else torch.stack([cast(Tensor, b).detach().float().to(device) for b in biases])
    )
    a = torch.stack([x.float().to(device) for x in activations], dim=2)  # (B,P,k,I)
    outputs = a.new_empty(*a.shape[:3], weights[0].shape[1])
    for j, w in enumerate(weights):  # slices of d: each sum over I is whole
        for cols, part in float32_parts(w, 1, device):
            outputs[:, :, j, cols] = torch.einsum("bpi,id->bpd", a[:, :, j], part)
    if bias is not None:
        outputs = outputs + bias
    stream = points.float()
    updates = stream[:, :, 2::2] - stream[:, :, 1::2]
    factors = output_factors(parts.mlp_norm, parts.attn_scale, outputs, updates)
    error = (outputs * factors - updates)[mask].abs()
    size = 1.0 + updates[mask].abs().max().item() if mask.any() else 1.0
    if error.numel() and error.max().item() > tolerance * size:
        raise ValueError(
            "granularity: 'neuron' needs each chosen block's MLP update h_out - "
            "h_mid to be its output projection's output (through the post-MLP "
            f"norm's factor where the block has one), but they differ by "
            f"{error.max().item():.3g}; check the architecture table's mlp_out "
            "and mlp_norm for this model"
        )
    flat_factors = factors.expand_as(outputs).flatten(0, 2)
    if factors.numel() == 1:
        flat_factors = factors.view(1, 1)
    return NeuronComponents(a.flatten(0, 2), weights, flat_factors, bias)


def neuron_attributions(
    integration: Integration,
    stream: Tensor,
    components: NeuronComponents,
    targets: TokenScore,
    values: Tensor,
    blocks: Optional[Sequence[int]] = None,
) -> Tensor:
    r"""
    The columns of ``granularity="neuron"``: per block its attention segment
    (the estimator's credit), then its MLP segment split into the neurons'
    components (the path's ``split_segments``).

    Args:
        stream (Tensor): ``(N, 2k + 1, d)`` path points.
        components (NeuronComponents): ``N·k`` rows.
        values (Tensor): ``(N, 2k + 1)``: ``f`` at the points, the last the
                    model's own; or ``(N, 2k, 2)`` per segment
                    (:func:`~captum_iglens.attr._utils.path_math.segment_ends`).
        blocks (list[int], optional): The path block of each segment, for the
                    path. Default: None

    Returns:
        *Tensor* ``(N, k (1 + C))``, or ``(N, k (1 + C), d)`` per dimension.
    """
    n, k_points, _ = stream.shape
    k = (k_points - 1) // 2
    split, plain = integration.path.split_segments(
        integration,
        SplitChains(
            stream,
            # NeuronComponents builds its (M, C, d) rows on demand: the
            # estimators only index it and read its shape, as documented for
            # the components of ``Segments``
            components,  # type: ignore[arg-type]
            targets,
            values,
            list(range(1, k_points, 2)),
            list(range(0, k_points - 1, 2)),
            blocks=blocks,
        ),
    )
    c = components.shape[1]
    plain = plain.float().view(n, k, 1, -1)
    out = torch.cat([plain, split.float().view(n, k, c, -1)], dim=2).flatten(1, 2)
    return out if integration.per_dimension else out.squeeze(-1)


class Neurons(ComponentSplit):
    r"""Per block ``"<name>.attn"`` (as ``"sublayer"``), then ``"<name>.mlp.n<i>"``
    for every neuron ``i`` of its MLP (and ``"<name>.mlp.bias"``): the MLP
    update split as ``Σ_n a_n W_out[:, n] (+ b)`` with the activations ``a`` of
    the real forward (through a post-MLP RMSNorm's per-position factor where the
    block has one). All neurons are columns, so they add up to the MLP's credit
    exactly; :func:`top_neurons` picks the strongest per answer token."""

    name = "neuron"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        if self.block_parts is None:
            raise ValueError(
                "granularity: 'neuron' needs the architecture table's entry for "
                "this model (LayerIGLens.from_model) with mlp_out; this model has "
                'none. Use granularity="sublayer"'
            )
        return neuron_path_points(mids, self.layers, self.block_parts, self.layer_names)

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return split_neuron_states(states)

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        tolerance = split_tolerance(points.dtype)
        heads = cast(BlockParts, self.block_parts)  # checked by path_points
        found = neuron_components(heads, extras, points, mask, tolerance)
        # NeuronComponents builds its rows on demand, read as the components
        return found  # type: ignore[return-value]

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """``"<b>.attn"`` reads ``f(h_mid)``, a neuron column ``f(h_out)``."""
        c = path.components.shape[1]  # type: ignore[union-attr]
        mids = values[..., 1::2, None]
        outs = values[..., 2::2, None].expand(-1, -1, -1, c)
        per_column = torch.cat([mids, outs], -1).flatten(2)
        return torch.cat([values[..., :1], per_column], -1)

    def segment_blocks(self) -> Optional[List[int]]:
        """Each block's attention and MLP segments."""
        return [j for j in range(len(self.layers)) for _ in range(2)]

    def column_segments(self, n_columns: int) -> List[int]:
        k = len(self.layers)
        m = n_columns // k  # columns per block: attention, then the MLP's
        return [s for j in range(k) for s in [2 * j] + [2 * j + 1] * (m - 1)]

    def _split(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        found: NeuronComponents = path.components  # type: ignore[assignment]
        return neuron_attributions(
            integration,
            path.points.flatten(0, 1),
            found,
            path.score.flatten(),
            values,
            self.segment_blocks(),
        )


def top_neurons(
    credits: Tensor, names: List[str], k: int
) -> Dict[str, List[Tuple[int, float]]]:
    r"""
    The ``k`` neurons of each block with the largest ``|credit|`` in one row of
    a ``granularity="neuron"`` map, and the rest of the block's MLP credit.

    Args:
        credits (Tensor): ``(n,)``: one row of the map's attributions.
        names (list[str]): The map's column names.
        k (int): Neurons kept per block.

    Returns:
        *dict*: per block name, ``[(neuron id, credit), ...]`` strongest first,
        then ``(-1, rest)``: the credit of the block's other neurons and bias,
        so that the list adds up to the block's MLP credit.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    blocks: Dict[str, List[Tuple[int, int]]] = {}
    for column, found in enumerate(parse_columns(names)):
        if found.kind == "neuron" or (found.kind, found.part) == ("bias", "mlp"):
            index = -1 if found.index is None else found.index
            blocks.setdefault(str(found.block), []).append((index, column))
    out: Dict[str, List[Tuple[int, float]]] = {}
    for block, members in blocks.items():
        ids = [i for i, _ in members if i >= 0]
        values = credits[[c for i, c in members if i >= 0]].float()
        order = values.abs().argsort(descending=True)[:k].tolist()
        kept = [(ids[i], float(values[i])) for i in order]
        total = float(credits[[c for _, c in members]].float().sum())
        out[block] = kept + [(-1, total - sum(v for _, v in kept))]
    return out
