"""A synthetic probability-flow graph for the viewer's graph page: every edge a
model of ``L`` blocks and ``H`` heads has (the receivers of
:mod:`captum_iglens.attr.flow.nodes`), heavy-tailed random flows, made without a
model, of any size."""

from typing import List

import numpy as np

from captum_iglens.attr.flow.graph import FlowGraph


def _edges(layers: int, heads: int, qkv: bool) -> List[str]:
    """Each sender feeds every receiver after it: a block's heads read what was
    written before the block, its MLP also the block's heads, logits all."""
    written, edges = ["input"], []
    reads = ["<q>", "<k>", "<v>"] if qkv else [""]
    for layer in range(layers):
        block = [f"a{layer}.h{h}" for h in range(heads)]
        edges += [f"{s}->{r}{x}" for r in block for x in reads for s in written]
        written += block
        edges += [f"{s}->m{layer}" for s in written]
        written.append(f"m{layer}")
    return edges + [f"{s}->logits" for s in written]


def synthetic_graph(
    layers: int = 3, heads: int = 2, *, qkv: bool = False, seed: int = 0
) -> FlowGraph:
    r"""
    A graph with every edge of a ``layers`` x ``heads`` model and random
    flows of both signs over several orders of magnitude; two edges share
    one ``|flow|`` (a tie ``prune`` breaks by the graph's order).
    """
    rng = np.random.default_rng(seed)
    nodes = ["input"]
    for layer in range(layers):
        nodes += [f"a{layer}.h{h}" for h in range(heads)] + [f"m{layer}"]
    edges = _edges(layers, heads, qkv)
    size = len(edges)
    flows = rng.standard_normal(size) * np.exp(2 * rng.standard_normal(size))
    flows[1] = -flows[0]
    tokens = ["When", " Mary", " and", " John"]
    return FlowGraph(
        nodes=nodes + ["logits"],
        edges=edges,
        flows=flows,
        tokens=tokens,
        input_flows=rng.standard_normal(len(tokens)),
        counterfactual={"kind": "prompt", "tokens": ["When", " John", " and", " Mary"]},
        settings={
            "method": "prediction_aware",
            "n_steps": 4,
            "qkv": qkv,
            "target_kind": "prob",
            "target_text": "p(' Mary')",
            "model": "/home/someone/.cache/models/SmolLM2-135M",
        },
        m_prompt=0.9,
        m_base=0.1,
        completeness_error=1e-16,
        conservation_error=2e-15,
    )
