"""The graph page of a probability flow without a browser: the data it embeds
(compact, unrounded, sorted as ``prune`` sorts), its header, self-containment,
the entry points, and the page's own kept-set rule (run by Node.js where it is
installed) against ``FlowGraph.prune``."""

import json
import re
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest

from captum_iglens.graph.model_graph import model_graph
from captum_iglens.viewer._graph import (
    KEEP_STEP,
    MAX_DRAWN,
    OPEN_EDGES,
    PAIRS_PER_NODE,
    node_places,
    opening_keep,
)
from captum_iglens.viewer._page import result_html
from tests.viewer.conftest import HOSTILE
from tests.viewer.test_html import SVG_NAMESPACE, page_data
from tests.test_flow_route import brute_force_route, negated_graph
from tests.viewer.synthetic_graph import even_graph, synthetic_graph, tied

NODE = shutil.which("node") or shutil.which("nodejs")


def _edge_names(data: dict) -> list:
    edges = data["edges"]
    return [
        data["nodes"][s] + "->" + data["receivers"][r]
        for s, r in zip(edges["sender"], edges["receiver"])
    ]


@pytest.mark.parametrize("qkv", [False, True])
def test_the_page_embeds_every_edge_unrounded_as_arrays(qkv):
    graph = synthetic_graph(3, 2, qkv=qkv)
    data = page_data(result_html(graph))
    assert data["kind"] == "graph" and data["nodes"] == graph.nodes
    assert set(data["edges"]) == {"sender", "receiver", "flow", "effect"}  # arrays
    assert data["edges"]["effect"] is None  # a graph without effects
    names = _edge_names(data)
    assert sorted(names) == sorted(graph.edges)
    scores = graph.edge_scores()
    assert [scores[name] for name in names] == data["edges"]["flow"]  # exact floats
    magnitudes = np.abs(data["edges"]["flow"])
    assert (np.diff(magnitudes) <= 0).all()
    # The tie keeps the graph's order.
    first, second = (graph.edges[i] for i in tied(graph.graph))
    assert names.index(first) < names.index(second)
    for receiver, node in zip(data["receivers"], data["receiver_node"]):
        assert data["nodes"][node] == receiver.split("<")[0]
    assert data["max_drawn"] == MAX_DRAWN and 0 < data["keep"] <= 1
    assert data["pairs"] is None  # the graph has no flows by position pair
    assert data["pairs_per_node"] == PAIRS_PER_NODE


def test_the_page_keeps_each_nodes_largest_flows_by_position(tiny_flow_graph):
    """Per node, its largest in- and out-flows by sender and receiver position,
    as ``pairs_table`` ranks them."""
    graph = tiny_flow_graph
    data = page_data(result_html(graph))
    pairs, names = data["pairs"], _edge_names(data)
    kept = [
        (names[e], s, t, flow)
        for e, s, t, flow in zip(pairs["edge"], pairs["s"], pairs["t"], pairs["flow"])
    ]
    assert np.all(np.diff(np.abs([row[3] for row in kept])) <= 0)
    table = graph.pairs_table()
    for node in ("a1.h2", "m0", "input", "logits"):
        for end in (0, 1):  # out of the node, into it
            expected = [
                (r["edge"], r["sender_position"], r["receiver_position"], r["flow"])
                for r in table
                if r["edge"].split("->")[end].split("<")[0] == node
            ][:PAIRS_PER_NODE]
            found = [r for r in kept if r[0].split("->")[end].split("<")[0] == node]
            assert found[:PAIRS_PER_NODE] == expected, (node, end)
    assert any(row[0].startswith("input->") for row in kept)


@pytest.mark.parametrize("which", ["even", "synthetic", "tiny_llama"])
def test_the_page_opens_at_the_largest_share_keeping_at_most_100_edges(
    which, tiny_flow_graph
):
    graph = {
        "even": even_graph(),
        "synthetic": synthetic_graph(8, 4, qkv=True),
        "tiny_llama": tiny_flow_graph,
    }[which]
    data = page_data(result_html(graph))
    keep = data["keep"]
    assert data["keep_step"] == KEEP_STEP == 0.01
    assert keep == round(keep, 2) and KEEP_STEP <= keep <= 1
    assert len(graph.prune(keep).kept) <= OPEN_EDGES
    if keep < 1:  # the slider's next step keeps more
        assert len(graph.prune(round(keep + KEEP_STEP, 2)).kept) > OPEN_EDGES
    else:
        assert len(graph.flows) <= OPEN_EDGES


def test_the_opening_share_is_the_least_where_even_that_keeps_too_many():
    assert opening_keep(np.ones(250)) == 0.4  # 100 edges; 0.41 keeps 103
    assert opening_keep(np.ones(20_000)) == KEEP_STEP  # 0.01 keeps 200
    assert opening_keep(np.ones(OPEN_EDGES)) == 1.0


@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize("qkv", [False, True])
def test_the_page_carries_the_route_of_the_brute_force(qkv, negated):
    graph = synthetic_graph(3, 2, qkv=qkv, seed=1)
    if negated:
        graph = negated_graph(graph)
    route = page_data(result_html(graph))["route"]
    nodes, flows, bottleneck = brute_force_route(graph)
    assert [graph.nodes[k] for k in route["nodes"]] == nodes
    assert route["flows"] == pytest.approx(flows, rel=1e-12)
    assert route["bottleneck"] == pytest.approx(bottleneck, rel=1e-12)
    assert (bottleneck < 0) == negated
    assert page_data(result_html(graph.prune(0.01)))["route"] is None


def test_the_header_holds_the_run_and_its_checks_and_no_local_path():
    graph = synthetic_graph()
    page = result_html(graph)
    data = page_data(page)
    assert data["about"] == {
        "prompt": "When Mary and John",
        "from": "counterfactual prompt 'When John and Mary'",
        "target": "p(' Mary')",
        "model": "SmolLM2-135M",
        "run": "exact, n_steps = 4",
    }
    assert "/home/someone" not in page
    assert data["delta_m"] == pytest.approx(0.8)
    assert data["completeness_error"] == pytest.approx(
        graph.completeness_error, rel=1e-2
    )
    assert data["conservation_error"] == pytest.approx(
        graph.conservation_error, rel=1e-2
    )
    assert graph.conservation_error < 1e-12
    assert data["tokens"] == graph.tokens
    assert data["input_flows"] == pytest.approx(graph.input_flows, rel=1e-3)


def test_the_effects_come_in_the_order_of_the_flows():
    graph = synthetic_graph()
    graph.effects = np.linspace(-1.0, 1.0, len(graph.flows))
    data = page_data(result_html(graph))
    effects = dict(zip(graph.edges, graph.effects.tolist()))
    assert data["edges"]["effect"] == [effects[n] for n in _edge_names(data)]


def test_a_baseline_and_a_pruned_graph_say_so():
    graph = synthetic_graph(qkv=True).prune(0.9)
    graph.counterfactual = {"kind": "pad"}
    data = page_data(result_html(graph))
    assert data["kept_into_logits"] == pytest.approx(graph.kept_into_logits, rel=1e-3)
    assert page_data(result_html(synthetic_graph()))["kept_into_logits"] is None
    about = data["about"]
    assert about["from"] == "baseline: pad-token embeddings"
    assert about["run"] == (
        "exact, n_steps = 4, queries, keys and values separate; "
        "pruned to keep = 0.9 (by share)"
    )


def test_the_page_is_self_contained_and_its_tokens_stay_data():
    graph = synthetic_graph()
    graph.tokens = [HOSTILE[0], HOSTILE[1], " a", " b"]
    page = result_html(graph)
    assert page.count("<script") == 2 and page.lower().count("</script") == 2
    assert "<img" not in page
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) <= {SVG_NAMESPACE}
    assert page_data(page)["tokens"] == graph.tokens
    script = page.split('id="iglens-data"')[1]
    assert "innerHTML" not in script and "eval(" not in script
    # Only the graph page carries the graph's script.
    assert "iglensPages.graph" in page


def test_node_places_put_blocks_in_columns_and_heads_in_rows():
    graph = model_graph(2, 2)
    assert graph.nodes == [
        "input",
        "a0.h0",
        "a0.h1",
        "m0",
        "a1.h0",
        "a1.h1",
        "m1",
        "logits",
    ]
    assert node_places(graph) == [
        (0, -1),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
        (3, -1),
    ]


def test_to_html_checks_the_path_and_writes_atomically(tmp_path):
    graph = synthetic_graph()
    with pytest.raises(ValueError, match="path"):
        graph.to_html(tmp_path / "missing" / "g.html")
    graph.to_html(tmp_path / "g.html")
    assert [p.name for p in tmp_path.iterdir()] == ["g.html"]
    assert page_data((tmp_path / "g.html").read_text())["kind"] == "graph"
    frame = graph._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "sandbox" in frame


def _page_kept_counts(flows: list, keeps: list) -> list:
    """The page's own ``keptCount``, cut out of graph.js and run by Node.js on
    the flows in the page's order."""
    script = (
        resources.files("captum_iglens.viewer")
        .joinpath("static")
        .joinpath("graph.js")
        .read_text()
    )
    start = script.index("  function keptCount(")
    function = script[start : script.index("\n  }\n", start) + 4]
    program = (
        function
        + "var f = JSON.parse(process.argv[1]), keeps = JSON.parse(process.argv[2]);\n"
        "var c = new Float64Array(f.length), s = 0;\n"
        "for (var i = 0; i < f.length; i++) { s += Math.abs(f[i]); c[i] = s; }\n"
        "console.log(JSON.stringify(keeps.map(function (k) "
        "{ return keptCount(c, k); })));\n"
    )
    done = subprocess.run(
        [NODE, "-e", program, json.dumps(flows), json.dumps(keeps)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
@pytest.mark.parametrize("which", ["tiny_llama", "synthetic"])
def test_the_pages_kept_set_is_prunes(which, tiny_flow_graph):
    graph = tiny_flow_graph if which == "tiny_llama" else synthetic_graph(4, 3)
    data = page_data(result_html(graph))
    keeps = [0.01, 0.1, 0.25, 0.5, 0.73, 0.9, 0.99, 1.0, data["keep"]]
    counts = _page_kept_counts(data["edges"]["flow"], keeps)
    names = _edge_names(data)
    for keep, count in zip(keeps, counts):
        assert set(names[:count]) == set(graph.prune(keep).edge_scores()), keep
    assert len(set(counts)) > 4  # the keeps are not all one set


def test_a_noised_subject_says_so():
    graph = synthetic_graph()
    graph.counterfactual = {
        "kind": "subject_noise",
        "subject": "Mary",
        "positions": [2],
        "noise_scale": 3.0,
        "noise_std": 0.1,
        "seed": 0,
    }
    about = page_data(result_html(graph))["about"]
    assert about["from"] == (
        "the prompt with its subject 'Mary' noised (ROME, 3 × the embeddings' std, "
        "seed 0)"
    )
