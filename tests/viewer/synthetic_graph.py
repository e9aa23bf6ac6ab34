"""A synthetic probability-flow graph for the viewer's graph page: every edge a
model of ``L`` blocks and ``H`` heads has, heavy-tailed random flows made
without a model, of any size, that add up as a real graph's do (each node's
outflow split among its out-edges)."""

from dataclasses import replace

import numpy as np

from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens.graph.model_graph import model_graph


def _conserved(raw: np.ndarray, graph) -> np.ndarray:
    """Flows from ``raw`` that are conserved at every node: from the last
    node back, each node's inflow is its outflow (so ``raw`` only sets how it
    is shared)."""
    flows = raw.copy()
    node_of = graph.receiver_node[graph.edge_receivers]
    for node in range(len(graph.nodes) - 2, 0, -1):
        out = flows[graph.edge_senders == node].sum()
        into = node_of == node
        flows[into] *= out / flows[into].sum()
    return flows


def tied(graph) -> np.ndarray:
    """The two edges whose ``|flow|`` is one: the first two into ``logits``
    (which no conservation rescales)."""
    return np.flatnonzero(graph.edge_receivers == len(graph.receivers) - 1)[:2]


def synthetic_graph(
    layers: int = 3, heads: int = 2, *, qkv: bool = False, seed: int = 0
) -> FlowGraph:
    r"""
    A graph with every edge of a ``layers`` x ``heads`` model and random
    flows over several orders of magnitude, conserved at every node; two
    edges share one ``|flow|`` (:func:`tied`; ``prune`` breaks the tie by the
    graph's order).
    """
    rng = np.random.default_rng(seed)
    graph = model_graph(layers, heads, qkv)
    size = graph.n_edges
    raw = np.abs(rng.standard_normal(size)) * np.exp(2 * rng.standard_normal(size))
    raw *= rng.choice([-1.0, 1.0], size)
    raw[tied(graph)] = raw[tied(graph)[0]] * np.array([1.0, -1.0])
    flows = _conserved(raw, graph)
    into_logits = flows[graph.edge_receivers == len(graph.receivers) - 1].sum()
    flows *= 0.8 / into_logits  # Δm = 0.8
    tokens = ["When", " Mary", " and", " John"]
    out_of_input = flows[graph.edge_senders == 0].sum()
    return FlowGraph(
        cfg=dict(
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=None,
            d_model=8,
            qkv=qkv,
            parallel_attn_mlp=False,
        ),
        flows=flows,
        tokens=tokens,
        input_flows=np.full(len(tokens), out_of_input / len(tokens)),
        counterfactual={"kind": "prompt", "tokens": ["When", " John", " and", " Mary"]},
        settings={
            "method": "exact",
            "n_steps": 4,
            "target_kind": "prob",
            "target_text": "p(' Mary')",
            "model": "/home/someone/.cache/models/SmolLM2-135M",
        },
        m_prompt=0.9,
        m_base=0.1,
    )


def even_graph(layers: int = 8, heads: int = 4, seed: int = 0) -> FlowGraph:
    r"""
    A graph whose flows are all of about one size (``|flow|`` in ``[0.5,
    1.5]``, a fifth of them negative), as a real graph's many middling edges
    are: half of ``|flow|`` takes half the edges. Not conserved; its method
    is ``first_order``, whose graphs are checked only against their input
    flows.
    """
    graph = synthetic_graph(layers, heads, seed=seed)
    rng = np.random.default_rng(seed)
    size = len(graph.flows)
    flows = rng.uniform(0.5, 1.5, size) * rng.choice([1.0, -1.0], size, p=[0.8, 0.2])
    out_of_input = flows[graph.graph.edge_senders == 0].sum()
    return replace(
        graph,
        flows=flows,
        input_flows=np.full(len(graph.tokens), out_of_input / len(graph.tokens)),
        settings={**graph.settings, "method": "first_order"},
    )
