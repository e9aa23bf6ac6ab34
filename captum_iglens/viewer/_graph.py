r"""
The page data of a probability-flow graph
(:class:`~captum_iglens.attr.flow.graph.FlowGraph`): its nodes placed in columns by
block, and its edges as parallel arrays sorted by ``|flow|``, so that the page
keeps the smallest edge set carrying a share of ``|flow|`` as
``FlowGraph.prune(keep, by="share")`` does. Read from the graph's fields; no
result class is imported.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.settings import model_name
from captum_iglens.viewer._payload import RESIDUAL_DIGITS, sig

#: The most edges the page keeps when it opens. A person follows a hundred
#: edges or so one by one; beyond that they cross into a tangle (half of
#: ``|flow|`` is some 600 edges of SmolLM2's 44,371). The slider keeps more.
OPEN_EDGES = 100
#: The slider's step, and its least value: the shares of ``|flow|`` it keeps.
KEEP_STEP = 0.01
#: The most edges the page draws; the rest of the kept set is counted, not drawn.
MAX_DRAWN = 3000
#: Where a graph has its flows by sender and receiver position, the largest
#: of them the page keeps per node, into it and out of it.
PAIRS_PER_NODE = 8


def node_places(graph: ModelGraph) -> List[Tuple[int, int]]:
    r"""
    Where the page draws each node: a column and a row.

    Args:

        graph (ModelGraph): The model's graph.

    Returns:
        *list[tuple[int, int]]*: per node of ``graph.nodes``, its column
        (``input`` 0, block ``l`` ``l + 1``, ``logits`` one after the last
        block) and row (head ``h`` at ``h``, an MLP one below its block's last
        head, ``input`` and ``logits`` -1: the middle).
    """
    places = [(0, -1)]
    for layer in range(graph.n_layers):
        places += [(layer + 1, h) for h in range(graph.n_heads + 1)]
    return places + [(graph.n_layers + 1, -1)]


def _origin(counterfactual: Dict[str, Any]) -> str:
    """Where the path starts, in words."""
    kind = counterfactual.get("kind")
    if kind == "prompt":
        return "counterfactual prompt " + repr("".join(counterfactual["tokens"]))
    if kind == "subject_noise":
        return (
            f"the prompt with its subject {counterfactual['subject']!r} noised "
            f"(ROME, {counterfactual['noise_scale']:g} × the embeddings' std, seed "
            f"{counterfactual['seed']})"
        )
    words = {"mean": "mean embeddings", "pad": "pad-token embeddings"}
    return "baseline: " + words.get(str(kind), "a baseline tensor (1, T, d)")


def _about(graph: Any) -> Dict[str, str]:
    """The header's lines: the prompt, the path's start, the target, the
    model (its name, never a local folder) and the run's settings."""
    settings = graph.settings
    run = f"{settings.get('method', '?')}, n_steps = {settings.get('n_steps', '?')}"
    if graph.cfg["qkv"]:
        run += ", queries, keys and values separate"
    pruned = settings.get("pruned")
    if pruned:
        run += f"; pruned to keep = {pruned['keep']:g} (by {pruned['by']})"
    about = {
        "prompt": "".join(graph.tokens),
        "from": _origin(graph.counterfactual),
        "target": str(settings.get("target_text") or settings.get("target_kind")),
        "model": model_name(str(settings.get("model") or "")),
        "run": run,
    }
    return {key: value for key, value in about.items() if value}


def top_pairs(
    pairs: Optional[np.ndarray], order: np.ndarray, ends: List[Tuple[int, int]]
) -> Optional[Dict[str, List[Any]]]:
    r"""
    The largest flows by sender and receiver position into and out of each
    node (:data:`PAIRS_PER_NODE` each), where the graph has them.

    Args:

        pairs (np.ndarray, optional): The graph's ``pair_flows``, ``(E, T, T)``.
        order (np.ndarray): The page's edge order (graph edge indices).
        ends (list[tuple[int, int]]): Each page edge's sender and receiver
                    node indices.

    Returns:
        *dict* or None: parallel arrays ``edge`` (the page's edge index),
        ``s``, ``t`` (positions) and ``flow``, largest ``|flow|`` first.
    """
    if pairs is None:
        return None
    by_node: Dict[Tuple[str, int], List[int]] = {}
    for i, (sender, receiver) in enumerate(ends):
        by_node.setdefault(("out", sender), []).append(i)
        by_node.setdefault(("in", receiver), []).append(i)
    chosen = set()
    for edges in by_node.values():
        flat = np.abs(pairs[order[edges]]).reshape(-1)
        top = np.argpartition(-flat, min(PAIRS_PER_NODE, flat.size) - 1)
        top = top[:PAIRS_PER_NODE]
        for k in top[flat[top] > 0]:
            e, s, t = np.unravel_index(k, (len(edges), *pairs.shape[1:]))
            chosen.add((edges[e], int(s), int(t)))
    flows = {row: float(pairs[order[row[0]], row[1], row[2]]) for row in chosen}
    rows = sorted(chosen, key=lambda row: (-abs(flows[row]), row))
    return {
        "edge": [e for e, _, _ in rows],
        "s": [s for _, s, _ in rows],
        "t": [t for _, _, t in rows],
        "flow": [flows[row] for row in rows],
    }


def opening_keep(flows: np.ndarray) -> float:
    r"""
    The share of ``|flow|`` the page keeps when it opens: the largest slider
    value (a multiple of :data:`KEEP_STEP`) whose kept set, counted as
    ``FlowGraph.prune(keep)`` and the page count it, has at most
    :data:`OPEN_EDGES` edges; the least value where even that keeps more.

    Args:

        flows (np.ndarray): The page's flows, largest ``|flow|`` first.

    Returns:
        *float*: the opening ``keep``, in ``[KEEP_STEP, 1]``.
    """
    steps = round(1 / KEEP_STEP)
    keeps = np.arange(1, steps + 1) / steps
    carried = np.cumsum(np.abs(flows))
    if not len(carried):
        return 1.0
    counts = np.searchsorted(carried, keeps * carried[-1] * (1 - 1e-12)) + 1
    fits = np.flatnonzero(np.minimum(counts, len(carried)) <= OPEN_EDGES)
    return float(keeps[fits[-1]]) if len(fits) else KEEP_STEP


def route_data(graph: Any) -> Optional[Dict[str, Any]]:
    r"""
    The route that carries the most of ``Δm``
    (:meth:`~captum_iglens.attr.flow.graph.FlowGraph.route`), for the page.

    Args:

        graph (FlowGraph): The graph.

    Returns:
        *dict* or None: ``nodes`` (node indices, ``input`` to ``logits``),
        ``flows`` (each hop's) and ``bottleneck``; None where no kept edges
        join ``input`` to ``logits``.
    """
    route = graph.route()
    if route is None:
        return None
    index = graph.graph.node_index
    return {
        "nodes": [index[node] for node in route.nodes],
        "flows": route.flows,
        "bottleneck": route.bottleneck,
    }


def graph_page(graph: Any) -> Dict[str, Any]:
    r"""
    The page data of a probability-flow graph.

    Args:

        graph (FlowGraph): The graph (whole or pruned).

    Returns:
        *dict*: ``kind`` ``"graph"``, ``title``, ``about`` (the header's
        lines), ``nodes`` (names), ``places`` (see :func:`node_places`),
        ``receivers`` (the receiver names, a head's reads included) and
        ``receiver_node`` (each one's node), ``edges``: ``sender`` (node
        indices), ``receiver`` (receiver indices), ``flow`` and ``effect``
        (unrounded; None without :attr:`FlowGraph.effects`), in
        the order of ``FlowGraph.prune`` (largest ``|flow|`` first, ties in
        the graph's order); ``tokens`` and ``input_flows`` (per position),
        ``m_prompt``, ``m_base``, ``delta_m``, ``completeness_error`` and
        ``conservation_error`` (over every edge), ``kept_into_logits`` (what
        a pruned graph's kept edges carry into ``logits``, or None), ``keep``
        (the share kept on opening, :func:`opening_keep`), ``keep_step``
        (:data:`KEEP_STEP`), ``open_edges`` (:data:`OPEN_EDGES`), ``route``
        (:func:`route_data`), ``max_drawn``, ``pairs`` (:func:`top_pairs`, or
        None) and ``pairs_per_node``
        (:data:`PAIRS_PER_NODE`, the rows of a node's lists by position).
    """
    model = graph.graph
    flows = np.asarray(graph.flows, dtype=np.float64)
    kept = graph.kept
    order = kept[np.argsort(-np.abs(flows[kept]), kind="stable")]
    senders = model.edge_senders[order].tolist()
    reads = model.edge_receivers[order].tolist()
    receiver_node = model.receiver_node.tolist()
    ends = [(s, receiver_node[r]) for s, r in zip(senders, reads)]
    return {
        "kind": "graph",
        "title": f"Probability flow of {_about(graph).get('target', 'a target')}",
        "about": _about(graph),
        "nodes": model.nodes,
        "places": [list(place) for place in node_places(model)],
        "receivers": model.receivers,
        "receiver_node": receiver_node,
        "edges": {
            "sender": senders,
            "receiver": reads,
            "flow": flows[order].tolist(),
            "effect": None if graph.effects is None else graph.effects[order].tolist(),
        },
        "tokens": list(graph.tokens),
        "input_flows": sig(graph.input_flows),
        "m_prompt": sig(graph.m_prompt),
        "m_base": sig(graph.m_base),
        "delta_m": sig(graph.m_prompt - graph.m_base),
        "completeness_error": sig(graph.completeness_error, RESIDUAL_DIGITS),
        "conservation_error": sig(graph.conservation_error, RESIDUAL_DIGITS),
        "kept_into_logits": sig(graph.kept_into_logits),
        "keep": opening_keep(flows[order]),
        "keep_step": KEEP_STEP,
        "open_edges": OPEN_EDGES,
        "route": route_data(graph),
        "max_drawn": MAX_DRAWN,
        "pairs": top_pairs(graph.pair_flows, order, ends),
        "pairs_per_node": PAIRS_PER_NODE,
    }
