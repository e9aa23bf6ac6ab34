"""The node maps lifted to edges (``joint``, ``telescoping``): for each pair
the scores into a head or an MLP add up to its IG-Lens credit, computed here
by LayerIGLens directly, shared equally by its in-edges; those into ``logits``
add up to the map's total; pairs are averaged; the metric is not used."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.node_scores import lift_to_edges
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import SCORERS, ScoringContext
from captum_iglens.graph.circuit import legal_edges, scores_to_dict
from captum_iglens.graph.model_graph import model_graph
from tests.tiny_models import tiny_model


def test_the_lift_shares_a_nodes_credit_by_its_in_degree():
    graph = model_graph(2, 3)
    credits = torch.arange(1.0, len(graph.senders) + 1)  # sender i: credit i + 1
    scores = lift_to_edges(graph, credits)
    assert scores.dtype == torch.float64
    assert (scores[~legal_edges(graph)] == 0).all()
    by_name = scores_to_dict(graph, scores)
    # a0.h0 (sender 1) reads input alone, through q, k and v: 3 in-edges
    for letter in "qkv":
        assert by_name[f"input->a0.h0<{letter}>"] == pytest.approx(2 / 3)
    # m0 (sender 4) reads input and the three heads of block 0
    assert by_name["a0.h2->m0"] == pytest.approx(5 / 4)
    # a1.h0 (sender 5) reads input, a0.h0-2 and m0, through q, k and v
    assert by_name["m0->a1.h0<k>"] == pytest.approx(6 / 15)
    # an edge into logits carries its sender's credit
    assert by_name["a1.h2->logits"] == 8.0
    assert by_name["input->logits"] == 1.0


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def pairs(request):
    """A tiny model bound for the harness and three pairs of 6 tokens."""
    model = tiny_model(request.param)
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(4, 128, (3, 6), generator=generator)
    other = clean.clone()
    other[:, 2] = torch.randint(4, 128, (3,), generator=generator)
    answer, foil = torch.tensor([7, 9, 11]), torch.tensor([8, 10, 12])
    batch = Batch(clean, other, answer, foil, torch.arange(3))
    return model, CircuitModel(model), batch


def _credits(model, graph, clean, answer, path):
    """The pair's head map by LayerIGLens, by the graph's sender names."""
    lens = LayerIGLens.from_model(model)
    result = lens.attribute_map(
        clean,
        target=answer,
        positions=[clean.shape[1] - 1],
        granularity="head",
        path=path,
    )
    by_name = dict(zip(result.layer_names, result.attributions[0, 0].tolist()))
    named = {"input": by_name["input"]}
    for layer in range(graph.n_layers):
        for head in range(graph.n_heads):
            named[f"a{layer}.h{head}"] = by_name[f"{layer}.attn.h{head}"]
        named[f"m{layer}"] = by_name[f"{layer}.mlp"]
    assert set(named) == set(graph.senders)
    return named, float(result.base_prob[0, 0])


@pytest.mark.parametrize("path", ["joint", "telescoping"])
def test_scores_into_each_node_add_up_to_its_credit(pairs, path):
    model, bound, batch = pairs
    graph = bound.graph
    legal = legal_edges(graph)
    node_of = torch.tensor(graph.receiver_node)
    logits = graph.receivers.index("logits")
    for b in range(3):
        rows = slice(b, b + 1)
        pair = Batch(
            batch.clean[rows],
            batch.counterfactual[rows],
            batch.answer[rows],
            batch.foil[rows],
            torch.zeros(1, dtype=torch.long),
        )
        context = ScoringContext(bound, None, [pair], 1, "logit_diff")
        scores = SCORERS[path].function(context)
        credits, base = _credits(model, graph, pair.clean, int(pair.answer[0]), path)
        assert max(abs(v) for v in credits.values()) > 1e-4  # not all zero
        for s, name in enumerate(graph.senders[1:], start=1):
            into = legal & (node_of == s)[None, :]
            edges = scores[into]
            assert float(edges.sum()) == pytest.approx(credits[name], abs=1e-7)
            assert torch.allclose(edges, edges[0].expand_as(edges))  # equal shares
        into_logits = scores[legal[:, logits], logits]
        expected = torch.tensor(
            [credits[n] for n in graph.senders], dtype=torch.float64
        )
        assert torch.allclose(into_logits, expected, atol=1e-9)
        with torch.no_grad():
            probs = model(input_ids=pair.clean).logits[0, -1].softmax(-1)
        # the total is the model's own p(answer) less the readout's at h_0
        p = float(probs[int(pair.answer[0])])
        assert float(into_logits.sum()) == pytest.approx(p - base, abs=1e-6)


@pytest.mark.parametrize("path", ["joint", "telescoping"])
def test_pairs_are_averaged_and_the_metric_is_not_used(pairs, path):
    _, bound, batch = pairs
    together = SCORERS[path].function(
        ScoringContext(bound, None, [batch], 3, "logit_diff")
    )
    alone = [
        SCORERS[path].function(
            ScoringContext(
                bound,
                None,
                [
                    Batch(
                        batch.clean[b : b + 1],
                        batch.counterfactual[b : b + 1],
                        batch.answer[b : b + 1],
                        batch.foil[b : b + 1],
                        torch.zeros(1, dtype=torch.long),
                    )
                ],
                1,
                "prob",
            )
        )
        for b in range(3)
    ]
    assert torch.allclose(together, sum(alone) / 3, atol=1e-8)
    assert not torch.allclose(alone[0], alone[1])
    assert SCORERS[path].steps is None  # no step count
