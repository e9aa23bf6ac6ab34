r"""
The nodes and edges of a probability-flow graph, named as EAP-IG and MIB name
them, so that their circuit tools read our edge scores unchanged.

Senders (nodes that write to the residual stream): ``input`` (the embeddings,
every position), ``a{l}.h{h}`` (head ``h`` of block ``l``) and ``m{l}`` (the
MLP of block ``l``). Receivers (nodes that read it): the heads (or their
query, key and value reads, ``a{l}.h{h}<q>``, ``<k>``, ``<v>``), the MLPs and
``logits``. An edge is ``"{sender}->{receiver}"``. A sender feeds every receiver
after it: a head of block ``l`` reads what was written before block ``l``, the
MLP of block ``l`` also what block ``l``'s heads wrote, ``logits`` everything.
"""

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor

#: The read kinds of a head when queries, keys and values are separate.
QKV = ("q", "k", "v")
#: The output node.
LOGITS = "logits"
INPUT_NODE = "input"


def head_name(layer: int, head: int) -> str:
    """``a{layer}.h{head}``."""
    return f"a{layer}.h{head}"


def mlp_name(layer: int) -> str:
    """``m{layer}``."""
    return f"m{layer}"


def edge_name(sender: str, receiver: str) -> str:
    """``"{sender}->{receiver}"``."""
    return f"{sender}->{receiver}"


@dataclass(frozen=True)
class FlowLayout:
    r"""
    Which nodes a graph has and which edges connect them.

    Args:
        n_layers (int): Blocks ``L``.
        n_heads (int): Query heads per block ``H``.
        qkv (bool): Whether a head's query, key and value reads are separate
                    receivers (``a{l}.h{h}<q>``, ...). Default: False
    """

    n_layers: int
    n_heads: int
    qkv: bool = False

    @property
    def kinds(self) -> int:
        """Receivers per head: 3 with ``qkv``, else 1."""
        return len(QKV) if self.qkv else 1

    def senders(self) -> List[str]:
        """``S = 1 + L (H + 1)`` names: ``input``, then per block its heads and
        its MLP."""
        names = [INPUT_NODE]
        for layer in range(self.n_layers):
            names += [head_name(layer, h) for h in range(self.n_heads)]
            names.append(mlp_name(layer))
        return names

    def receivers(self) -> List[str]:
        """``R = L (H · kinds + 1)`` names (``logits`` not included): per block
        its heads' reads, then its MLP."""
        names = []
        for layer in range(self.n_layers):
            for h in range(self.n_heads):
                head = head_name(layer, h)
                names += [f"{head}<{k}>" for k in QKV] if self.qkv else [head]
            names.append(mlp_name(layer))
        return names

    def sender_of_receiver(self) -> Tensor:
        """``(R,)`` long: the sender index of each receiver's node."""
        index = []
        for layer in range(self.n_layers):
            first = 1 + layer * (self.n_heads + 1)
            for h in range(self.n_heads):
                index += [first + h] * self.kinds
            index.append(first + self.n_heads)
        return torch.tensor(index)

    def allowed(self) -> Tensor:
        """``(R, S)`` bool: which senders each receiver reads (those before it)."""
        depth_s = torch.tensor([0] + self._depths(sender=True))
        depth_r = torch.tensor(self._depths(sender=False))
        return depth_s.unsqueeze(0) < depth_r.unsqueeze(1)

    def read_positions(self, length: int) -> Tensor:
        r"""
        Which stream positions each receiver reads at each of its positions.

        Args:
            length (int): The prompt's tokens ``T``.

        Returns:
            *Tensor* ``(R, T, T)`` bool, ``[r, s, t]``: whether receiver ``r``
            at position ``t`` reads the stream at position ``s`` (a head at
            every ``s ≤ t``, an MLP at ``t`` alone).
        """
        causal = torch.ones(length, length, dtype=torch.bool).triu()
        own = torch.eye(length, dtype=torch.bool)
        heads = self.n_heads * self.kinds
        per_block = torch.stack([causal] * heads + [own])
        return per_block.repeat(self.n_layers, 1, 1)

    def _depths(self, sender: bool) -> List[int]:
        """Depth of each node: block ``l``'s heads ``2l + 1``, its MLP ``2l + 2``."""
        depths = []
        per_head = 1 if sender else self.kinds
        for layer in range(self.n_layers):
            depths += [2 * layer + 1] * (self.n_heads * per_head)
            depths.append(2 * layer + 2)
        return depths

    def slices(self) -> List[Tuple[slice, int]]:
        """Per block, the slice of its heads' receivers and its MLP's row."""
        per_block = self.n_heads * self.kinds + 1
        return [
            (
                slice(layer * per_block, layer * per_block + per_block - 1),
                layer * per_block + per_block - 1,
            )
            for layer in range(self.n_layers)
        ]
