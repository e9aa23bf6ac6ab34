r"""
The edge graph of a decoder-only transformer, named as EAP-IG and MIB name it.

Senders (nodes that write to the residual stream), in execution order:
``input`` (the token embeddings), then per layer ``l`` the heads
``a{l}.h{h}`` and the MLP ``m{l}``. Receivers (inputs read from it): per layer
each head's query, key and value inputs ``a{l}.h{h}<q>``, ``<k>``, ``<v>``,
then ``m{l}``, and last ``logits``. An edge ``"{sender}->{receiver}"`` joins a
sender to every receiver after it (a head's writes reach its own layer's MLP,
not its own layer's heads). Scores and circuits are ``(S, R)`` tensors over
senders × receivers, EAP-IG's ``(n_forward, n_backward)`` layout; entries that
are not edges are ignored.
"""

from typing import Dict, List, Mapping, Optional

import torch
from torch import Tensor


class EdgeGraph:
    r"""
    The nodes and edges of a sequential-block transformer.

    Args:

        n_layers (int): The number of decoder blocks ``L``.
        n_heads (int): Attention heads per block ``H``.

    Attributes:

        senders (list[str]): ``S = 1 + L (H + 1)`` sender names.
        receivers (list[str]): ``R = L (3H + 1) + 1`` receiver names.
        legal (Tensor): ``(S, R)`` bool, which pairs are edges.
        receiver_node (list[int]): For each receiver, the index of the
                    sender that is the same node (-1 for ``logits``).
    """

    def __init__(self, n_layers: int, n_heads: int) -> None:
        for name, value in (("n_layers", n_layers), ("n_heads", n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.n_layers, self.n_heads = n_layers, n_heads
        self.senders: List[str] = ["input"]
        self.receivers: List[str] = []
        self.receiver_node: List[int] = []
        sender_layer = [-1]  # the layer each sender writes in (-1: before all)
        receiver_layer: List[float] = []  # attention l: l; MLP l: l + 0.5
        for layer in range(n_layers):
            heads = [f"a{layer}.h{h}" for h in range(n_heads)]
            first = len(self.senders)
            for letter in "qkv":
                for h, head in enumerate(heads):
                    self.receivers.append(f"{head}<{letter}>")
                    self.receiver_node.append(first + h)
                    receiver_layer.append(layer)
            self.senders += heads
            sender_layer += [layer] * n_heads
            self.receivers.append(f"m{layer}")
            self.receiver_node.append(len(self.senders))
            receiver_layer.append(layer + 0.5)
            self.senders.append(f"m{layer}")
            sender_layer.append(layer)
        self.receivers.append("logits")
        self.receiver_node.append(-1)
        receiver_layer.append(float(n_layers))
        is_mlp = torch.tensor([name.startswith("m") for name in self.senders])
        s_layer = torch.tensor(sender_layer, dtype=torch.float64)
        s_layer = s_layer + 0.5 * is_mlp  # an MLP's writes reach later layers only
        r_layer = torch.tensor(receiver_layer, dtype=torch.float64)
        self.legal = s_layer[:, None] < r_layer[None, :]
        self._edge_index: Optional[Dict[str, int]] = None

    @property
    def n_senders(self) -> int:
        """``S``."""
        return len(self.senders)

    @property
    def n_receivers(self) -> int:
        """``R``."""
        return len(self.receivers)

    @property
    def n_edges(self) -> int:
        """The number of edges."""
        return int(self.legal.sum())

    def edge_names(self) -> List[str]:
        """Every edge's name, in the row-major order of ``legal`` (by sender,
        then receiver)."""
        pairs = self.legal.nonzero().tolist()
        return [f"{self.senders[s]}->{self.receivers[r]}" for s, r in pairs]

    def edge_index(self) -> Dict[str, int]:
        """Edge name -> flat index into an ``(S, R)`` tensor."""
        if self._edge_index is None:
            pairs = self.legal.nonzero().tolist()
            self._edge_index = {
                f"{self.senders[s]}->{self.receivers[r]}": s * self.n_receivers + r
                for s, r in pairs
            }
        return self._edge_index

    def scores_from_dict(self, scores: Mapping[str, float], what: str) -> Tensor:
        r"""
        An ``(S, R)`` score tensor from scores by edge name.

        Args:

            scores (Mapping[str, float]): A score for every edge.
            what (str): Whose scores, for messages.

        Returns:
            *Tensor*: ``(S, R)`` float64, NaN off the edges.

        Raises:
            ValueError: If a name is not an edge of this graph, or an edge
                        has no score or a non-finite one.
        """
        index = self.edge_index()
        unknown = [name for name in scores if name not in index]
        if unknown:
            raise ValueError(
                f"{what}: {len(unknown)} scores name no edge of this model's "
                f"graph, e.g. {unknown[0]!r} (expected e.g. 'input->a0.h0<q>')"
            )
        if len(scores) != len(index):
            missing = next(name for name in index if name not in scores)
            raise ValueError(
                f"{what}: no score for {len(index) - len(scores)} edges, "
                f"e.g. {missing!r}"
            )
        out = torch.full(
            (self.n_senders * self.n_receivers,), float("nan"), dtype=torch.float64
        )
        flat = torch.tensor([index[name] for name in scores])
        out[flat] = torch.tensor(
            [float(v) for v in scores.values()], dtype=torch.float64
        )
        if not torch.isfinite(out[flat]).all():
            raise ValueError(f"{what}: some edge scores are not finite")
        return out.view(self.n_senders, self.n_receivers)

    def scores_to_dict(self, scores: Tensor) -> Dict[str, float]:
        """Scores by edge name from an ``(S, R)`` tensor."""
        flat = scores.reshape(-1)
        return {name: float(flat[i]) for name, i in self.edge_index().items()}

    def top_edges(self, scores: Tensor, n: int, absolute: bool) -> Tensor:
        r"""
        The circuit of the ``n`` best-scored edges, pruned (:meth:`prune`).

        Args:

            scores (Tensor): ``(S, R)`` edge scores.
            n (int): How many edges to take, at most :attr:`n_edges`.
            absolute (bool): Rank by ``|score|`` (MIB's CMD) or by the signed
                        score (MIB's CPR).

        Returns:
            *Tensor*: ``(S, R)`` bool, the edges in the circuit.
        """
        ranked = scores.abs() if absolute else scores.clone()
        ranked = ranked.to(torch.float64).masked_fill(~self.legal, -float("inf"))
        order = torch.argsort(ranked.reshape(-1), descending=True, stable=True)
        keep = torch.zeros(self.n_senders * self.n_receivers, dtype=torch.bool)
        keep[order[:n]] = True
        return self.prune(keep.view_as(self.legal) & self.legal)

    def prune(self, keep: Tensor) -> Tensor:
        r"""
        MIB's pruning: repeatedly drops nodes with no edge out, or (but for
        ``input``) no edge in, and the edges of dropped nodes, until nothing
        changes. ``logits`` is always kept.

        Args:

            keep (Tensor): ``(S, R)`` bool, the edges in the circuit.

        Returns:
            *Tensor*: ``(S, R)`` bool, the pruned circuit.
        """
        keep = keep & self.legal
        node_of = torch.tensor(self.receiver_node)
        has_node = node_of >= 0
        while True:
            fed = keep.any(0)[has_node].long()
            into = torch.zeros(self.n_senders, dtype=torch.long)
            into = into.index_add_(0, node_of[has_node], fed) > 0
            into[0] = True
            alive = keep.any(1) & into
            receiver_alive = torch.ones(self.n_receivers, dtype=torch.bool)
            receiver_alive[has_node] = alive[node_of[has_node]]
            pruned = keep & alive[:, None] & receiver_alive[None, :]
            if torch.equal(pruned, keep):
                return keep
            keep = pruned

    def node_circuit(self, nodes: List[str]) -> Tensor:
        r"""
        Node patching as a circuit: every edge out of the named nodes (the
        others' writes are counterfactual for every receiver).

        Args:

            nodes (list[str]): Sender names kept (``input`` is added).

        Returns:
            *Tensor*: ``(S, R)`` bool.
        """
        unknown = sorted(set(nodes) - set(self.senders))
        if unknown:
            raise ValueError(f"nodes: not nodes of this graph: {unknown}")
        kept = torch.tensor([s in nodes or s == "input" for s in self.senders])
        return self.legal & kept[:, None]
