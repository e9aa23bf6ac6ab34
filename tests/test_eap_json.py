"""EAP-IG's graph file, both ways: a flow graph written with ``to_eap_json``
read back by a reader written here from EAP-IG's documented format (not from
the package's graph), its scores the flows and its ``in_graph`` the pruned
mask; a file of another model refused field by field."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.graph.eap_json import read_eap_json
from captum_iglens.graph.model_graph import model_graph
from tests.tiny_models import tiny_model

IDS = torch.tensor([[1, 5, 9, 17, 33, 7, 40]])
OTHER = torch.tensor([[1, 5, 10, 18, 33, 7, 41]])


def eap_edge_names(cfg):
    """Every edge of EAP-IG's ``Graph.from_model(cfg)``, as its documented
    format names them: each node written to the residual stream feeds every
    later head's q, k and v inputs, every later MLP (a sequential block's MLP
    also reads its own heads) and the logits."""
    stream, names = ["input"], []
    for layer in range(cfg["n_layers"]):
        heads = [f"a{layer}.h{h}" for h in range(cfg["n_heads"])]
        names += [f"{u}->{h}<{x}>" for u in stream for h in heads for x in "qkv"]
        if cfg["parallel_attn_mlp"]:
            names += [f"{u}->m{layer}" for u in stream]
            stream += heads
        else:
            stream += heads
            names += [f"{u}->m{layer}" for u in stream]
        stream.append(f"m{layer}")
    return names + [f"{u}->logits" for u in stream]


def read_like_eap_ig(path):
    """EAP-IG's ``from_json``, reduced to what it checks and reads."""
    data = json.loads(path.read_text())
    assert {"cfg", "nodes", "edges"} <= set(data)
    assert {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"} <= set(data["cfg"])
    assert set(data["edges"]) == set(eap_edge_names(data["cfg"]))
    return data


@pytest.fixture(scope="module")
def flow_graph():
    model = tiny_model("llama")  # 4 query heads over 2 key/value heads
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return ProbabilityFlow(model).attribute(
        IDS, counterfactual=OTHER, qkv=True, n_steps=2
    )


def test_round_trip_through_eap_igs_format(flow_graph, tmp_path):
    kept = flow_graph.prune(0.5)
    kept.to_eap_json(tmp_path / "g.json")
    data = read_like_eap_ig(tmp_path / "g.json")
    assert data["cfg"] == dict(
        n_layers=2, n_heads=4, parallel_attn_mlp=False, d_model=32
    )
    flows = flow_graph.edge_scores()
    assert {name: e["score"] for name, e in data["edges"].items()} == flows
    circuit = set(kept.edge_scores())
    assert {n for n, e in data["edges"].items() if e["in_graph"]} == circuit
    assert 0 < len(circuit) < len(flows)
    # a node is in the graph where one of its kept edges is
    touched = {part.split("<")[0] for name in circuit for part in name.split("->")}
    assert {n for n, v in data["nodes"].items() if v["in_graph"]} == touched
    graph = model_graph(2, 4, qkv=False, n_kv_heads=2)
    scores, in_graph = read_eap_json(tmp_path / "g.json", graph, data["cfg"]["d_model"])
    assert np.array_equal(scores, flow_graph.flows)
    assert np.array_equal(in_graph, kept.in_graph)


def test_the_effects_as_scores(flow_graph, tmp_path):
    flow_graph.to_eap_json(tmp_path / "e.json", score="effect")
    data = read_like_eap_ig(tmp_path / "e.json")
    names = flow_graph.edges
    assert {n: e["score"] for n, e in data["edges"].items()} == dict(
        zip(names, flow_graph.effects.tolist())
    )
    with pytest.raises(ValueError, match="score: expected one of"):
        flow_graph.to_eap_json(tmp_path / "x.json", score="effects")
    without = dataclasses.replace(flow_graph, effects=None)
    with pytest.raises(ValueError, match="score: this graph has no effects"):
        without.to_eap_json(tmp_path / "x.json", score="effect")
    assert not (tmp_path / "x.json").exists()


def test_a_graph_without_separate_reads_is_refused(tmp_path):
    graph = ProbabilityFlow(tiny_model("llama")).attribute(
        IDS, counterfactual=OTHER, n_steps=1
    )
    with pytest.raises(ValueError, match="qkv=True"):
        graph.to_eap_json(tmp_path / "g.json")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda d: d["cfg"].update(n_layers=3),
            "cfg.n_layers is 3, but the model has 2",
        ),
        (lambda d: d["cfg"].update(n_heads=8), "cfg.n_heads is 8"),
        (lambda d: d["cfg"].update(parallel_attn_mlp=True), "cfg.parallel_attn_mlp"),
        (lambda d: d["cfg"].update(d_model=7), "cfg.d_model is 7"),
        (lambda d: d["edges"].pop("input->logits"), "1 of the model's .* missing"),
        (lambda d: d["edges"].update({"m1->m0": {"score": 1.0}}), "'m1->m0'"),
        (lambda d: d["edges"]["input->m0"].update(score=float("nan")), "not finite"),
        (lambda d: d["edges"]["input->m0"].update(score="1"), "not a number"),
        (lambda d: d["edges"]["input->m0"].update(in_graph=1), "not a bool"),
    ],
)
def test_a_file_of_another_graph_is_refused_by_field(flow_graph, tmp_path, edit, match):
    flow_graph.to_eap_json(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    d_model = data["cfg"]["d_model"]
    edit(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    graph = model_graph(2, 4, n_kv_heads=2)
    with pytest.raises(ValueError, match=match):
        read_eap_json(tmp_path / "bad.json", graph, d_model)


def test_the_graph_matches_eap_igs_for_parallel_blocks_too():
    for parallel in (False, True):
        cfg = dict(n_layers=3, n_heads=2, parallel_attn_mlp=parallel, d_model=4)
        graph = model_graph(3, 2, parallel=parallel)
        assert sorted(graph.edges) == sorted(eap_edge_names(cfg))
