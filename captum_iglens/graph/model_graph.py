r"""
:class:`ModelGraph`: the nodes and edges of a decoder-only transformer, the one
description of them that the flow, the circuit harness, :class:`FlowGraph` and
the viewer share, named and ordered as EAP-IG and MIB name and order them.

Senders (nodes that write to the residual stream), in execution order:
``input`` (the first block's input), then per block ``l`` its heads
``a{l}.h{h}`` and its MLP ``m{l}``. Receivers (inputs that read it), per block
``l``: each head's query, key and value reads, every head's ``<q>`` first, then
every head's ``<k>``, then every ``<v>`` (``a{l}.h{h}<q>``, ...; one receiver
``a{l}.h{h}`` per head where the reads are not separate), then ``m{l}``; last
``logits``. An edge ``"{sender}->{receiver}"`` joins a sender to every receiver
after it: a head reads what was written before its block; the MLP of a
sequential block also what its block's heads wrote (of a parallel block, not).

Everything here is derived from the model's configuration, never parsed from
names: a name is looked up, and one that no model of this configuration has is
refused.
"""

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from captum_iglens.columns import INPUT

#: The read kinds of a head when queries, keys and values are separate.
QKV = ("q", "k", "v")
#: The last receiver (the first sender is :data:`~captum_iglens.columns.INPUT`).
LOGITS = "logits"


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
class ModelGraph:
    r"""
    The nodes, receivers and legal edges of a model's configuration, as
    arrays over one documented order (the module's): flows, scores and
    circuits are ``(S, R)`` sender × receiver matrices over it, or ``(E,)``
    vectors over its edges in row-major order of :attr:`legal`. Build one with
    :func:`model_graph`, which builds each configuration once.

    Args:
        n_layers (int): Blocks ``L``.
        n_heads (int): Query heads per block ``H``.
        qkv (bool, optional): A head's query, key and value reads are separate
                    receivers. Default: True (EAP-IG's and MIB's graph)
        n_kv_heads (int, optional): Key/value heads per block where they are
                    grouped (a head's ``<k>`` and ``<v>`` are then its own
                    reads through its group's projections). Default: None
                    (one per query head)
        parallel (bool, optional): Attention and MLP read the same stream
                    (EAP-IG's ``parallel_attn_mlp``). Default: False
    """

    n_layers: int
    n_heads: int
    qkv: bool = True
    n_kv_heads: Optional[int] = None
    parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        kv = self.n_kv_heads
        if kv is not None and (
            isinstance(kv, bool)
            or not isinstance(kv, int)
            or kv < 1
            or self.n_heads % kv
        ):
            raise ValueError(
                f"n_kv_heads: expected a divisor of n_heads {self.n_heads}, got {kv!r}"
            )
        for name in ("qkv", "parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name}: expected a bool, got {getattr(self, name)!r}"
                )

    # ------------------------------------------------------------------ nodes

    @property
    def kinds(self) -> Tuple[str, ...]:
        """A head's read kinds: :data:`QKV`, or one unnamed read."""
        return QKV if self.qkv else ("",)

    @cached_property
    def senders(self) -> List[str]:
        """``S = 1 + L (H + 1)`` names: ``input``, then per block its heads
        and its MLP."""
        names = [INPUT]
        for layer in range(self.n_layers):
            names += [head_name(layer, h) for h in range(self.n_heads)]
            names.append(mlp_name(layer))
        return names

    @cached_property
    def nodes(self) -> List[str]:
        """``N = S + 1`` names: the senders, then ``logits``."""
        return self.senders + [LOGITS]

    @cached_property
    def node_index(self) -> Dict[str, int]:
        """Node name -> its index in :attr:`nodes`."""
        return {name: i for i, name in enumerate(self.nodes)}

    @cached_property
    def receivers(self) -> List[str]:
        """``R = L (H · kinds + 1) + 1`` names: per block every head's read of
        each kind, kind by kind, then its MLP; last ``logits``."""
        names = []
        for layer in range(self.n_layers):
            for kind in self.kinds:
                read = f"<{kind}>" if kind else ""
                names += [head_name(layer, h) + read for h in range(self.n_heads)]
            names.append(mlp_name(layer))
        return names + [LOGITS]

    @cached_property
    def receiver_node(self) -> np.ndarray:
        """``(R,)`` int: the index in :attr:`nodes` of each receiver's node
        (a head's read is its head; ``logits`` is the last node)."""
        index = []
        for layer in range(self.n_layers):
            first = 1 + layer * (self.n_heads + 1)
            index += list(range(first, first + self.n_heads)) * len(self.kinds)
            index.append(first + self.n_heads)
        return np.array(index + [len(self.senders)])

    @cached_property
    def node_depth(self) -> np.ndarray:
        r"""``(N,)`` float: where each node sits in the stream: ``input`` 0,
        block ``l``'s heads ``2l + 1``, its MLP ``2l + 2`` (``2l + 1`` for a
        parallel block), ``logits`` infinity. A node reads what the nodes of
        smaller depth wrote; the stream after block ``l`` lies between depths
        ``2l + 2`` and ``2l + 3``."""
        depth = [0.0]
        mlp = 1.0 if self.parallel else 2.0
        for layer in range(self.n_layers):
            depth += [2.0 * layer + 1] * self.n_heads + [2.0 * layer + mlp]
        return np.array(depth + [np.inf])

    # ------------------------------------------------------------------ edges

    @cached_property
    def legal(self) -> np.ndarray:
        """``(S, R)`` bool: which sender feeds which receiver: those of
        smaller depth (so no node reads itself, and a parallel block's MLP not
        its own block's heads)."""
        depth = self.node_depth
        sender = depth[: len(self.senders)]
        return sender[:, None] < depth[self.receiver_node][None, :]

    @cached_property
    def edge_senders(self) -> np.ndarray:
        """``(E,)`` int: each edge's sender, edges in row-major order of
        :attr:`legal`."""
        return self.legal.nonzero()[0]

    @cached_property
    def edge_receivers(self) -> np.ndarray:
        """``(E,)`` int: each edge's receiver."""
        return self.legal.nonzero()[1]

    @property
    def n_edges(self) -> int:
        """``E``."""
        return len(self.edge_senders)

    @cached_property
    def edges(self) -> List[str]:
        """``E`` edge names, in row-major order of :attr:`legal`."""
        senders, receivers = self.senders, self.receivers
        pairs = zip(self.edge_senders.tolist(), self.edge_receivers.tolist())
        return [edge_name(senders[s], receivers[r]) for s, r in pairs]

    @cached_property
    def edge_index(self) -> Dict[str, int]:
        """Edge name -> its index in :attr:`edges`."""
        return {name: i for i, name in enumerate(self.edges)}

    def edge_positions(self, names: Iterable[str], what: str) -> np.ndarray:
        r"""
        The positions in :attr:`edges` of names that must be every edge of the
        graph, once each.

        Args:
            names (Iterable[str]): Edge names.
            what (str): Whose names, for messages.

        Returns:
            *np.ndarray* ``(E,)`` int: the position of each name, in the
            order given.

        Raises:
            ValueError: Naming ``what``, for a name that is no edge of this
                graph, or an edge that is not named.
        """
        index = self.edge_index
        names = list(names)
        unknown = [name for name in names if name not in index]
        if unknown:
            raise ValueError(
                f"{what}: {len(unknown)} edges the model's graph does not have, "
                f"e.g. {unknown[0]!r} ({self.describe()}; its edges are named "
                f"e.g. {self.edges[0]!r})"
            )
        positions = np.array([index[name] for name in names], dtype=np.int64)
        count = self.n_edges - len(np.unique(positions))
        if count:
            named = set(names)
            missing = next(name for name in self.edges if name not in named)
            raise ValueError(
                f"{what}: {count} of the model's {self.n_edges} edges missing, "
                f"e.g. {missing!r}"
            )
        return positions

    def blocks(self) -> List[Tuple[slice, int]]:
        """Per block, the slice of its heads' receivers and its MLP's
        receiver index."""
        per_block = self.n_heads * len(self.kinds) + 1
        return [
            (
                slice(layer * per_block, (layer + 1) * per_block - 1),
                (layer + 1) * per_block - 1,
            )
            for layer in range(self.n_layers)
        ]

    def describe(self) -> str:
        """The configuration in words, for messages."""
        kv = "" if self.n_kv_heads is None else f" ({self.n_kv_heads} key/value)"
        kind = "parallel" if self.parallel else "sequential"
        reads = "q/k/v reads separate" if self.qkv else "one read per head"
        return f"{self.n_layers} {kind} blocks of {self.n_heads} heads{kv}, {reads}"


@lru_cache(maxsize=32)
def model_graph(
    n_layers: int,
    n_heads: int,
    qkv: bool = True,
    n_kv_heads: Optional[int] = None,
    parallel: bool = False,
) -> ModelGraph:
    r"""
    The :class:`ModelGraph` of a configuration, built once per configuration
    (its arrays are computed on first use and shared: read them, never write
    them).

    Args:
        n_layers (int): Blocks.
        n_heads (int): Query heads per block.
        qkv (bool, optional): Separate query, key and value receivers.
                    Default: True
        n_kv_heads (int, optional): Key/value heads per block. Default: None
        parallel (bool, optional): Parallel attention and MLP. Default: False

    Returns:
        *ModelGraph*.
    """
    return ModelGraph(n_layers, n_heads, qkv, n_kv_heads, parallel)
