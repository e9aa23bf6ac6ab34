"""FlowGraph: the schema, save and load, pruning and the plain tables, on a
graph written out by hand."""

import csv
import json

import numpy as np
import pytest

from captum_iglens.flow_graph import FlowGraph
from tests.viewer.test_html import page_data


def _graph(**changes):
    fields = dict(
        nodes=["input", "a0.h0", "m0", "logits"],
        edges=["input->a0.h0<q>", "input->m0", "a0.h0->m0", "m0->logits"],
        flows=np.array([0.5, -0.3, 0.1, 0.1]),
        tokens=["The", " cat"],
        input_flows=np.array([0.05, 0.15]),
        counterfactual={"kind": "prompt", "tokens": ["A", " dog"]},
        settings={"method": "prediction_aware", "n_steps": 4, "target_kind": "prob"},
        m_prompt=0.3,
        m_base=0.1,
        completeness_error=1e-17,
        conservation_error=2e-17,
    )
    fields.update(changes)
    return FlowGraph(**fields)


def test_edge_scores_are_plain_and_named_as_mib():
    scores = _graph().edge_scores()
    assert scores == {
        "input->a0.h0<q>": 0.5,
        "input->m0": -0.3,
        "a0.h0->m0": 0.1,
        "m0->logits": 0.1,
    }
    assert all(type(v) is float for v in scores.values())


def test_node_flows_fold_reads_into_their_head():
    flows = _graph().node_flows()
    assert flows["a0.h0"] == pytest.approx((0.5, 0.1))
    assert flows["m0"] == pytest.approx((-0.2, 0.1))
    assert flows["logits"] == pytest.approx((0.1, 0.0))


@pytest.mark.parametrize(
    "edge",
    ["input-m0", "input->m0->logits", "input->m9", "x->m0", "->m0", "input->"],
)
def test_refuses_an_edge_that_does_not_join_two_nodes(edge):
    edges = ["input->a0.h0<q>", edge, "a0.h0->m0", "m0->logits"]
    with pytest.raises(ValueError, match="does not join two of the nodes"):
        _graph(edges=edges)


def test_save_and_load(tmp_path):
    graph = _graph(position_flows=np.array([[0.5, 0], [0, -0.3], [0.1, 0], [0, 0.1]]))
    graph.save(tmp_path / "g.json")
    loaded = FlowGraph.load(tmp_path / "g.json")
    assert loaded.edges == graph.edges and loaded.nodes == graph.nodes
    assert np.array_equal(loaded.flows, graph.flows)
    assert np.array_equal(loaded.position_flows, graph.position_flows)
    assert loaded.settings == graph.settings
    assert loaded.counterfactual == graph.counterfactual
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]  # no partial file


def test_load_refuses_a_broken_file(tmp_path):
    _graph().save(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    data["edges"][0] = "input->a9.h9"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="edges: 'input->a9.h9'"):
        FlowGraph.load(tmp_path / "bad.json")
    data = json.loads((tmp_path / "g.json").read_text())
    data["flows"] = data["flows"][:2]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="flows"):
        FlowGraph.load(tmp_path / "bad.json")


def test_prune_by_share_and_top():
    graph = _graph()  # |flows| 0.5, 0.3, 0.1, 0.1: total 1.0
    assert graph.prune(0.8).edges == ["input->a0.h0<q>", "input->m0"]
    assert len(graph.prune(0.81).edges) == 3
    assert graph.prune(1.0).edges == graph.edges
    top = graph.prune(25, by="top")
    assert top.edges == ["input->a0.h0<q>"] and top.settings["pruned"]["by"] == "top"
    with pytest.raises(ValueError, match="keep"):
        graph.prune(0)
    with pytest.raises(ValueError, match="by"):
        graph.prune(0.5, by="largest")


def test_tables_and_csv(tmp_path):
    rows = _graph().edges_table()
    assert [r["edge"] for r in rows][:2] == ["input->a0.h0<q>", "input->m0"]
    assert rows[0]["receiver"] == "a0.h0<q>" and rows[0]["share"] == pytest.approx(0.5)
    _graph().to_csv(tmp_path / "e.csv")
    with open(tmp_path / "e.csv") as handle:
        read = list(csv.DictReader(handle))
    assert float(read[1]["flow"]) == -0.3 and read[1]["sender"] == "input"
    assert "Δm = +0.2" in _graph().format_table()


def _paired():
    """Edges by (sender position, receiver position): the head at position 1
    reads input at 0 and 1; the MLP and logits read their own position."""
    pairs = np.zeros((4, 2, 2))
    pairs[0, 0, 1], pairs[0, 1, 1] = 0.2, 0.3  # input->a0.h0<q>
    pairs[1, 1, 1] = -0.3  # input->m0
    pairs[2, 1, 1] = 0.1  # a0.h0->m0
    pairs[3, 1, 1] = 0.1  # m0->logits
    return _graph(position_flows=pairs.sum(-1), pair_flows=pairs)


def test_flows_by_position_pair(tmp_path):
    graph = _paired()
    graph.save(tmp_path / "g.json")
    loaded = FlowGraph.load(tmp_path / "g.json")
    assert np.array_equal(loaded.pair_flows, graph.pair_flows)
    rows = loaded.pairs_table()
    assert [
        (r["edge"], r["sender_position"], r["receiver_position"]) for r in rows[:2]
    ] == [
        ("input->a0.h0<q>", 1, 1),
        ("input->m0", 1, 1),
    ]
    assert len(rows) == 5 and rows[2]["flow"] == 0.2
    assert (rows[2]["sender_token"], rows[2]["receiver_token"]) == ("The", " cat")
    assert len(loaded.pairs_table(top=2)) == 2
    assert "input@1->a0.h0<q>@1" in loaded.format_table(2)
    assert "input@0->a0.h0<q>@1" not in loaded.format_table(2)
    assert "input@0->a0.h0<q>@1" in loaded.format_table(3)
    kept = loaded.prune(0.5)
    assert kept.pair_flows.shape == (1, 2, 2) and kept.pair_flows[0, 0, 1] == 0.2
    loaded.to_csv(tmp_path / "pairs.csv", pairs=True)
    with open(tmp_path / "pairs.csv") as handle:
        read = list(csv.DictReader(handle))
    assert [(r["edge"], r["sender_position"], r["flow"]) for r in read[2:4]] == [
        ("input->a0.h0<q>", "0", "0.2"),
        ("a0.h0->m0", "1", "0.1"),
    ]
    assert read[2]["sender_token"] == "The" and len(read) == 5
    with pytest.raises(ValueError, match="receiver_positions=True"):
        _graph().pairs_table()
    with pytest.raises(ValueError, match="receiver_positions=True"):
        _graph().to_csv(tmp_path / "none.csv", pairs=True)
    assert not (tmp_path / "none.csv").exists()


def test_flows_by_position_pair_refused_when_inconsistent(tmp_path):
    _paired().save(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    data["pair_flows"][0][0][1] = 0.25
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="pair_flows: they add up .* inconsistent"):
        FlowGraph.load(tmp_path / "bad.json")
    del data["position_flows"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="pair_flows: given without position_flows"):
        FlowGraph.load(tmp_path / "bad.json")


def test_html_page_is_the_viewers_graph_page(tmp_path):
    graph = _graph(tokens=["<b>", " cat"])
    graph.to_html(tmp_path / "g.html")
    page = (tmp_path / "g.html").read_text()
    assert "<b>" not in page  # the tokens are JSON data, escaped
    data = page_data(page)
    assert data["kind"] == "graph" and data["tokens"] == ["<b>", " cat"]
    assert len(data["edges"]["flow"]) == len(graph.edges)
