"""FlowGraph.route, the route that carries the most of Δm, against a
brute-force enumeration of every input→logits path, node to node: on a
two-block graph with hand-set flows (ties everywhere), on synthetic conserved
graphs (queries, keys and values separate or not), for either sign of Δm
and on a pruned graph."""

from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest

from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens.attr.flow.route import widest_path
from captum_iglens.graph.model_graph import model_graph
from tests.viewer.synthetic_graph import synthetic_graph

CFG = dict(
    n_layers=2,
    n_heads=2,
    n_kv_heads=None,
    d_model=8,
    qkv=False,
    parallel_attn_mlp=False,
)


def _hand_set(flows: np.ndarray, delta_m: float) -> FlowGraph:
    """A ``model_graph(2, 2)`` graph with these flows (not conserved: its
    method is ``first_order``, checked only against its input flows)."""
    graph = model_graph(2, 2, False)
    out_of_input = flows[graph.edge_senders == 0].sum()
    return FlowGraph(
        cfg=CFG,
        flows=flows,
        tokens=["a", "b"],
        input_flows=np.array([out_of_input, 0.0]),
        counterfactual={"kind": "pad"},
        settings={"method": "first_order"},
        m_prompt=0.5 + delta_m,
        m_base=0.5,
    )


def negated_graph(graph: FlowGraph) -> FlowGraph:
    """The same graph with every flow and Δm of the other sign."""
    return replace(
        graph,
        flows=-graph.flows,
        input_flows=-graph.input_flows,
        m_prompt=graph.m_base,
        m_base=graph.m_prompt,
    )


def brute_force_route(graph: FlowGraph):
    """Every input→logits path over the kept edges, node to node: the widest
    bottleneck (in Δm's direction), then the fewest hops, then the first in
    node order; its node names, hop flows and bottleneck, or None."""
    model, n = graph.graph, len(graph.nodes)
    hop_flows: dict = {}
    for e in graph.kept:
        hop = (model.edge_senders[e], model.receiver_node[model.edge_receivers[e]])
        hop_flows[hop] = hop_flows.get(hop, 0.0) + graph.flows[e]
    sign = -1.0 if graph.delta_m < 0 else 1.0
    paths = []
    for k in range(n - 1):
        for middle in combinations(range(1, n - 1), k):
            path = (0, *middle, n - 1)
            hops = list(zip(path, path[1:]))
            if all(hop in hop_flows for hop in hops):
                width = min(sign * hop_flows[hop] for hop in hops)
                paths.append((-width, len(path), path))
    if not paths:
        return None
    _, _, path = min(paths)
    flows = [hop_flows[hop] for hop in zip(path, path[1:])]
    return [graph.nodes[i] for i in path], flows, sign * min(sign * f for f in flows)


def _check(graph: FlowGraph) -> None:
    expected = brute_force_route(graph)
    route = graph.route()
    if expected is None:
        assert route is None
        return
    nodes, flows, bottleneck = expected
    assert route.nodes == nodes
    assert route.flows == pytest.approx(flows, rel=1e-12)
    assert route.bottleneck == pytest.approx(bottleneck, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("delta_m", [0.3, -0.3])
def test_the_route_is_the_brute_forces_on_hand_set_flows_with_ties(seed, delta_m):
    rng = np.random.default_rng(seed)
    size = model_graph(2, 2, False).n_edges
    flows = rng.integers(-2, 3, size).astype(np.float64)  # five values: many ties
    _check(_hand_set(flows, delta_m))


def test_a_tie_goes_to_the_fewest_hops_and_the_sign_follows_delta_m():
    size = model_graph(2, 2, False).n_edges
    route = _hand_set(np.ones(size), 0.3).route()
    assert route.nodes == ["input", "logits"] and route.bottleneck == 1.0
    assert _hand_set(np.ones(size), -0.3).route().bottleneck == 1.0  # every one
    flows = -np.ones(size)
    flows[0] = -3.0  # input->a0.h0, the first edge: the only one wider than 1
    route = _hand_set(flows, -0.3).route()
    assert route.nodes == ["input", "logits"] and route.bottleneck == -1.0


@pytest.mark.parametrize("qkv", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_route_is_the_brute_forces_on_a_conserved_graph(qkv, seed):
    graph = synthetic_graph(3, 2, qkv=qkv, seed=seed)
    _check(graph)
    _check(negated_graph(graph))
    for keep in (0.05, 0.3, 0.8):
        _check(graph.prune(keep))


def test_a_pruned_graph_without_a_route_has_none():
    graph = synthetic_graph(3, 2, seed=0).prune(0.01)
    assert len(graph.kept) == 1 and graph.route() is None


def test_widest_path_keeps_to_the_first_of_equal_routes():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3, all of width 1: the first in node order
    senders, receivers = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
    assert widest_path(senders, receivers, np.ones(4), 4) == [0, 1, 3]
    assert widest_path(senders, receivers, np.array([1, 2, 1, 2.0]), 4) == [0, 2, 3]
    assert widest_path(senders[:1], receivers[:1], np.ones(1), 4) is None
