r"""The head granularity: each block's attention update split per head."""

from typing import Any, Dict, List, Optional, Tuple, cast

import torch
from torch import Tensor

from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.heads import (
    check_consecutive,
    head_attributions,
    head_components,
    head_path_points,
    split_states,
    split_tolerance,
)
from captum_iglens.attr.estimators import Estimator
from captum_iglens.attr.granularities.components import ComponentSplit
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.readout.interface import PathReadout


class Heads(ComponentSplit):
    r"""A first column ``"input"``, then per block ``"<name>.attn.h<i>"`` per head
    (and ``"<name>.attn.bias"``), the attention update split as ``Σ_h W_O[:, head
    h] z_h (+ b)`` (through a post-attention RMSNorm's per-position factor where
    the block has one), and ``"<name>.mlp"`` (in a parallel block, the MLP's
    output as a component of the block's one segment)."""

    name = "head"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        if self.heads is None:
            raise ValueError(
                "granularity: 'head' needs each block's attention output "
                "projection (heads=); from_model sets it from the architecture "
                "table's attn_out, which is None for this model: its blocks have "
                "no attention heads to split (hybrid recurrent blocks: Mamba or "
                "Gated DeltaNet in some blocks), or the block normalises the "
                "residual stream itself after attention (OPT with "
                "do_layer_norm_before=False, BLOOM with "
                "apply_residual_connection_post_layernorm, GPT-2 with cross-"
                "attention), so no sum of head outputs reaches the stream. Use "
                'granularity="sublayer" or "block"'
            )
        mids = None if self.heads.parallel else self._mids()
        check_consecutive(self.forward_func, self.layers)
        return head_path_points(self.layers, mids, self.heads, self.layer_names)

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return split_states(states, self._parallel)

    @property
    def _parallel(self) -> bool:
        return self.heads is not None and self.heads.parallel

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        tolerance = split_tolerance(points.dtype)
        assert self.heads is not None  # path_points refused None
        return head_components(self.heads, extras, points, mask, tolerance)

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
        assert path.components is not None  # traced with this granularity
        return head_attributions(
            rule,
            readout,
            path.points.flatten(0, 1),
            path.components.flatten(0, 1),
            path.score.flatten(),
            values,
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
            parallel=self._parallel,
        )
