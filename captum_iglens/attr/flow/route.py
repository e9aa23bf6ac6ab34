r"""
The route that carries the most of a flow graph's ``Δm``: the widest path from
``input`` to ``logits``, node to node.
"""

from typing import List, NamedTuple, Optional

import numpy as np

from captum_iglens.graph.model_graph import ModelGraph


class Route(NamedTuple):
    """The route that carries the most of ``Δm`` (:meth:`FlowGraph.route`)."""

    #: The node names from ``input`` to ``logits``.
    nodes: List[str]
    #: The flow of each hop, node to node (a head's reads summed).
    flows: List[float]
    #: The smallest of them in the direction of ``Δm``'s sign, signed.
    bottleneck: float


def widest_path(
    senders: np.ndarray, receivers: np.ndarray, widths: np.ndarray, n_nodes: int
) -> Optional[List[int]]:
    r"""
    The path from the first node to the last of a DAG whose narrowest edge is
    the widest; of those, the one of fewest edges, then the first in node
    order.

    Args:

        senders (np.ndarray): ``(E,)`` int: each edge's first node.
        receivers (np.ndarray): ``(E,)`` int: each edge's second node, after
                    its first in node order (``senders < receivers``).
        widths (np.ndarray): ``(E,)`` float: each edge's width.
        n_nodes (int): The nodes, ``0`` to ``n_nodes - 1``.

    Returns:
        *list[int]* or None: the path's nodes, first to last; None where no
        path joins them.
    """
    best = np.full(n_nodes, -np.inf)  # the widest bottleneck from node 0
    best[0] = np.inf
    for node in range(1, n_nodes):
        into = receivers == node
        if into.any():
            best[node] = np.minimum(best[senders[into]], widths[into]).max()
    if best[-1] == -np.inf:
        return None
    wide = widths >= best[-1]  # every path of these edges is a widest one
    senders, receivers = senders[wide], receivers[wide]
    hops = np.full(n_nodes, np.inf)  # the fewest wide edges to the last node
    hops[-1] = 0
    for node in range(n_nodes - 2, -1, -1):
        out = senders == node
        if out.any():
            hops[node] = 1 + hops[receivers[out]].min()
    path = [0]
    while path[-1] != n_nodes - 1:
        out = receivers[senders == path[-1]]
        path.append(int(out[hops[out] == hops[path[-1]] - 1].min()))
    return path


def best_route(
    graph: ModelGraph, flows: np.ndarray, kept: np.ndarray, delta_m: float
) -> Optional[Route]:
    r"""
    The route that carries the most of ``Δm`` over the ``kept`` edges
    (:meth:`FlowGraph.route <captum_iglens.attr.flow.graph.FlowGraph.route>`).

    Args:

        graph (ModelGraph): The graph's nodes and edges.
        flows (np.ndarray): ``(E,)``: each edge's flow.
        kept (np.ndarray): The indices of the edges the route may take.
        delta_m (float): ``Δm``, whose sign the route follows.

    Returns:
        *Route* or None.
    """
    n = len(graph.nodes)
    pair = graph.edge_senders[kept] * n
    pair += graph.receiver_node[graph.edge_receivers[kept]]
    pairs, at = np.unique(pair, return_inverse=True)
    summed = np.bincount(at, weights=flows[kept], minlength=len(pairs))
    sign = -1.0 if delta_m < 0 else 1.0
    path = widest_path(pairs // n, pairs % n, sign * summed, n)
    if path is None:
        return None
    hop = np.searchsorted(pairs, np.array(path[:-1]) * n + path[1:])
    hops = summed[hop].tolist()
    return Route(
        nodes=[graph.nodes[node] for node in path],
        flows=hops,
        bottleneck=sign * min(sign * flow for flow in hops),
    )
