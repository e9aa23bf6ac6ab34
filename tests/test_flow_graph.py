"""FlowGraph: the schema, save and load, pruning and the plain tables, on a
graph written out by hand."""

import csv
import json

import numpy as np
import pytest

from captum_iglens.attr.flow.graph import FlowGraph
from tests.viewer.test_html import page_data


#: One block of one head, reads not separate: its six edges in the graph's
#: order, and flows that add up (a0.h0: 0.5 in, 0.4 + 0.1 out; m0: -0.3 + 0.4
#: in, 0.1 out; logits: 0 + 0.1 + 0.1 = Δm = 0.2).
EDGES = [
    "input->a0.h0",
    "input->m0",
    "input->logits",
    "a0.h0->m0",
    "a0.h0->logits",
    "m0->logits",
]
FLOWS = [0.5, -0.3, 0.0, 0.4, 0.1, 0.1]
CFG = dict(
    n_layers=1,
    n_heads=1,
    n_kv_heads=None,
    d_model=8,
    qkv=False,
    parallel_attn_mlp=False,
)


def _graph(**changes):
    fields = dict(
        cfg=CFG,
        flows=np.array(FLOWS),
        tokens=["The", " cat"],
        input_flows=np.array([0.05, 0.15]),
        counterfactual={"kind": "prompt", "tokens": ["A", " dog"]},
        settings={"method": "exact", "n_steps": 4, "target_kind": "prob"},
        m_prompt=0.3,
        m_base=0.1,
    )
    fields.update(changes)
    return FlowGraph(**fields)


def test_edge_scores_are_plain_and_named_as_mib():
    scores = _graph().edge_scores()
    assert scores == dict(zip(EDGES, FLOWS))
    assert all(type(v) is float for v in scores.values())


def test_node_flows_and_errors_are_recomputed():
    graph = _graph()
    flows = graph.node_flows()
    assert flows["a0.h0"] == pytest.approx((0.5, 0.5))
    assert flows["m0"] == pytest.approx((0.1, 0.1))
    assert flows["logits"] == pytest.approx((0.2, 0.0))
    assert graph.completeness_error < 1e-15 and graph.conservation_error < 1e-15


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(flows=np.array(FLOWS[:5])), "flows: 5 edges, but the graph"),
        (dict(flows=2 * np.array(FLOWS)), "the file is inconsistent"),
        (dict(m_prompt=0.5), "m_prompt, m_base, flows: the flows into logits add up"),
        (dict(input_flows=np.array([0.5, 0.15])), "input_flows: its sums miss"),
        (dict(cfg={**CFG, "n_heads": 2}), "flows: 6 edges, but the graph"),
        (dict(cfg={**CFG, "qkv": True}), "flows: 6 edges, but the graph"),
        (dict(settings={"method": "exact", "position": 9}), "position"),
    ],
)
def test_refuses_what_cannot_be_true(changes, match):
    with pytest.raises(ValueError, match=match):
        _graph(**changes)


def test_plain_flows_are_not_held_to_completeness():
    plain = {"method": "first_order", "n_steps": 4, "target_kind": "prob"}
    assert _graph(settings=plain, m_prompt=0.5).completeness_error == pytest.approx(0.2)


def test_save_and_load(tmp_path):
    by_position = np.array([[0.5, 0], [0, -0.3], [0, 0], [0.4, 0], [0, 0.1], [0, 0.1]])
    graph = _graph(position_flows=by_position)
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
    for key, value in (("flows", FLOWS[:2]), ("m_base", 0.0), ("cfg", {"n_layers": 1})):
        data = json.loads((tmp_path / "g.json").read_text())
        data[key] = value
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(ValueError, match=key if key != "m_base" else "flows"):
            FlowGraph.load(tmp_path / "bad.json")


def test_prune_by_share_and_top():
    graph = _graph()  # |flows| 0.5, 0.4, 0.3, 0.1, 0.1, 0: total 1.4
    kept = graph.prune(0.8)
    assert list(kept.edge_scores()) == ["input->a0.h0", "input->m0", "a0.h0->m0"]
    assert kept.flows is graph.flows and kept.in_graph.dtype == bool  # a view
    assert kept.edges == graph.edges and kept.completeness_error < 1e-15
    assert graph.kept_into_logits is None  # unpruned: Δm, to completeness_error
    assert kept.kept_into_logits == 0.0  # none of the three goes into logits
    assert graph.prune(1.0).kept_into_logits == pytest.approx(0.2)
    assert graph.prune(0.86).kept_into_logits == pytest.approx(0.1)
    table = graph.prune(0.86).format_table(3)
    assert "the 4 kept edges carry Σ F(u->logits) = 0.1 of Δm = 0.2" in table
    assert len(graph.prune(0.86).edge_scores()) == 4
    assert len(graph.prune(1.0).edge_scores()) == 5  # the zero flow adds nothing
    top = graph.prune(20, by="top")
    assert list(top.edge_scores()) == ["input->a0.h0", "a0.h0->m0"]
    assert top.settings["pruned"]["by"] == "top"
    with pytest.raises(ValueError, match="keep"):
        graph.prune(0)
    with pytest.raises(ValueError, match="by"):
        graph.prune(0.5, by="largest")


def test_a_pruned_graph_saves_its_mask(tmp_path):
    kept = _graph().prune(0.8)
    kept.save(tmp_path / "g.json")
    loaded = FlowGraph.load(tmp_path / "g.json")
    assert np.array_equal(loaded.in_graph, kept.in_graph)
    assert loaded.edge_scores() == kept.edge_scores()


def test_tables_and_csv(tmp_path):
    rows = _graph().edges_table()
    assert [r["edge"] for r in rows][:3] == ["input->a0.h0", "a0.h0->m0", "input->m0"]
    assert rows[0]["receiver"] == "a0.h0" and rows[0]["share"] == pytest.approx(
        0.5 / 1.4
    )
    _graph().to_csv(tmp_path / "e.csv")
    with open(tmp_path / "e.csv") as handle:
        read = list(csv.DictReader(handle))
    assert float(read[2]["flow"]) == -0.3 and read[2]["sender"] == "input"
    assert "Δm = +0.2" in _graph().format_table()


def test_effects_go_in_the_table_the_csv_and_the_file(tmp_path):
    effects = np.array([0.4, -0.1, 0.05, 0.3, 0.2, 0.15])
    graph = _graph(effects=effects)
    rows = graph.edges_table()
    assert [r["effect"] for r in rows][:3] == [0.4, 0.3, -0.1]  # by |flow|
    graph.to_csv(tmp_path / "e.csv")
    with open(tmp_path / "e.csv") as handle:
        read = list(csv.DictReader(handle))
    assert [float(r["effect"]) for r in read][:3] == [0.4, 0.3, -0.1]
    graph.save(tmp_path / "g.json")
    assert np.array_equal(FlowGraph.load(tmp_path / "g.json").effects, effects)
    with pytest.raises(ValueError, match="effects"):
        _graph(effects=effects[:5])
    _graph().to_csv(tmp_path / "plain.csv")
    assert "effect" not in (tmp_path / "plain.csv").read_text().splitlines()[0]


def _paired():
    """Edges by (sender position, receiver position): the head at position 1
    reads input at 0 and 1; the MLP and logits read their own position."""
    pairs = np.zeros((6, 2, 2))
    pairs[0, 0, 1], pairs[0, 1, 1] = 0.2, 0.3  # input->a0.h0
    pairs[1, 1, 1] = -0.3  # input->m0
    pairs[3, 1, 1] = 0.4  # a0.h0->m0
    pairs[4, 1, 1] = 0.1  # a0.h0->logits
    pairs[5, 1, 1] = 0.1  # m0->logits
    return _graph(
        position_flows=pairs.sum(-1),
        pair_flows=pairs,
        input_flows=np.array([0.2, 0.0]),
        settings={"method": "exact", "position": 1},
    )


def test_flows_by_position_pair(tmp_path):
    graph = _paired()
    graph.save(tmp_path / "g.json")
    loaded = FlowGraph.load(tmp_path / "g.json")
    assert np.array_equal(loaded.pair_flows, graph.pair_flows)
    rows = loaded.pairs_table()
    assert [
        (r["edge"], r["sender_position"], r["receiver_position"]) for r in rows[:2]
    ] == [("a0.h0->m0", 1, 1), ("input->a0.h0", 1, 1)]
    assert len(rows) == 6 and rows[3]["flow"] == 0.2
    assert (rows[3]["sender_token"], rows[3]["receiver_token"]) == ("The", " cat")
    assert len(loaded.pairs_table(top=2)) == 2
    assert "input@1->a0.h0@1" in loaded.format_table(2)
    assert "input@0->a0.h0@1" not in loaded.format_table(3)
    assert "input@0->a0.h0@1" in loaded.format_table(4)
    kept = loaded.prune(0.5)  # 0.5 and 0.4 of 1.4
    assert [r["flow"] for r in kept.pairs_table()] == [0.4, 0.3, 0.2]
    loaded.to_csv(tmp_path / "pairs.csv", pairs=True)
    with open(tmp_path / "pairs.csv") as handle:
        read = list(csv.DictReader(handle))
    assert [(r["edge"], r["sender_position"], r["flow"]) for r in read[3:5]] == [
        ("input->a0.h0", "0", "0.2"),
        ("a0.h0->logits", "1", "0.1"),
    ]
    assert read[3]["sender_token"] == "The" and len(read) == 6
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
    with pytest.raises(ValueError, match="pair_flows: its sums miss .* inconsistent"):
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
