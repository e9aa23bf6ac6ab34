"""Circuits over the model graph (captum_iglens.graph.circuit): edge counts
from the formula, scores by name and their refusals, MIB's pruning and the
top-n circuit on hand-built cases whose answer is known."""

import pytest
import torch

from captum_iglens.graph.circuit import (
    circuit_edges,
    edge_matrix,
    edge_values,
    legal_edges,
    node_circuit,
    prune,
    scores_from_dict,
    scores_to_dict,
    top_edges,
)
from captum_iglens.graph.model_graph import model_graph


def _circuit(graph, *names):
    """The (S, R) circuit of the named edges, by sender and receiver index."""
    keep = torch.zeros(graph.legal.shape, dtype=torch.bool)
    for name in names:
        sender, receiver = name.split("->")
        keep[graph.senders.index(sender), graph.receivers.index(receiver)] = True
    return keep


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (2, 4), (3, 2)])
def test_edge_counts_and_names(n_layers, n_heads):
    graph = model_graph(n_layers, n_heads)
    senders_before = [1 + layer * (n_heads + 1) for layer in range(n_layers)]
    expected = sum(3 * n_heads * s + s + n_heads for s in senders_before)
    expected += 1 + n_layers * (n_heads + 1)  # into logits
    assert int(legal_edges(graph).sum()) == expected == graph.n_edges
    names = set(circuit_edges(graph, legal_edges(graph)))
    assert len(names) == expected
    assert "input->a0.h0<q>" in names and "a0.h0->m0" in names
    assert f"m{n_layers - 1}->logits" in names
    assert "a0.h0->a0.h0<v>" not in names and "m0->a0.h0<k>" not in names


def test_scores_by_name_round_trip_and_refusals():
    graph = model_graph(2, 2)
    scores = {name: float(i) for i, name in enumerate(graph.edges)}
    tensor = scores_from_dict(graph, scores, "flow")
    assert scores_to_dict(graph, tensor) == scores
    assert torch.isnan(tensor[~legal_edges(graph)]).all()
    assert (
        tensor[graph.senders.index("a0.h1"), graph.receivers.index("m0")]
        == (scores["a0.h1->m0"])
    )
    with pytest.raises(
        ValueError,
        match="flow: 1 edges the model.s graph does not have, e.g. 'a1.h0->a0",
    ):
        scores_from_dict(graph, dict(scores, **{"a1.h0->a0.h0<q>": 1.0}), "flow")
    with pytest.raises(
        ValueError, match="flow: 1 of the model.s 46 edges missing, e.g. 'input"
    ):
        scores_from_dict(graph, dict(list(scores.items())[1:]), "flow")
    with pytest.raises(ValueError, match="flow: some edge scores are not finite"):
        scores_from_dict(graph, dict(scores, **{"a0.h1->m0": float("inf")}), "flow")
    with pytest.raises(ValueError, match=r"values: expected \(\d+,\), got \(3,\)"):
        edge_matrix(graph, torch.zeros(3))
    assert torch.equal(edge_values(graph, tensor), torch.arange(graph.n_edges).double())


def test_prune_drops_unfed_and_unread_nodes():
    graph = model_graph(2, 2)
    assert not prune(graph, _circuit(graph, "a1.h0->logits")).any()  # reads nothing
    assert not prune(graph, _circuit(graph, "input->a0.h1<q>")).any()  # read by none
    kept = _circuit(graph, "input->a0.h1<v>", "a0.h1->m1", "m1->logits")
    assert torch.equal(prune(graph, kept), kept)


def test_prune_cascades_to_the_known_answer():
    """a0.h0 is fed and read by m0, but m0 is read by nothing: dropping m0
    leaves a0.h0 unread, so a0.h0 and its in-edge go too; the path through
    a1.h1 to the logits stays, and the illegal entry is dropped."""
    graph = model_graph(2, 2)
    chain = ("input->a0.h0<k>", "a0.h0->m0")
    path = ("input->a1.h1<q>", "a1.h1->logits")
    keep = _circuit(graph, *chain, *path)
    keep[graph.senders.index("m1"), graph.receivers.index("a0.h0<q>")] = True
    assert torch.equal(prune(graph, keep), _circuit(graph, *path))


def test_top_edges_takes_the_best_scores_signed_or_absolute():
    graph = model_graph(1, 1)
    scores = torch.zeros(graph.legal.shape, dtype=torch.float64)
    best = ("input->a0.h0<v>", "a0.h0->m0", "m0->logits")
    for value, name in zip((3.0, 2.0, 1.0), best):
        scores[_circuit(graph, name)] = value
    scores[_circuit(graph, "input->logits")] = -5.0
    scores[~legal_edges(graph)] = 100.0  # off the edges: never taken
    assert circuit_edges(graph, top_edges(graph, scores, 3, False)) == sorted(
        best, key=graph.edges.index
    )
    assert circuit_edges(graph, top_edges(graph, scores, 1, True)) == ["input->logits"]
    # the best edge alone is pruned away: a0.h0 is read by nothing
    assert not top_edges(graph, scores, 1, False).any()


def test_node_circuit_keeps_every_edge_out_of_the_nodes():
    graph = model_graph(2, 1)
    kept = node_circuit(graph, ["a1.h0"])
    assert circuit_edges(graph, kept) == [
        name for name in graph.edges if name.split("->")[0] in ("input", "a1.h0")
    ]
    with pytest.raises(ValueError, match=r"nodes: not nodes of this graph: \['x'\]"):
        node_circuit(graph, ["x"])
