r"""
The split of each block's attention update into per-(head, source) terms, for
``granularity="source"``.

With the attention weights ``A`` of the real forward held fixed, the attention
update of a sequential block at position ``t`` is ``s · (Σ_h Σ_j A^h_{tj} v^h_j
W_O^h + b)``: one term ``u_{h,j} = s · A^h_{tj} (v^h_j W_O^h)`` per head ``h`` and
source position ``j`` (and the bias). The terms add up to the heads' outputs of
:mod:`~captum_iglens.attr.granularities.heads` (and those to the update), and IG-Lens
credits each ``∫ ∇f · u_{h,j}``.

The path, ``p_model`` and the heads' outputs ``z_h`` are the model's own forward
(its attention kernel); ``A`` and ``v`` come from a second forward under the
eager attention, which returns the weights. That forward's rounding difference
from ``z_h`` is added to every source's value of the head in proportion to its
weight (``_correction``), so each head's terms sum to the real ``z_h``.

The terms are never stored:
:class:`~captum_iglens.attr.granularities.source_terms.SourceComponents` keeps
the weights of the attributed rows and the values per block, and the estimators
read the terms through their products with gradients and their norms.

The source granularities: each block's attention update split over the source
positions it reads (``"source"``, heads summed), or over (head, source) pairs
(``"source_head"``), with the attention weights of the real forward held fixed
(:class:`SourceComponents`).
"""

from typing import (
    Any,
    ContextManager,
    List,
    Optional,
    Sequence,
    Tuple,
    cast,
)

import torch
from torch import Tensor

from captum_iglens.attr._utils.attention import AttentionCapture, attention_of
from captum_iglens.attr._utils.block_parts import (
    BlockParts,
    projection_bias,
    projection_weight,
    split_tolerance,
)
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.checks import forward_module
from captum_iglens.attr.estimators import Integration
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.attr.granularities.source_terms import SourceComponents
from captum_iglens.attr.granularities.heads import (
    Heads,
    head_attributions,
    attention_factors,
    attention_updates,
    head_components,
    projected_heads,
)
from captum_iglens.columns import Column, parse_columns


def _head_outputs(weights: Tensor, values: Tensor, n_heads: int) -> Tensor:
    """The heads' outputs the weights and values give at the rows, ``(B, P,
    H·e)``, the values repeated over grouped query heads."""
    values = values.float()
    if values.shape[1] != n_heads:
        if n_heads % values.shape[1]:
            raise ValueError(
                f"granularity: 'source' found {values.shape[1]} key-value heads "
                f"for {n_heads} attention heads"
            )
        values = values.repeat_interleave(n_heads // values.shape[1], dim=1)
    outputs = torch.einsum("bhpt,bhte->bphe", weights.float(), values)
    return outputs.flatten(2)


def check_reproduced(
    index: int,
    outputs: Tensor,
    heads_in: Tensor,
    values: Tensor,
    mask: Tensor,
    tolerance: float,
) -> None:
    r"""
    Checks that the captured weights times values give the heads' outputs the
    model fed its attention output projection, to ``tolerance`` relative to the
    largest value: rounding the weights by ``ε`` moves an output by up to
    ``ε · max |v|``, and an output that averages many sources is much smaller
    than the values it averages (bfloat16 at T = 4,096).

    Args:
        outputs (Tensor): The captured weights times values, ``(B, P, H·e)``.
        heads_in (Tensor): The heads' outputs of the real forward, ``(B, P, H·e)``.
        values (Tensor): The captured values, ``(B, H_kv, T, e)``.
        mask (Tensor): ``(B, P)``, False at padding.

    Raises:
        ValueError: If they differ by more than float rounding.
    """
    error = (outputs - heads_in.float())[mask].abs()
    if not error.numel():
        return
    largest = max(heads_in.float()[mask].abs().max().item(), values.abs().max().item())
    if error.max().item() > tolerance * (1.0 + largest):
        raise ValueError(
            "granularity: 'source' captured attention weights and values that do "
            "not reproduce the heads' outputs of the real forward at chosen block "
            f"{index} (max difference {error.max().item():.3g}); this attention "
            "changes its values after the value projection or weights them in a "
            "way the eager attention does not return, so its sources cannot be "
            "split: use granularity='head'"
        )


def source_components(
    parts: BlockParts,
    weights: Sequence[Tensor],
    values: Sequence[Tensor],
    extras: List[Tensor],
    stream: Tensor,
    mask: Tensor,
    tolerance: float,
) -> SourceComponents:
    r"""
    The per-(head, source) terms of every chosen block's attention update,
    checked twice: the captured weights times values reproduce the heads'
    outputs ``z`` at the attributed rows, and (through
    :func:`~captum_iglens.attr.granularities.heads.head_components`) the heads' outputs
    projected (through a post-norm block's factor; with a parallel block's MLP)
    reproduce the update.

    Args:
        weights (list[Tensor]): Per block, ``(B, H, P, T)``.
        values (list[Tensor]): Per block, ``(B, H_kv, T, e)``.
        extras (list[Tensor]): Per block, the projection's input ``(B, P, H·e)``;
                    then for parallel blocks, per block, the MLP's output.
        stream (Tensor): ``(B, P, K, d)`` as ``head_components`` takes it.
        mask (Tensor): ``(B, P)``, False at padding.
        tolerance (float): Relative tolerance of both checks.

    Returns:
        :class:`SourceComponents` of shape ``(B, P, k, C, d)``.
    """
    head_components(parts, extras, stream, mask, tolerance)  # the update check
    k = len(weights)
    heads_in = extras[:k]
    outputs = torch.stack(
        [projected_heads(parts, j, z).sum(2) for j, z in enumerate(heads_in)], 2
    )
    factor = attention_factors(parts, outputs, attention_updates(parts, stream))
    scale = float(factor.flatten()[0]) if factor.numel() == 1 else 1.0
    rows, kept, biases, corrections = [], [], [], []
    for j, (a, v) in enumerate(zip(weights, values)):
        a = a.to(stream.device).float()
        v = v.to(stream.device).float()
        found = _head_outputs(a, v, parts.n_heads)
        check_reproduced(j, found, heads_in[j], v, mask, tolerance)
        corrections.append(_correction(a, found, heads_in[j], parts.n_heads))
        kept.append(v)
        rows.append(a.permute(0, 2, 1, 3))  # (B, P, H, T)
        bias = projection_bias(parts.attn_out[j])
        if bias is not None:
            biases.append(bias.detach().float().to(stream.device) * scale)
    b, p = mask.shape
    real = mask.repeat_interleave(k).view(-1, 1, 1).to(stream.device)
    return SourceComponents(
        torch.stack(rows, dim=2).flatten(0, 2) * real,
        kept,
        [projection_weight(m).detach() for m in parts.attn_out],
        scale,
        torch.stack(biases) if len(biases) == k else None,
        (b, p, k),
        p * k,
        factor=None if factor.numel() == 1 else factor.flatten(0, 2),
        extra=(
            torch.stack([m.float() for m in extras[k:]], 2)
            .flatten(0, 2)
            .to(stream.device)
            if parts.parallel
            else None
        ),
        correction=_stack_padded(corrections, 2).flatten(0, 2),
    )


def _stack_padded(tensors: List[Tensor], at: int) -> Tensor:
    """``tensors`` stacked at ``at``, zero-padded along the last dimension to
    the longest (blocks whose heads differ in size, e.g. Gemma 4's)."""
    size = max(t.shape[-1] for t in tensors)
    padded = [
        torch.cat([t, t.new_zeros(*t.shape[:-1], size - t.shape[-1])], -1)
        for t in tensors
    ]
    return torch.stack(padded, at)


def _correction(
    weights: Tensor, found: Tensor, heads_in: Tensor, n_heads: int
) -> Tensor:
    r"""
    Per row and head, ``(z_h - Σ_j A_{tj} v_j) / Σ_j A_{tj}``: what the real
    forward's head output ``z_h`` adds to the captured weights times values,
    over the weights' sum (1 but for attention sinks). Added to every
    source's value, it makes the head's source terms sum to the real head
    output, so that a head's sources add up to its column of the head map; the
    eager attention that returns the weights differs from the model's own
    kernel by float rounding, and this difference is spread over the sources
    in proportion to their weights.

    Args:
        weights (Tensor): ``(B, H, P, T)`` float32.
        found (Tensor): ``(B, P, H·e)`` float32: the weights times the values.
        heads_in (Tensor): ``(B, P, H·e)``: the real forward's head outputs.

    Returns:
        *Tensor* ``(B, P, H, e)`` float32 (zero where a row has no weight).
    """
    b, p = found.shape[:2]
    gap = (heads_in.to(found).double() - found.double()).view(b, p, n_heads, -1)
    total = weights.double().sum(-1).permute(0, 2, 1).unsqueeze(-1)  # (B, P, H, 1)
    spread = torch.where(total > 0, gap / total.clamp_min(1e-30), 0.0)
    return spread.float()


class Sources(Heads):
    r"""A first column ``"input"``, then per block ``"<name>.attn.s<j>"`` per
    source position ``j`` (heads summed; and ``"<name>.attn.bias"``), the
    attention update split as ``Σ_j Σ_h A^h_{tj} v^h_j W_O^h (+ b)``, and
    ``"<name>.mlp"``. The number of source columns is the input's length, known
    once the forward has run (:meth:`segment_names` shows ``"<name>.attn.sources"``
    in their place)."""

    name = "source"
    by_head = False

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        points, names = super().path_points()  # refuses a lens without heads
        projections = cast(BlockParts, self.block_parts).attn_out
        self._attention = AttentionCapture(
            [attention_of(b, p) for b, p in zip(self.layers, projections)],
            [m for m in [forward_module(self.forward_func)] if m is not None],
            torch.zeros(0, dtype=torch.long),
            torch.device("cpu"),
        )
        return points, self._placeholders(names)

    def second_pass(
        self, positions: Tensor, device: torch.device
    ) -> Optional[ContextManager[Any]]:
        """The attention weights and values, from a forward of their own under
        the eager attention (which returns its weights): the traced forward,
        whose ``p_model`` and residual stream the split closes on, runs the
        model's own attention implementation, untouched."""
        self._attention.positions, self._attention.device = positions, device
        return self._attention

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        weights, values = self._attention.records()
        p = points.shape[1]  # the last position only, for last-position logits
        weights = [w[:, :, -p:] for w in weights]
        tolerance = split_tolerance(points.dtype)
        heads = cast(BlockParts, self.block_parts)  # checked by path_points
        found = source_components(
            heads, weights, values, extras, points, mask, tolerance
        )
        self._sources = found.n_sources
        # SourceComponents builds its rows on demand, read as the components
        return found  # type: ignore[return-value]

    def column_names(self, names: List[str]) -> List[str]:
        out: List[str] = []
        n_heads = cast(BlockParts, self.block_parts).n_heads  # path_points checked
        heads = range(n_heads) if self.by_head else [None]
        for name, found in zip(names, parse_columns(names)):
            if found.kind != "sources":
                out.append(name)
                continue
            out += [
                Column("source", found.block, index=h, source=j).name
                for h in heads
                for j in range(self._sources)
            ]
        return out

    def levels(self, path: TracedPath, values: Tensor) -> Tensor:
        """A block's attention columns read the level after its attention (a
        parallel block's columns: after the block)."""
        c = (len(path.names) - 1) // len(self.layers)
        if self._parallel:
            per_column = values[..., 2:, None].expand(-1, -1, -1, c).flatten(2)
            return torch.cat([values[..., :2], per_column], -1)
        c -= 1  # the MLP column reads the block's output
        mids = values[..., 2:-1:2, None].expand(-1, -1, -1, c)
        per_column = torch.cat([mids, values[..., 3::2, None]], -1).flatten(2)
        return torch.cat([values[..., :2], per_column], -1)

    def _placeholders(self, names: List[str]) -> List[str]:
        """Per block, the head columns replaced by one placeholder."""
        out: List[str] = []
        for name, found in zip(names, parse_columns(names)):
            if found.kind != "head":
                out.append(name)
            elif found.index == 0:
                out.append(Column("sources", found.block).name)
        return out

    def _split(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        # this granularity's components are SourceComponents (see components)
        found: SourceComponents = path.components  # type: ignore[assignment]
        attrs = head_attributions(
            integration,
            path.points.flatten(0, 1),
            found.flatten(0, 1),  # type: ignore[arg-type]  # indexed on demand
            path.score.flatten(),
            values,
            parents=found.parents,
            parallel=self._parallel,
            blocks=self.segment_blocks(),
        )
        return attrs if self.by_head else _sum_heads(attrs, len(self.layers), found)


class SourceHeads(Sources):
    r"""As ``"source"``, each source column resolved by head:
    ``"<name>.attn.h<i>.s<j>"``."""

    name = "source_head"
    by_head = True


def _sum_heads(attrs: Tensor, k: int, found: SourceComponents) -> Tensor:
    """Columns ``(N, 1 + k (H·T + b + 1), ...)`` with the heads summed per
    source: ``(N, 1 + k (T + b + 1), ...)``."""
    n, rest = attrs.shape[0], attrs.shape[2:]
    h, t = found.n_heads, found.n_sources
    blocks = attrs[:, 1:].reshape(n, k, -1, *rest)
    heads = blocks[:, :, : h * t].reshape(n, k, h, t, *rest)
    sources = heads.sum(2, dtype=torch.float64).to(attrs.dtype)  # rounded once
    per_block = torch.cat([sources, blocks[:, :, h * t :]], dim=2).flatten(1, 2)
    return torch.cat([attrs[:, :1], per_block], dim=1)
