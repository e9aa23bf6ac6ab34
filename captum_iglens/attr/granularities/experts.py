r"""
The split of each mixture-of-experts block's MLP update into its experts, for
``granularity="expert"``.

The MoE MLP adds ``Σ_e g_e · expert_e(x)`` (the routed experts, ``g_e`` the
router's weight of expert ``e``, zero where it is not chosen) plus, where the
block has them, shared experts. With the router's choice and weights of the real
forward fixed, each routed expert's term is a component of the segment
``h_mid → h_out``, and the shared experts are the rest of the update. Each term
is computed by the block's own experts module, called on the attributed rows
with the weights of every other expert set to zero.

The expert granularity: each mixture-of-experts block's MLP update split
per routed expert (and the shared experts).
"""

from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle

from captum_iglens.attr._utils.block_parts import (
    BlockParts,
    split_tolerance,
)
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr.granularities.neurons import Neurons
from captum_iglens.columns import Column


class RouterCapture:
    r"""
    Records, during one forward, the inputs of each block's experts module: the
    tokens ``(N, d)``, the chosen experts ``(N, K)`` and their weights ``(N, K)``
    (``N`` the batch's tokens, flattened). Hooks are removed on exit.

    Args:
        experts (list[Module]): Per block, its routed experts module.
    """

    def __init__(self, experts: Sequence[Module]) -> None:
        self.experts = list(experts)
        self.records: Dict[int, Tuple[Tensor, Tensor, Tensor]] = {}
        self._handles: List[RemovableHandle] = []

    def _keep(self, index: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        names = ("hidden_states", "top_k_index", "top_k_weights")
        values = list(args) + [kwargs[n] for n in names[len(args) :] if n in kwargs]
        if len(values) != 3 or not all(isinstance(v, Tensor) for v in values):
            raise ValueError(
                "granularity: 'expert' expects the experts module to be called as "
                "experts(hidden_states, top_k_index, top_k_weights)"
            )
        x, index_, weights = (v.detach() for v in values)
        self.records[index] = (x.flatten(0, -2), index_.flatten(0, -2), weights)

    def __enter__(self) -> "RouterCapture":
        self.records = {}
        for j, module in enumerate(self.experts):
            self._handles.append(
                module.register_forward_pre_hook(
                    lambda m, args, kwargs, j=j: self._keep(j, args, kwargs),
                    with_kwargs=True,
                )
            )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def expert_components(
    experts: Sequence[Module],
    records: Dict[int, Tuple[Tensor, Tensor, Tensor]],
    positions: Tensor,
    points: Tensor,
    mask: Tensor,
    shared: bool,
    tolerance: float,
) -> Tensor:
    r"""
    Each block's MLP update split into its routed experts' terms (and the
    shared experts' output), checked against the update the model made.

    Args:
        records (dict): ``RouterCapture.records``.
        positions (Tensor): ``(P,)``: the attributed positions.
        points (Tensor): ``(B, P, 2k + 1, d)``: ``h_base, h_mid(1), h_out(1), ...``.
        mask (Tensor): ``(B, P)``, False at padding.
        shared (bool): The blocks add shared experts: the last component is the
                    update minus the routed terms.
        tolerance (float): Allowed error relative to ``1 + max |update|``.

    Returns:
        *Tensor* ``(B·P·k, E (+1), d)`` float32, rows ordered ``(b, p, block)``.

    Raises:
        ValueError: If the routed terms do not add up to the update (without
            shared experts), or an experts module did not run.
    """
    b, p = mask.shape
    stream = points.float()
    updates = stream[:, :, 2::2] - stream[:, :, 1::2]  # (B, P, k, d)
    blocks = []
    for j, module in enumerate(experts):
        if j not in records:
            raise ValueError(
                f"granularity: 'expert': the experts of chosen block {j} did not run"
            )
        x, index, weights = records[j]
        length = x.shape[0] // b
        rows = (
            torch.arange(b, device=x.device)[:, None] * length
            + positions.to(x.device)[None, :]
        ).flatten()
        x, index, weights = x[rows], index[rows], weights[rows]
        n_experts = _n_experts(module, index)
        terms = []
        with torch.no_grad():
            for e in range(n_experts):
                alone = torch.where(index == e, weights, torch.zeros_like(weights))
                terms.append(module.forward(x, index, alone).float())
        blocks.append(torch.stack(terms, 1).view(b, p, n_experts, -1))
    routed = torch.stack(blocks, 2).to(points.device)  # (B, P, k, E, d)
    rest = updates - routed.sum(3)
    if shared:
        routed = torch.cat([routed, rest.unsqueeze(3)], dim=3)
    else:
        error = rest[mask].abs()
        size = 1.0 + updates[mask].abs().max().item() if mask.any() else 1.0
        if error.numel() and error.max().item() > tolerance * size:
            raise ValueError(
                "granularity: 'expert' needs each chosen block's MLP update to be "
                "the sum of its routed experts' terms, but they differ by "
                f"{error.max().item():.3g}; check the architecture table's experts "
                "and shared_experts for this model"
            )
    return routed.flatten(0, 2)


def _n_experts(module: Module, index: Tensor) -> int:
    count = getattr(module, "num_experts", None)
    if isinstance(count, int) and count > 0:
        return count
    return int(index.max()) + 1


class Experts(Neurons):
    r"""Per block ``"<name>.attn"`` (as ``"sublayer"``), then ``"<name>.mlp.e<i>"``
    for every routed expert ``i`` (``g_i · expert_i(x)`` with the router's
    choice and weights of the real forward; zero where not chosen) and
    ``"<name>.mlp.shared"`` where the block adds shared experts."""

    name = "expert"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        mids = self._mids()
        if self.block_parts is None or self.block_parts.experts is None:
            raise ValueError(
                "granularity: 'expert' needs every chosen block's MLP to be a "
                "mixture of experts with a routed experts module (the "
                "architecture table's experts); this model has none, or a dense "
                'block among the chosen ones. Use granularity="neuron" or '
                '"sublayer"'
            )
        self._router = RouterCapture(self.block_parts.experts)
        points: List[PathPoint] = []
        names: List[str] = []
        for name, mid, block, experts in zip(
            self.layer_names, mids, self.layers, self.block_parts.experts
        ):
            points += [(mid, True), (block, False)]
            count = getattr(experts, "num_experts", None)
            if not isinstance(count, int):
                raise ValueError(
                    "granularity: 'expert' needs the experts module's num_experts"
                )
            names.append(Column("sublayer", name, "attn").name)
            names += [Column("expert", name, index=i).name for i in range(count)]
            if self.block_parts.shared_experts:
                names.append(Column("shared", name).name)
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
        heads = cast(BlockParts, self.block_parts)  # path_points checked it has experts
        return expert_components(
            cast(List[Module], heads.experts),
            self._router.records,
            self._positions[-p:],
            points,
            mask,
            heads.shared_experts,
            split_tolerance(points.dtype),
        )
