"""Edge patching and MIB's faithfulness, against values computed
independently: the model's own logits,
a hand-patched residual, and a hand-built 2-layer model whose circuit is known."""

import pytest
import torch

from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.faithfulness import (
    PERCENTS,
    area_weights,
    areas,
    circuits,
    curve,
    faithfulness,
    patched_metrics,
)
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import SCORERS, ScoringContext
from captum_iglens.graph.circuit import (
    legal_edges,
    node_circuit,
    prune,
    top_edges,
)
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3"])
def test_runs_reproduce_the_model_and_leave_no_hooks(family):
    model = tiny_model(family)
    bound = CircuitModel(model)
    clean, other = torch.randint(4, 128, (2, 3, 6))
    with torch.no_grad():
        expected = model(input_ids=clean).logits[:, -1]
        expected_other = model(input_ids=other).logits[:, -1]
        writes = bound.run(other, return_writes=True).writes
        legal = legal_edges(bound.graph)
        full = bound.run(clean, keep=legal, counterfactual=writes).logits
        empty = bound.run(
            clean, keep=torch.zeros_like(legal), counterfactual=writes
        ).logits
    torch.testing.assert_close(full, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(empty, expected_other, atol=1e-5, rtol=1e-5)
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks


def test_patching_one_edge_into_the_logits_by_hand(llama):
    """Only input->logits patched: the final norm reads the clean residual with
    the counterfactual embeddings in place of the clean ones."""
    bound = CircuitModel(llama)
    clean, other = torch.randint(4, 128, (2, 2, 5))
    seen = []
    handle = llama.model.norm.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        with torch.no_grad():
            llama(input_ids=clean)
    finally:
        handle.remove()
    embed = llama.model.embed_tokens
    with torch.no_grad():
        residual = seen[0] - embed(clean) + embed(other)
        expected = llama.lm_head(llama.model.norm(residual))[:, -1]
        keep = legal_edges(bound.graph).clone()
        keep[0, bound.graph.receivers.index("logits")] = False
        writes = bound.run(other, return_writes=True).writes
        got = bound.run(clean, keep=keep, counterfactual=writes).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_area_weights_are_the_trapezoid_rule():
    weights = area_weights(PERCENTS)
    f = torch.rand(len(PERCENTS), dtype=torch.float64)
    x = torch.tensor(PERCENTS, dtype=torch.float64) / 100
    assert float((weights * f).sum()) == pytest.approx(float(torch.trapezoid(f, x)))


def test_areas_by_hand():
    x = torch.tensor(PERCENTS, dtype=torch.float64) / 100
    ones = torch.ones(len(PERCENTS), dtype=torch.float64)
    cpr, cmd = areas(ones)
    assert cpr.item() == pytest.approx(1 - 0.001) and cmd.item() == pytest.approx(0)
    cpr, cmd = areas(x)  # f = k: the area under the line y = x, and under 1 - x
    assert cpr.item() == pytest.approx((1 - 0.001**2) / 2)
    assert cmd.item() == pytest.approx((1 - 0.001) - (1 - 0.001**2) / 2)


# The hand-built model: a tiny Llama whose only writing nodes are a0.h0 and a1.h0
# (every other head's output columns and both MLPs' down projections are zero).
# Counterfactuals differ from the clean prompts at positions 1 and 2 only, so the
# known circuit is a0.h0's inputs at those positions, its writes into a1.h0's
# keys, values and queries, and both heads' writes into the logits. (a1.h0's
# query input and the logits read the last position, the same in both prompts.)
KNOWN = [
    "input->a0.h0<q>",
    "input->a0.h0<k>",
    "input->a0.h0<v>",
    "input->a1.h0<k>",
    "input->a1.h0<v>",
    "a0.h0->a1.h0<q>",
    "a0.h0->a1.h0<k>",
    "a0.h0->a1.h0<v>",
    "a0.h0->logits",
    "a1.h0->logits",
]


@pytest.fixture(scope="module")
def known():
    model = tiny_model("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[:, 8:] = 0  # heads 1-3 (head_dim 8)
            layer.mlp.down_proj.weight.zero_()
    bound = CircuitModel(model)
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(4, 128, (16, 6), generator=generator)
    other = clean.clone()
    other[:, 1:3] = torch.randint(4, 128, (16, 2), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=clean).logits[:, -1]
    answer = logits.argmax(-1)
    foil = logits.scatter(1, answer[:, None], -1e9).argmax(-1)
    batch = Batch(clean, other, answer, foil, torch.arange(16))
    graph = bound.graph
    keep = torch.zeros(graph.legal.shape, dtype=torch.bool)
    for name in KNOWN:
        e = graph.edge_index[name]
        keep[graph.edge_senders[e], graph.edge_receivers[e]] = True
    return bound, batch, keep


def test_known_circuit_is_faithful_and_random_edges_are_not(known):
    bound, batch, circuit = known
    graph = bound.graph
    assert torch.equal(prune(graph, circuit), circuit)
    generator = torch.Generator().manual_seed(0)
    randoms = [
        top_edges(
            graph, torch.rand(graph.legal.shape, generator=generator), len(KNOWN), False
        )
        for _ in range(20)
    ]
    full, empty, m = patched_metrics(
        bound, [batch], [circuit, *randoms], "logit_diff", 16
    )
    f = faithfulness(full, empty, m)
    assert abs(full.mean() - empty.mean()) > 0.1  # the counterfactual matters
    assert f[0].item() == pytest.approx(1.0, abs=1e-4)
    assert abs(f[1:].mean().item()) < 0.1
    less = circuit.clone()
    less[0, graph.receivers.index("a0.h0<v>")] = False
    _, _, m_less = patched_metrics(bound, [batch], [less], "logit_diff", 16)
    assert abs(faithfulness(full, empty, m_less)[0].item() - 1) > 1e-3


@pytest.mark.parametrize(
    "method", ["flow", "eap", "eap-ig-inputs", "eap-ig-activations"]
)
def test_gradient_scorers_find_the_known_circuit(known, method):
    bound, batch, circuit = known
    context = ScoringContext(bound, None, [batch], 16, "logit_diff", steps=3)
    scores = SCORERS[method].function(context)
    outside = scores[legal_edges(bound.graph) & ~circuit]
    assert outside.abs().max() < 1e-9  # no write, or no reader, outside it
    assert (scores[circuit].abs() > 1e-6).all()
    signed, absolute = (
        circuits(bound.graph, scores, False),
        circuits(bound.graph, scores, True),
    )
    full, empty, m = patched_metrics(
        bound, [batch], signed + absolute, "logit_diff", 16
    )
    result = curve(method, signed, full, empty, m[:10], m[10:], n_boot=50)
    at_size = PERCENTS.index(10.0)  # 11 of 110 edges: the circuit and one more
    assert result.f_abs[at_size] == pytest.approx(1.0, abs=1e-4)
    assert (
        result.cpr_ci[0] <= result.cpr <= result.cpr_ci[1]
        or result.cpr_ci[0] == result.cpr_ci[1]
    )


def test_random_and_patching_scorers(known):
    bound, batch, circuit = known
    context = ScoringContext(bound, None, [batch], 16, "prob_diff", seed=2, sample=6)
    first, again = (
        SCORERS["random"].function(context),
        SCORERS["random"].function(context),
    )
    assert torch.equal(first, again)
    exact = SCORERS["patching"].function(context)
    chosen = torch.isfinite(exact)
    assert int(chosen.sum()) == 6 and bool((chosen <= legal_edges(bound.graph)).all())
    for s, r in chosen.nonzero().tolist():  # an edge outside the circuit does nothing
        if not circuit[s, r]:
            assert abs(exact[s, r].item()) < 1e-6


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_node_patching_scorer_is_edge_patching_of_every_out_edge(family):
    """Each node's effect equals the edge-patched run without any of its
    out-edges, and is shared equally by them."""
    bound = CircuitModel(tiny_model(family))
    graph = bound.graph
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(4, 128, (3, 5), generator=generator)
    other = clean.clone()
    other[:, 1:3] = torch.randint(4, 128, (3, 2), generator=generator)
    answer, foil = torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])
    batch = Batch(clean, other, answer, foil, torch.arange(3))
    context = ScoringContext(bound, None, [batch], 3, "logit_diff")
    scores = SCORERS["patching-nodes"].function(context)
    legal = legal_edges(graph)
    assert (scores[~legal] == 0).all()
    keeps = []
    for u in range(len(graph.senders)):
        keep = legal.clone()
        keep[u] = False
        keeps.append(keep)
    full, _, m = patched_metrics(bound, [batch], keeps, "logit_diff", 3)
    expected = (full - m).mean(1).double()
    torch.testing.assert_close(scores.sum(1), expected, atol=1e-5, rtol=1e-5)
    for u in range(len(graph.senders)):
        row = scores[u][legal[u]]
        torch.testing.assert_close(row, row[:1].expand_as(row))
    assert expected.abs().min() < expected.abs().max() / 10  # nodes differ


@pytest.mark.parametrize("denoising", [False, True])
def test_node_patching_by_hand_with_the_models_own_modules(denoising):
    """An MLP's output and one head's slice of the output projection's input,
    swapped between the clean and counterfactual forwards by hooks on the
    Hugging Face modules; and the input node, whose effect is the whole Δm."""
    model = tiny_model("llama")
    bound = CircuitModel(model)
    generator = torch.Generator().manual_seed(4)
    clean = torch.randint(4, 128, (2, 5), generator=generator)
    other = clean.clone()
    other[:, 1:3] = torch.randint(4, 128, (2, 2), generator=generator)
    answer, foil = torch.tensor([5, 6]), torch.tensor([8, 9])
    batch = Batch(clean, other, answer, foil, torch.arange(2))
    name = "patching-nodes-denoising" if denoising else "patching-nodes"
    context = ScoringContext(bound, None, [batch], 2, "logit_diff")
    effects = SCORERS[name].function(context).sum(1)
    senders = bound.graph.senders

    def m(ids):  # logit_diff, by hand
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1].double()
        rows = torch.arange(len(ids))
        return logits[rows, answer] - logits[rows, foil]

    def recorded(module, ids, pre):
        seen = []
        hook = (
            module.register_forward_pre_hook(lambda _, a: seen.append(a[0]))
            if pre
            else module.register_forward_hook(lambda _, a, out: seen.append(out))
        )
        try:
            m(ids)
        finally:
            hook.remove()
        return seen[0]

    def swapped(module, ids, source, pre, columns):
        def replace(x):
            x = x.clone()
            x[..., columns] = source[..., columns]
            return x

        hook = (
            module.register_forward_pre_hook(lambda _, a: (replace(a[0]),))
            if pre
            else module.register_forward_hook(lambda _, a, out: replace(out))
        )
        try:
            return m(ids)
        finally:
            hook.remove()

    into, source_ids = (other, clean) if denoising else (clean, other)
    layer = model.model.layers[1]
    for node, module, pre, columns in [
        ("m0", model.model.layers[0].mlp, False, slice(None)),
        ("a1.h2", layer.self_attn.o_proj, True, slice(16, 24)),  # head_dim 8
    ]:
        source = recorded(module, source_ids, pre)
        patched = swapped(module, into, source, pre, columns)
        effect = (patched - m(into)) if denoising else (m(into) - patched)
        assert effects[senders.index(node)].item() == pytest.approx(
            effect.mean().item(), abs=1e-5
        )
    whole = (m(clean) - m(other)).mean().item()
    assert effects[0].item() == pytest.approx(whole, abs=1e-5)


def test_known_circuit_nodes_alone_carry_the_node_patching(known):
    bound, batch, _ = known
    context = ScoringContext(bound, None, [batch], 16, "logit_diff")
    effects = SCORERS["patching-nodes"].function(context).sum(1)
    senders = bound.graph.senders
    writing = {"input", "a0.h0", "a1.h0"}
    for name, effect in zip(senders, effects.tolist()):
        if name in writing:
            assert abs(effect) > 1e-3, name
        else:
            assert abs(effect) < 1e-6, name


def test_node_patching_keeps_every_edge_out_of_the_kept_nodes(known):
    bound, batch, _ = known
    graph = bound.graph
    both = node_circuit(graph, ["a0.h0", "a1.h0"])
    assert both[graph.senders.index("a1.h0")].sum() == 2  # -> m1, -> logits
    assert both[0].sum() == legal_edges(graph)[0].sum()  # input reaches every receiver
    without = node_circuit(graph, ["a1.h0"])
    full, empty, m = patched_metrics(bound, [batch], [both, without], "prob", 16)
    f = faithfulness(full, empty, m)
    assert f[0].item() == pytest.approx(1.0, abs=1e-4)
    assert abs(f[1].item() - 1) > 1e-3
    with pytest.raises(
        ValueError, match=r"nodes: not nodes of this graph: \['a9.h0'\]"
    ):
        node_circuit(graph, ["a9.h0"])


def test_best_size_is_the_smallest_faithful_enough():
    from captum_iglens.studies.circuits.study import best_size

    nan = float("nan")
    assert best_size([0.1, 0.5, 0.85, 0.9, 1, 1, 1, 1, 1, 1]) == 0.5
    assert best_size([nan, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 1.0]) == 50.0
    assert best_size([3.0, 2.5, 2.2, 2, 2, 2, 2, 2, 1.5, 1.0]) == 50.0
