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
from captum_iglens.attr.granularities.blocks import Sublayers
from captum_iglens.attr.tracing import TracedPath, path_levels
from captum_iglens.readout.interface import PathReadout


class Heads(Sublayers):
    r"""A first column ``"input"``, then per block ``"<name>.attn.h<i>"`` per head
    (and ``"<name>.attn.bias"``), the attention update split as ``Σ_h W_O[:, head
    h] z_h (+ b)`` (through a post-attention RMSNorm's per-position factor where
    the block has one), and ``"<name>.mlp"`` (in a parallel block, the MLP's
    output as a component of the block's one segment)."""

    name = "head"
    learned_readout = False
    supports_unmultiplied = False

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

    def column_blocks(self) -> Optional[List[int]]:
        return None  # components of a segment, not segments

    def map_needs_gradients(self, rule: Estimator) -> bool:
        return True  # the attention segments are split by gradients

    def attributions(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        multiply_by_inputs: bool = True,
    ) -> Tensor:
        self.check_multiply_by_inputs(multiply_by_inputs)
        with torch.no_grad():
            values = path_levels(readout, path, chunk_rows)[0]
        return self._columns(
            rule, readout, path, values, n_steps, chunk_rows, grad_kwargs, True
        )

    def credits(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
    ) -> Tensor:
        with torch.no_grad():  # the gradients along the attention segments
            return self._columns(rule, readout, path, values, n_steps, chunk_rows)

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

    def _columns(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        per_dimension: bool = False,
    ) -> Tensor:
        """The columns ``(B, P, n)``, or ``(B, P, n, d)`` per dimension."""
        b, p = path.targets.shape
        assert path.components is not None  # traced with this granularity
        attrs = head_attributions(
            rule,
            readout,
            path.points.flatten(0, 1),
            path.components.flatten(0, 1),
            path.score.flatten(),
            values.flatten(0, 1),
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
            parallel=self._parallel,
        )
        mask = path.mask.view(b, p, *[1] * (attrs.dim() - 1))
        return attrs.view(b, p, *attrs.shape[1:]) * mask
