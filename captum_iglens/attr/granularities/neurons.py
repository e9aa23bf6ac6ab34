r"""The neuron granularity: each block's MLP update split per neuron, and the
top neurons of a result."""

from typing import Any, Dict, List, Optional, Tuple, cast

import torch
from torch import Tensor

from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.heads import HeadSplit, split_tolerance
from captum_iglens.attr._utils.neurons import (
    NeuronComponents,
    neuron_attributions,
    neuron_components,
    neuron_path_points,
    split_neuron_states,
)
from captum_iglens.attr.estimators import Estimator
from captum_iglens.attr.granularities.components import ComponentSplit
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.readout.interface import PathReadout


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
        if self.heads is None:
            raise ValueError(
                "granularity: 'neuron' needs the architecture table's entry for "
                "this model (LayerIGLens.from_model) with mlp_out; this model has "
                'none. Use granularity="sublayer"'
            )
        return neuron_path_points(mids, self.layers, self.heads, self.layer_names)

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return split_neuron_states(states)

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        tolerance = split_tolerance(points.dtype)
        heads = cast(HeadSplit, self.heads)  # checked by path_points
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
        found: NeuronComponents = path.components  # type: ignore[assignment]
        return neuron_attributions(
            rule,
            readout,
            path.points.flatten(0, 1),
            found,
            path.score.flatten(),
            values,
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
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
    for column, name in enumerate(names):
        block, dot, rest = name.rpartition(".mlp.")
        if dot and rest[:1] == "n" and rest[1:].isdigit():
            blocks.setdefault(block, []).append((int(rest[1:]), column))
        elif dot and rest == "bias":
            blocks.setdefault(block, []).append((-1, column))
    out: Dict[str, List[Tuple[int, float]]] = {}
    for block, members in blocks.items():
        ids = [i for i, _ in members if i >= 0]
        values = credits[[c for i, c in members if i >= 0]].float()
        order = values.abs().argsort(descending=True)[:k].tolist()
        kept = [(ids[i], float(values[i])) for i in order]
        total = float(credits[[c for _, c in members]].float().sum())
        out[block] = kept + [(-1, total - sum(v for _, v in kept))]
    return out
