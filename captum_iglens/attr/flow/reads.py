r"""
The flow's view of the :class:`~captum_iglens.graph.model_graph.ModelGraph`:
its receivers but ``logits`` (whose flows the engine keeps apart, per
position) as torch tensors, receiver by sender.
"""

import torch
from torch import Tensor

from captum_iglens.graph.model_graph import ModelGraph


def allowed(graph: ModelGraph) -> Tensor:
    """``(R − 1, S)`` bool: which senders each receiver but ``logits`` reads."""
    return torch.from_numpy(graph.legal[:, :-1].T.copy())


def owners(graph: ModelGraph) -> Tensor:
    """``(R − 1,)`` long: the sender index of each receiver's node."""
    return torch.from_numpy(graph.receiver_node[:-1].copy())


def read_positions(graph: ModelGraph, length: int) -> Tensor:
    r"""
    Which stream positions each receiver reads at each of its positions.

    Args:
        graph (ModelGraph): The graph.
        length (int): The prompt's tokens ``T``.

    Returns:
        *Tensor* ``(R − 1, T, T)`` bool, ``[r, s, t]``: whether receiver ``r``
        at position ``t`` reads the stream at position ``s`` (a head at every
        ``s ≤ t``, an MLP at ``t`` alone).
    """
    causal = torch.ones(length, length, dtype=torch.bool).triu()
    own = torch.eye(length, dtype=torch.bool)
    heads = graph.n_heads * len(graph.kinds)
    per_block = torch.stack([causal] * heads + [own])
    return per_block.repeat(graph.n_layers, 1, 1)
