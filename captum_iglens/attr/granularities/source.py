r"""
The source granularities: each block's attention update split over the source
positions it reads (``"source"``, heads summed), or over (head, source) pairs
(``"source_head"``), with the attention weights of the real forward held fixed
(:mod:`~captum_iglens.attr._utils.sources`).
"""

from typing import Any, ContextManager, Dict, List, Optional, Tuple, cast

import torch
from torch import Tensor

from captum_iglens.attr._utils.attention import AttentionCapture, attention_of
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.checks import forward_module
from captum_iglens.attr._utils.heads import (
    HeadSplit,
    head_attributions,
    split_tolerance,
)
from captum_iglens.attr._utils.sources import SourceComponents, source_components
from captum_iglens.attr.estimators import Estimator
from captum_iglens.attr.granularities.heads import Heads
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.readout.interface import PathReadout

#: The placeholder of a block's source columns before the forward has run.
SOURCES = "sources"


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
        projections = cast(HeadSplit, self.heads).projections
        self._attention = AttentionCapture(
            [attention_of(b, p) for b, p in zip(self.layers, projections)],
            [m for m in [forward_module(self.forward_func)] if m is not None],
            torch.zeros(0, dtype=torch.long),
            torch.device("cpu"),
        )
        return points, self._placeholders(names)

    def recording(self, positions: Tensor, device: torch.device) -> ContextManager[Any]:
        self._attention.positions, self._attention.device = positions, device
        return self._attention

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        weights, values = self._attention.records()
        p = points.shape[1]  # the last position only, for last-position logits
        weights = [w[:, :, -p:] for w in weights]
        tolerance = split_tolerance(points.dtype)
        heads = cast(HeadSplit, self.heads)  # checked by path_points
        found = source_components(
            heads, weights, values, extras, points, mask, tolerance
        )
        self._sources = found.n_sources
        # SourceComponents builds its rows on demand, read as the components
        return found  # type: ignore[return-value]

    def column_names(self, names: List[str]) -> List[str]:
        out: List[str] = []
        for name in names:
            if not name.endswith(f".attn.{SOURCES}"):
                out.append(name)
                continue
            block = name[: -len(f".{SOURCES}")]
            n_heads = cast(HeadSplit, self.heads).n_heads  # checked by path_points
            heads = range(n_heads) if self.by_head else [None]
            for h in heads:
                prefix = block if h is None else f"{block}.h{h}"
                out += [f"{prefix}.s{j}" for j in range(self._sources)]
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
        for name in names:
            block, dot, rest = name.rpartition(".attn.")
            if dot and rest.startswith("h") and rest[1:].isdigit():
                if rest == "h0":
                    out.append(f"{block}.attn.{SOURCES}")
                continue
            out.append(name)
        return out

    def _split(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        per_dimension: bool,
        grad_kwargs: Optional[Dict[str, Any]],
    ) -> Tensor:
        # this granularity's components are SourceComponents (see components)
        found: SourceComponents = path.components  # type: ignore[assignment]
        attrs = head_attributions(
            rule,
            readout,
            path.points.flatten(0, 1),
            found.flatten(0, 1),  # type: ignore[arg-type]  # indexed on demand
            path.score.flatten(),
            values,
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
            parents=found.parents,
            parallel=self._parallel,
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
    sources = blocks[:, :, : h * t].reshape(n, k, h, t, *rest).sum(2)
    per_block = torch.cat([sources, blocks[:, :, h * t :]], dim=2).flatten(1, 2)
    return torch.cat([attrs[:, :1], per_block], dim=1)
