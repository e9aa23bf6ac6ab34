"""Probability flow on a batch of equal-length pairs: each pair's graph is the
one it gives alone (every target kind, queries/keys/values on and off, both
step rules, positions split, baselines, grouped by the memory budget), flows
are conserved per pair, a batch's bad arguments are refused before the model
runs, and the model is left as it was."""

import numpy as np
import pytest
import torch

from captum_iglens.attr.flow import FlowGraph, ProbabilityFlow
from captum_iglens.attr.flow.budget import pairs_at_once
from captum_iglens.attr.flow.graph import FlowGraph as GraphClass
from tests.helpers import assert_state_unchanged, hook_snapshot, state_snapshot
from tests.tiny_models import tiny_model

# three pairs of 7 tokens whose counterfactuals first differ at 1, 4 and 6:
# each pair's walk starts at its own position
IDS = torch.tensor(
    [[1, 5, 9, 17, 33, 7, 40], [1, 8, 12, 60, 21, 9, 3], [1, 44, 2, 19, 70, 5, 6]]
)
OTHER = IDS.clone()
OTHER[0, [1, 3]] = torch.tensor([10, 18])
OTHER[1, 4] = 22
OTHER[2, 6] = 90
TARGETS = [11, 12, 13]
FOILS = [3, 4, 5]
FIELDS = ("flows", "effects", "input_flows", "position_flows", "pair_flows")


@pytest.fixture(scope="module")
def models():
    return {name: tiny_model(name) for name in ("llama", "gemma3_text")}


def _alone(flow, b, **kwargs):
    """Pair ``b``'s graph alone, the batch's per-pair arguments cut to it."""
    one = {
        name: (value[b] if isinstance(value, list) else value[b : b + 1])
        if isinstance(value, (list, torch.Tensor)) and name != "baselines"
        else value
        for name, value in kwargs.items()
    }
    if isinstance(kwargs.get("baselines"), torch.Tensor):
        rows = kwargs["baselines"]
        one["baselines"] = rows[b : b + 1] if len(rows) > 1 else rows
    return flow.attribute(IDS[b : b + 1], **one)


def _assert_same(batch, alone, tol=1e-6):
    """The batch's graph of a pair is its graph alone, to ``tol`` of the
    largest value, and carries the same settings and start."""
    assert batch.settings == alone.settings
    assert batch.counterfactual == alone.counterfactual
    assert batch.tokens == alone.tokens
    assert batch.m_prompt == pytest.approx(alone.m_prompt, rel=tol, abs=1e-12)
    assert batch.m_base == pytest.approx(alone.m_base, rel=tol, abs=1e-12)
    for field in FIELDS:
        got, expected = getattr(batch, field), getattr(alone, field)
        if expected is None:
            assert got is None, field
            continue
        scale = max(np.abs(expected).max(), 1e-30)
        assert np.abs(got - expected).max() <= tol * scale, field


def _check_exact(graph, tol=1e-6):
    into = sum(f for e, f in graph.edge_scores().items() if e.endswith("->logits"))
    assert abs(graph.delta_m) > 1e-5  # not vacuous
    assert abs(into - graph.delta_m) <= tol * max(1.0, abs(graph.delta_m))
    assert graph.conservation_error <= tol * max(1.0, abs(graph.delta_m))


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize(
    "kind, qkv, method",
    [
        ("prob", False, "exact"),
        ("prob", True, "first_order"),
        ("prob_diff", True, "exact"),
        ("prob_diff", False, "first_order"),
        ("logit_diff", True, "exact"),
        ("logit_diff", False, "first_order"),
    ],
)
def test_each_pairs_graph_is_its_graph_alone(models, family, kind, qkv, method):
    flow = ProbabilityFlow(models[family])
    kwargs = dict(
        counterfactual=OTHER,
        target=torch.tensor(TARGETS),
        target_kind=kind,
        foil=None if kind == "prob" else FOILS,
        n_steps=3,
        qkv=qkv,
        method=method,
    )
    graphs = flow.attribute(IDS, **kwargs)
    assert isinstance(graphs, list) and len(graphs) == len(IDS)
    for b, graph in enumerate(graphs):
        assert isinstance(graph, GraphClass)
        assert graph.settings["target"] == TARGETS[b]
        _assert_same(graph, _alone(flow, b, **kwargs))
        if method == "exact":
            _check_exact(graph)


@pytest.mark.parametrize("n_steps", [1, 5])
def test_flows_are_conserved_per_pair_at_any_step_count(models, n_steps):
    graphs = ProbabilityFlow(models["gemma3_text"]).attribute(
        IDS, counterfactual=OTHER, target=TARGETS, n_steps=n_steps, qkv=True
    )
    deltas = [graph.delta_m for graph in graphs]
    assert len(set(deltas)) == len(deltas)  # each pair's own Δm
    for graph in graphs:
        _check_exact(graph)


@pytest.mark.parametrize(
    "split", [dict(per_position=True), dict(receiver_positions=True, qkv=True)]
)
def test_positions_split_per_pair(models, split):
    flow = ProbabilityFlow(models["llama"])
    kwargs = dict(counterfactual=OTHER, target=TARGETS, n_steps=2, **split)
    graphs = flow.attribute(IDS, **kwargs)
    for b, graph in enumerate(graphs):
        _assert_same(graph, _alone(flow, b, **kwargs))
        _check_exact(graph)
    # nothing before each pair's first change leaves the input
    assert (graphs[1].input_flows[:4] == 0).all()
    assert (graphs[2].input_flows[:6] == 0).all()


@pytest.mark.parametrize(
    "budget",
    [dict(internal_batch_size=6), dict(internal_batch_size=2), {}],
    ids=["two-pairs-per-forward", "chunks-of-one-pair", "all-at-once"],
)
def test_pairs_grouped_by_the_budget_give_the_same_graphs(models, budget):
    flow = ProbabilityFlow(models["llama"])
    kwargs = dict(counterfactual=OTHER, target=TARGETS, n_steps=2, **budget)
    plan = flow.plan(IDS, **kwargs)
    assert plan.batch == budget.get("internal_batch_size", 9)  # 3 points a pair
    for b, graph in enumerate(flow.run_batch(plan)):
        alone = _alone(flow, b, counterfactual=OTHER, target=TARGETS, n_steps=2)
        _assert_same(graph, alone)


@pytest.mark.parametrize("kind", ["prob", "prob_diff"])
def test_greedy_targets_and_foils_are_each_pairs(models, kind):
    """Without a target, each prompt's prediction; without a foil, each
    counterfactual's."""
    flow = ProbabilityFlow(models["llama"])
    target = None if kind == "prob" else TARGETS
    kwargs = dict(counterfactual=OTHER, target=target, target_kind=kind, n_steps=2)
    graphs = flow.attribute(IDS, **kwargs)
    with torch.no_grad():
        tokens = models["llama"](IDS).logits[:, -1].argmax(-1).tolist()
        foils = models["llama"](OTHER).logits[:, -1].argmax(-1).tolist()
    for b, graph in enumerate(graphs):
        if kind == "prob":
            assert graph.settings["target"] == tokens[b]
        else:
            assert graph.settings["foil"] == foils[b] != TARGETS[b]
        _assert_same(graph, _alone(flow, b, **kwargs))


@pytest.mark.parametrize(
    "named, rows", [("pad", 1), ("mean", 1), ("tensor", 1), ("tensor", 3)]
)
def test_baselines_for_a_batch(models, named, rows):
    """A named baseline is each prompt's; a tensor is every pair's start
    ``(1, T, d)`` or each one's ``(B, T, d)``."""
    model = models["llama"]
    flow = ProbabilityFlow(model)
    d = model.get_input_embeddings().embedding_dim
    generator = torch.Generator().manual_seed(0)
    start = (
        torch.randn(rows, IDS.shape[1], d, generator=generator)
        if named == "tensor"
        else named
    )
    kwargs = dict(baselines=start, target=TARGETS, n_steps=2)
    for b, graph in enumerate(flow.attribute(IDS, **kwargs)):
        _assert_same(graph, _alone(flow, b, **kwargs))
        _check_exact(graph)


def test_one_pair_gives_one_graph(models):
    flow = ProbabilityFlow(models["llama"])
    graph = flow.attribute(IDS[:1], counterfactual=OTHER[:1], target=[11], n_steps=1)
    assert isinstance(graph, FlowGraph)
    plan = flow.plan(IDS[:1], counterfactual=OTHER[:1], n_steps=1)
    assert isinstance(flow.run(plan), FlowGraph)
    assert len(flow.run_batch(plan)) == 1
    batch = flow.plan(IDS, counterfactual=OTHER, n_steps=1)
    with pytest.raises(ValueError, match="plan: holds 3 pairs; run_batch"):
        flow.run(batch)


D = 32  # the tiny models' width


@pytest.mark.parametrize(
    "kwargs, error, named",
    [
        (dict(counterfactual=OTHER[:2]), ValueError, "counterfactual: 2 prompt(s), "),
        (dict(counterfactual=OTHER[:, :5]), ValueError, "counterfactual: 5 tokens"),
        (dict(counterfactual=OTHER[0]), ValueError, "counterfactual: expected text"),
        (dict(target=[11, 12]), ValueError, "target: 2 tokens for 3 pair(s)"),
        (dict(target=torch.tensor([11, 12, 13, 14])), ValueError, "target: 4 tok"),
        (dict(target=[11, 12, 1000]), ValueError, "target[2]: expected a token id"),
        (dict(target=torch.tensor([1.0, 2, 3])), TypeError, "target: expected a"),
        (dict(target=torch.tensor([True, False, True])), TypeError, "target: "),
        (dict(target=torch.ones(3, 1, dtype=torch.long)), TypeError, "target: "),
        (dict(target=[11, None, 12]), ValueError, "target: a token per pair"),
        (dict(foil=[3, 4], target_kind="prob_diff"), ValueError, "foil: 2 tokens"),
        (
            dict(target=TARGETS, foil=[3, 12, 5], target_kind="logit_diff"),
            ValueError,
            "foil: must differ from the target token 12 (pair 1)",
        ),
        (dict(baselines=torch.zeros(2, 7, D)), ValueError, "baselines: expected"),
        (dict(corrupt_subject="x"), ValueError, "corrupt_subject: takes one text"),
        (
            dict(internal_batch_size=4, max_chunk_bytes=1),
            ValueError,
            "internal_batch_size: 4 path points",
        ),
    ],
)
def test_a_batchs_arguments_refused_before_the_model_runs(models, kwargs, error, named):
    model = models["llama"]
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error) as raised:
            ProbabilityFlow(model).attribute(IDS, **kwargs)
    finally:
        handle.remove()
    assert named in str(raised.value)
    assert calls == []


@pytest.mark.parametrize(
    "inputs", [[IDS[0], IDS[1, :5]], (IDS[0], IDS[1])], ids=["list", "tuple"]
)
def test_prompts_of_unequal_lengths_are_refused(models, inputs):
    with pytest.raises(ValueError, match="inputs: got a .* padded batch is not sup"):
        ProbabilityFlow(models["llama"]).attribute(inputs)


def test_pair_memory_scales_with_the_batch(models, monkeypatch):
    """Flows by receiver position that fit for one pair are refused for three,
    whose flows are all held until the batch ends."""
    from captum_iglens.attr.flow.budget import point_bytes
    from captum_iglens.attr.flow.pair_memory import pair_bytes

    flow = ProbabilityFlow(models["llama"])
    graph = flow.plan(IDS[:1], n_steps=1).graph
    assert pair_bytes(graph, 7, 3) == 2 * pair_bytes(graph, 7)
    point = point_bytes(flow.parts, graph, 7, pairs=True)
    free = pair_bytes(graph, 7, 2) + 2 * point  # one pair's flows, one step's, two more
    monkeypatch.setattr("captum_iglens.attr.flow.pair_memory.free_memory", lambda: free)
    one = dict(receiver_positions=True, n_steps=1, internal_batch_size=1)
    flow.plan(IDS[:1], counterfactual=OTHER[:1], **one)
    with pytest.raises(ValueError, match="receiver_positions: .* for 3 pairs"):
        flow.plan(IDS, counterfactual=OTHER, **one)


def test_budget_holds_whole_paths_of_several_pairs():
    assert pairs_at_once(17, 17, 8) == (1, 17)
    assert pairs_at_once(6, 17, 8) == (1, 6)  # one pair in chunks, as alone
    assert pairs_at_once(40, 17, 8) == (2, 17)
    assert pairs_at_once(1000, 17, 8) == (8, 17)
    assert pairs_at_once(1000, 17, 1) == (1, 17)


def test_model_left_as_it_was_after_a_batch(models):
    model = models["gemma3_text"]
    hooks, state = hook_snapshot(model), state_snapshot(model)
    implementation = model.config._attn_implementation
    ProbabilityFlow(model).attribute(
        IDS, counterfactual=OTHER, n_steps=2, qkv=True, receiver_positions=True
    )
    assert hook_snapshot(model) == hooks
    assert_state_unchanged(model, state)
    assert model.config._attn_implementation == implementation
