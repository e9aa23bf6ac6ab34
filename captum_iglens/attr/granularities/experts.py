r"""The expert granularity: each mixture-of-experts block's MLP update split
per routed expert (and the shared experts)."""

from typing import Any, ContextManager, List, Optional, Tuple, cast

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.experts import RouterCapture, expert_components
from captum_iglens.attr._utils.heads import HeadSplit, split_tolerance
from captum_iglens.attr.granularities.neurons import Neurons


class Experts(Neurons):
    r"""Per block ``"<name>.attn"`` (as ``"sublayer"``), then ``"<name>.mlp.e<i>"``
    for every routed expert ``i`` (``g_i · expert_i(x)`` with the router's
    choice and weights of the real forward; zero where not chosen) and
    ``"<name>.mlp.shared"`` where the block adds shared experts."""

    name = "expert"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        if self.heads is None or self.heads.experts is None:
            raise ValueError(
                "granularity: 'expert' needs every chosen block's MLP to be a "
                "mixture of experts with a routed experts module (the "
                "architecture table's experts); this model has none, or a dense "
                'block among the chosen ones. Use granularity="neuron" or '
                '"sublayer"'
            )
        self._router = RouterCapture(self.heads.experts)
        points: List[PathPoint] = []
        names: List[str] = []
        for name, mid, block, experts in zip(
            self.layer_names, mids, self.layers, self.heads.experts
        ):
            points += [(mid, True), (block, False)]
            count = getattr(experts, "num_experts", None)
            if not isinstance(count, int):
                raise ValueError(
                    "granularity: 'expert' needs the experts module's num_experts"
                )
            names += [f"{name}.attn", *(f"{name}.mlp.e{i}" for i in range(count))]
            if self.heads.shared_experts:
                names.append(f"{name}.mlp.shared")
        return points, names

    def recording(self, positions: Tensor, device: torch.device) -> ContextManager[Any]:
        self._positions = positions
        return self._router

    def split(self, states: List[Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        return states, []

    def components(
        self, points: Tensor, extras: List[Tensor], mask: Tensor
    ) -> Optional[Tensor]:
        p = points.shape[1]  # the last position only, for last-position logits
        heads = cast(HeadSplit, self.heads)  # path_points checked it has experts
        return expert_components(
            cast(List[Module], heads.experts),
            self._router.records,
            self._positions[-p:],
            points,
            mask,
            heads.shared_experts,
            split_tolerance(points.dtype),
        )
