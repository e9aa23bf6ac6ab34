"""The exact-flow scorer of the circuit harness: the flow's graph is the
harness's, its scores equal the public ProbabilityFlow's edge flows, and for
each pair the flows into ``logits`` add up to Δm under every metric."""

from functools import partial

import pytest
import torch

from captum_iglens.attr.flow.engine import flow_graph_of
from captum_iglens.attr.flow.probability_flow import ProbabilityFlow
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.graph.target import metric as target_metric
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import SCORERS, ScoringContext
from captum_iglens.graph.circuit import legal_edges, scores_to_dict
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_flows_graph_is_the_harnesss(family):
    """Built apart (the harness from the attention's projections, the flow from
    the config), they agree, grouped key/value heads included; a harness graph
    of another model is refused by the scorer."""
    bound = CircuitModel(tiny_model(family))
    assert flow_graph_of(bound.parts, qkv=True) == bound.graph
    assert bound.graph.qkv
    other = CircuitModel(tiny_model(family))
    other.graph = flow_graph_of(other.parts, qkv=False)
    context = ScoringContext(other, None, [], 1, "prob")
    with pytest.raises(ValueError, match="model: the flow's graph .* is not the"):
        SCORERS["flow"].function(context)


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def pairs(request):
    """A tiny model bound for the harness, and three pairs of 6 tokens whose
    counterfactuals differ at positions 1 and 3."""
    model = tiny_model(request.param)
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(4, 128, (3, 6), generator=generator)
    other = clean.clone()
    other[:, [1, 3]] = torch.randint(4, 128, (3, 2), generator=generator)
    answer = torch.tensor([7, 9, 11])
    foil = torch.tensor([8, 10, 12])
    return (
        model,
        CircuitModel(model),
        Batch(clean, other, answer, foil, torch.arange(3)),
    )


def _one_pair(batch, b):
    rows = slice(b, b + 1)
    return Batch(
        batch.clean[rows],
        batch.counterfactual[rows],
        batch.answer[rows],
        batch.foil[rows],
        torch.zeros(1, dtype=torch.long),
    )


@pytest.mark.parametrize("metric", ["prob", "prob_diff", "logit_diff"])
def test_flows_into_the_logits_add_up_to_the_change_of_m_per_pair(pairs, metric):
    model, bound, batch = pairs
    m = partial(target_metric, metric)
    logits = bound.graph.receivers.index("logits")
    for b in range(3):
        pair = _one_pair(batch, b)
        context = ScoringContext(bound, None, [pair], 1, metric, steps=2)
        scores = SCORERS["flow"].function(context)
        with torch.no_grad():
            delta = m(model(input_ids=pair.clean).logits[:, -1], pair.answer, pair.foil)
            delta -= m(
                model(input_ids=pair.counterfactual).logits[:, -1],
                pair.answer,
                pair.foil,
            )
        into = scores[legal_edges(bound.graph)[:, logits], logits].sum()
        assert abs(float(delta)) > 1e-6  # the counterfactual matters
        assert float(into) == pytest.approx(float(delta), rel=1e-3, abs=1e-8)


@pytest.mark.parametrize(
    "scorer, method, score",
    [
        ("flow", "exact", "flow"),
        ("flow-plain", "first_order", "flow"),
        ("effect", "exact", "effect"),
    ],
)
def test_scores_are_the_public_flow_graphs_edges_averaged(pairs, scorer, method, score):
    model, bound, batch = pairs
    context = ScoringContext(bound, None, [batch], 3, "prob_diff", steps=3)
    got = scores_to_dict(bound.graph, SCORERS[scorer].function(context))
    flow = ProbabilityFlow(model)
    expected = {name: 0.0 for name in got}
    for b in range(3):
        graph = flow.attribute(
            batch.clean[b : b + 1],
            counterfactual=batch.counterfactual[b : b + 1],
            target=int(batch.answer[b]),
            foil=int(batch.foil[b]),
            target_kind="prob_diff",
            n_steps=3,
            qkv=True,
            method=method,
        )
        for name, value in zip(graph.edges, graph.scores(score).tolist()):
            expected[name] += value / 3
    assert set(expected) == set(got)
    worst = max(abs(got[n] - expected[n]) for n in got)
    assert worst <= 1e-6 * max(abs(v) for v in expected.values())
    assert any(abs(got[n]) > 1e-4 for n in got if n.endswith("<k>"))


def test_flow_takes_a_step_count_defaulting_to_the_flows():
    from captum_iglens.studies.circuits.study import parse_method
    from captum_iglens.attr.flow.options import DEFAULT_STEPS

    assert parse_method("flow")["steps"] == DEFAULT_STEPS == SCORERS["flow"].steps
    assert parse_method("flow:4")["steps"] == 4


@pytest.mark.parametrize("scorer", ["flow", "flow-plain", "effect"])
def test_a_batch_scores_as_its_pairs_one_at_a_time(pairs, scorer):
    """One batched call per batch of pairs gives the scores of the pairs run one
    at a time (the scorer's loop before batching), to float64 rounding."""
    model, bound, batch = pairs
    together = ScoringContext(bound, None, [batch], 3, "logit_diff", steps=2)
    apart = ScoringContext(
        bound, None, [_one_pair(batch, b) for b in range(3)], 3, "logit_diff", steps=2
    )
    got, expected = (SCORERS[scorer].function(c) for c in (together, apart))
    assert expected.abs().max() > 1e-4
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()
