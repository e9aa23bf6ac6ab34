r"""
The split of each block's attention update into its heads, for
``granularity="head"``.

Inside a sequential block the attention update at a position is
``h_mid - h_in = s · (W_O z + b) = Σ_h s · W_O[:, head h] z_h + s · b``, where ``z``
is the input of the attention output projection (the heads' outputs side by
side), ``b`` its bias and ``s`` any residual multiplier the block applies. Each
term is a displacement ``u_c`` along the straight segment ``h_in → h_mid``, and
IG-Lens credits it ``∫ ∇f · u_c``: the credits add up to the segment's credit.

The path of ``granularity="head"`` is ``h_base → h_in(first block) → h_mid(1) →
h_out(1) → h_mid(2) → ...``: a first segment ``"input"`` (from the baseline to the
first chosen block's input; zero with the default baseline when the first chosen
block is the model's first), then per block its attention segment, split into
``"<block>.attn.h<i>"`` (and ``"<block>.attn.bias"``), and ``"<block>.mlp"``.

A post-norm block (Gemma 2/3/4, OLMo 2/3) adds ``γ ⊙ o / rms(o)``, an RMSNorm
of the projection's output ``o = Σ_h o_h (+ b)``: with the per-position factor
``1 / rms(o)`` of the real forward fixed, the update is ``Σ_h γ ⊙ o_h / rms(o)``
(:func:`attention_factors`). A parallel block (GPT-J, Phi, Cohere, parallel
Falcon/GPT-NeoX/StableLM) adds attention and MLP, both read from its input,
along one segment ``h_in → h_out``: the heads, the bias and the MLP's output
are the components of that segment, and the path is ``h_base → h_in → h_out(1)
→ h_out(2) → ...``, with the same column names.

The head granularity: each block's attention update split per head.
"""

from typing import Any, List, Optional, Sequence, Tuple, cast

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
from captum_iglens.attr._utils.checks import qualified_names
from captum_iglens.attr._utils.path_math import interleave
from captum_iglens.attr.estimators import Integration, SplitChains
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.readout.scores import TokenScore
from captum_iglens.attr.granularities.components import (
    ComponentSplit,
)
from captum_iglens.columns import INPUT, Column


def check_consecutive(forward_func: Any, layers: Sequence[Module]) -> None:
    r"""
    Refuses, before any forward, chosen blocks with unchosen blocks between them:
    the attention update of a block is split into its heads only when the block
    before it is on the path too. Checked where ``forward_func`` is a module whose
    chosen blocks are numbered children of one container (a model's block list);
    other lenses are checked when the heads' outputs are captured.

    Raises:
        ValueError: If the chosen blocks skip a block.
    """
    parents, indices = set(), []
    for name in qualified_names(forward_func, layers):
        parent, _, index = (name or "").rpartition(".")
        if not index.isdigit():
            return
        parents.add(parent)
        indices.append(int(index))
    expected = list(range(indices[0], indices[0] + len(indices)))
    if len(parents) == 1 and indices != expected:
        raise ValueError(
            f"granularity: 'head' needs consecutive blocks, got blocks {indices}; "
            "choose a range up to the last block (layers=None, or e.g. "
            f"layers=range({indices[0]}, {indices[-1] + 1}))"
        )


def head_path_points(
    layers: Sequence[Module],
    mids: Optional[Sequence[Module]],
    parts: BlockParts,
    layer_names: Sequence[str],
) -> Tuple[List[PathPoint], List[str]]:
    r"""
    The hooked modules of the head path, in execution order, and the names of
    its credit columns.

    Args:
        mids (list[Module], optional): Per block, the module whose input is the
                    mid-block state; not read for parallel blocks.

    Returns:
        2-element tuple: the points (the first block's input, then per block the
        projection's input ``z``, the mid-block state (a parallel block: its
        MLP's output) and the block's output), and the column names.
    """
    points: List[PathPoint] = [(layers[0], True)]
    names = [INPUT]
    for j, (name, block) in enumerate(zip(layer_names, layers)):
        middle: PathPoint = (
            (parts.parallel_mlp[j], False)
            if parts.parallel_mlp is not None
            else (cast(Sequence[Module], mids)[j], True)  # given where not parallel
        )
        points += [(parts.attn_out[j], True), middle, (block, False)]
        names += [*parts.column_names(name, j), Column("sublayer", name, "mlp").name]
    return points, names


def split_states(
    states: List[Tensor], parallel: bool = False
) -> Tuple[List[Tensor], List[Tensor]]:
    """The captured states of :func:`head_path_points`, as residual-stream states
    (``h_in, h_mid(1), h_out(1), ...``; parallel blocks: ``h_in, h_out(1),
    ...``) and the other states: the projections' inputs ``z`` per block, then
    for parallel blocks the MLPs' outputs per block."""
    k = (len(states) - 1) // 3
    heads_in = [states[1 + 3 * j] for j in range(k)]
    if parallel:
        stream = [states[0], *(states[3 + 3 * j] for j in range(k))]
        return stream, heads_in + [states[2 + 3 * j] for j in range(k)]
    stream = [states[0]]
    for j in range(k):
        stream += [states[2 + 3 * j], states[3 + 3 * j]]
    return stream, heads_in


def attention_updates(parts: BlockParts, stream: Tensor) -> Tensor:
    r"""
    The stream's change across each block's split segment.

    Args:
        stream (Tensor): ``(B, P, K, d)`` path points: ``h_base, h_in, h_mid(1),
                    h_out(1), ...`` (parallel blocks: ``h_base, h_in, h_out(1),
                    ...``).

    Returns:
        *Tensor* ``(B, P, k, d)`` float32: ``h_mid - h_prev`` per block (parallel
        blocks: ``h_out - h_in``).
    """
    stream = stream.float()
    if parts.parallel:
        return stream[:, :, 2:] - stream[:, :, 1:-1]
    return stream[:, :, 2::2] - stream[:, :, 1:-1:2]


def projected_heads(parts: BlockParts, index: int, z: Tensor) -> Tensor:
    r"""
    Each head's output through block ``index``'s attention output projection.

    Args:
        z (Tensor): ``(B, P, H · e)``: the projection's input.

    Returns:
        *Tensor* ``(B, P, C, d)`` float32: ``W_O[:, head h] z_h`` per head, then
        the bias where the projection has one; they sum to its output.
    """
    module = parts.attn_out[index]
    weight = projection_weight(module).float().to(z.device)
    d = weight.shape[0]
    z = z.float().view(*z.shape[:2], parts.n_heads, -1)
    u = torch.einsum("bphe,dhe->bphd", z, weight.view(d, parts.n_heads, -1))
    bias = projection_bias(module)
    if bias is None:
        return u
    return torch.cat([u, bias.float().to(z.device).expand(*z.shape[:2], 1, d)], 2)


def attention_factors(parts: BlockParts, outputs: Tensor, updates: Tensor) -> Tensor:
    r"""
    The factor, per position and dimension, that turns each block's attention
    output projection's output into the block's attention update: the update is
    linear in the heads' outputs with it fixed from the real forward.

    ``parts.attn_scale`` for blocks that add the projection's output as it is. For a
    post-norm block, whose update is ``γ ⊙ o / rms(o)`` (an RMSNorm of the
    projection's output ``o``), the factor is ``γ̂ · r`` with ``γ̂`` the norm
    applied to a vector of ones (``γ`` up to a constant) and ``r`` the one
    scalar per position that maps ``γ̂ ⊙ o`` onto the update the model made
    (least squares; exact where the norm is an RMSNorm, which the caller checks
    by adding the components up).

    Args:
        outputs (Tensor): ``(B, P, k, d)`` float32: the projections' outputs.
        updates (Tensor): ``(B, P, k, d)`` float32: :func:`attention_updates`.

    Returns:
        *Tensor* ``(B, P, k, d)`` float32 (broadcastable: ``(1, 1, 1, 1)`` without
        norms).
    """
    return output_factors(parts.attn_norm, parts.attn_scale, outputs, updates)


def head_components(
    parts: BlockParts,
    extras: List[Tensor],
    stream: Tensor,
    mask: Tensor,
    tolerance: float,
) -> Tensor:
    r"""
    Each block's split segment cut into its heads (and bias; parallel blocks:
    and the MLP), checked against the update the model made.

    Args:
        extras (list[Tensor]): Per block, the projection's input ``(B, P, H·e)``;
                    then for parallel blocks, per block, the MLP's output
                    ``(B, P, d)`` (:func:`split_states`).
        stream (Tensor): ``(B, P, K, d)`` path points (:func:`attention_updates`).
        mask (Tensor): ``(B, P)``, False at padding.
        tolerance (float): Allowed ``|Σ_c u_c - update|``, relative to
                    ``1 + max |update|``.

    Returns:
        *Tensor* ``(B, P, k, C, d)`` float32: ``u_c`` per block (``C = H``, plus
        one for the bias where the projection has one, plus one for the MLP of a
        parallel block).

    Raises:
        ValueError: Where the components do not add up to the update, e.g. when
            the chosen blocks are not consecutive.
    """
    k = len(parts.attn_out)
    heads = torch.stack(
        [projected_heads(parts, j, z) for j, z in enumerate(extras[:k])], dim=2
    )
    updates = attention_updates(parts, stream)
    heads = heads * attention_factors(parts, heads.sum(3), updates).unsqueeze(3)
    if parts.parallel:
        mlps = torch.stack([m.float() for m in extras[k:]], dim=2)
        heads = torch.cat([heads, mlps.to(heads.device).unsqueeze(3)], dim=3)
    _check_sum(heads, updates, mask, tolerance)
    return heads.to(stream.device)


def _check_sum(
    components: Tensor, updates: Tensor, mask: Tensor, tolerance: float
) -> None:
    error = (components.sum(3) - updates)[mask].abs()
    size = 1.0 + updates[mask].abs().max().item() if mask.any() else 1.0
    if error.numel() and error.max().item() > tolerance * size:
        worst = int(error.amax(dim=(0, 2)).argmax())
        raise ValueError(
            "granularity: 'head' needs each chosen block's attention update "
            "(h_mid - h_in; a parallel block's h_out - h_in) to be the sum of its "
            "heads' outputs through the attention output projection (plus its "
            "bias; through the post-attention RMSNorm's factor where the block "
            "has one; plus the MLP's output in a parallel block), but at chosen "
            f"block {worst} they differ by {error.max().item():.3g}. Choose "
            "consecutive blocks (layers=None or a range), and check the "
            "architecture table's attn_out, attn_norm and parallel_mlp for this "
            "model."
        )


def head_attributions(
    integration: Integration,
    stream: Tensor,
    components: Tensor,
    targets: TokenScore,
    values: Tensor,
    parents: Optional[Tensor] = None,
    parallel: bool = False,
    blocks: Optional[Sequence[int]] = None,
) -> Tensor:
    r"""
    The credit columns of ``granularity="head"``, in the order of
    :func:`head_path_points`: the segments ``"input"`` and ``"<block>.mlp"`` get
    the estimator's credits (or attributions, with
    ``integration.per_dimension``), each attention segment the estimator's split
    into its components ``u_c`` (the path's ``split_segments``). With ``parallel``
    blocks, each block's one segment is split, its MLP the last component.

    Args:
        stream (Tensor): ``(N, 2k + 2, d)`` path points (``parallel``:
                    ``(N, k + 2, d)``).
        components (Tensor): ``(N, k, C, d)`` float32.
        targets (TokenScore): ``N`` rows (the score of each).
        values (Tensor): ``(N, 2k + 2)``: ``f`` at the path points, the last the
                    model's own; or ``(N, 2k + 1, 2)`` at both ends of each
                    segment (``segment_ends`` of the path maths).
        parents (Tensor, optional): ``(C,)``: a group per component, as
                    :class:`~captum_iglens.attr.estimators.base.Segments` takes
                    it. Default: None
        parallel (bool, optional): The blocks add attention and MLP in
                    parallel. Default: False
        blocks (list[int], optional): The path block of each segment, for the
                    path (see :meth:`Heads.segment_blocks`). Default: None

    Returns:
        *Tensor* ``(N, n_columns)``, or ``(N, n_columns, d)`` per dimension,
        float32.
    """
    n, k_points, d = stream.shape
    k, c = components.shape[1], components.shape[2]
    if parallel:  # "input", then each block's one segment, split
        plain, attn = [0], list(range(1, k_points - 1))
    else:  # "input" and the MLPs; the attention segments, split
        plain = [0, *range(2, k_points - 1, 2)]
        attn = list(range(1, k_points - 1, 2))
    attn_out, plain_out = integration.path.split_segments(
        integration,
        SplitChains(
            stream,
            components.flatten(0, 1),  # (N·k, C, d)
            targets,
            values,
            attn,
            plain,
            parents,
            blocks,
        ),
    )
    attn_out = attn_out.view(n, k, c, -1)
    if parallel:
        out = torch.cat([plain_out.view(n, 1, -1), attn_out.flatten(1, 2)], dim=1)
    else:
        out = interleave(plain_out.view(n, k + 1, -1), attn_out)
    return out if integration.per_dimension else out.squeeze(-1)


class Heads(ComponentSplit):
    r"""A first column ``"input"``, then per block ``"<name>.attn.h<i>"`` per head
    (and ``"<name>.attn.bias"``), the attention update split as ``Σ_h W_O[:, head
    h] z_h (+ b)`` (through a post-attention RMSNorm's per-position factor where
    the block has one), and ``"<name>.mlp"`` (in a parallel block, the MLP's
    output as a component of the block's one segment)."""

    name = "head"
    input_column = True

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        if self.block_parts is None:
            raise ValueError(
                "granularity: 'head' needs each block's attention output "
                "projection (block_parts=); from_model sets it from the architecture "
                "table's attn_out, which is None for this model: its blocks have "
                "no attention heads to split (hybrid recurrent blocks: Mamba or "
                "Gated DeltaNet in some blocks), or the block normalises the "
                "residual stream itself after attention (OPT with "
                "do_layer_norm_before=False, BLOOM with "
                "apply_residual_connection_post_layernorm, GPT-2 with cross-"
                "attention), so no sum of head outputs reaches the stream. Use "
                'granularity="sublayer" or "block"'
            )
        mids = None if self.block_parts.parallel else self._mids()
        check_consecutive(self.forward_func, self.layers)
        return head_path_points(self.layers, mids, self.block_parts, self.layer_names)

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return split_states(states, self._parallel)

    @property
    def _parallel(self) -> bool:
        return self.block_parts is not None and self.block_parts.parallel

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        tolerance = split_tolerance(points.dtype)
        assert self.block_parts is not None  # path_points refused None
        return head_components(self.block_parts, extras, points, mask, tolerance)

    def segment_blocks(self) -> Optional[List[int]]:
        """``"input"`` in the first block, then each block's attention and
        MLP segments (a parallel block: its one segment)."""
        per_block = 1 if self._parallel else 2
        return [0] + [j for j in range(len(self.layers)) for _ in range(per_block)]

    def column_segments(self, n_columns: int) -> List[int]:
        k = len(self.layers)
        m = (n_columns - 1) // k  # columns per block
        if self._parallel:
            return [0] + [1 + j for j in range(k) for _ in range(m)]
        attn = [[2 * j + 1] * (m - 1) + [2 * j + 2] for j in range(k)]
        return [0] + [s for block in attn for s in block]

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """A head's column reads the level after its block's attention,
        ``f(h_mid)`` (a parallel block's columns: after the block)."""
        c = cast(Tensor, path.components).shape[3]  # set by this granularity
        if self._parallel:
            per_column = values[..., 2:, None].expand(-1, -1, -1, c).flatten(2)
            return torch.cat([values[..., :2], per_column], -1)
        mids = values[..., 2:-1:2, None].expand(-1, -1, -1, c)
        per_column = torch.cat([mids, values[..., 3::2, None]], -1).flatten(2)
        return torch.cat([values[..., :2], per_column], -1)

    def _split(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        assert path.components is not None  # traced with this granularity
        return head_attributions(
            integration,
            path.points.flatten(0, 1),
            path.components.flatten(0, 1),
            path.score.flatten(),
            values,
            parallel=self._parallel,
            blocks=self.segment_blocks(),
        )
