"""The graph page of a probability flow in a real headless Chromium, at 1280
and 1920 px wide: it opens offline without console errors or horizontal
overflow, its slider keeps ``FlowGraph.prune``'s edge set and redraws, a
hovered edge or node shows its numbers, a clicked node highlights its in- and
out-flow. Skipped only where Chromium is not installed, as the map's tests."""

import json
import re

import numpy as np
import pytest

from captum_iglens.viewer._graph import MAX_DRAWN, OPEN_EDGES
from tests.viewer.conftest import HOSTILE, NEEDS_CHROMIUM
from tests.viewer.synthetic_graph import even_graph, synthetic_graph
from tests.viewer.test_browser import (
    close_to,
    console_errors,
    hover,
    open_page,
    requests_made,
    screenshot,
)

pytestmark = NEEDS_CHROMIUM
WIDTHS = [1280, 1920]


def _ends(edge):
    """An edge name's sender and receiving node (a head's read is its head)."""
    sender, _, receiver = edge.partition("->")
    return sender, receiver.partition("<")[0]


@pytest.fixture(params=WIDTHS)
def graph_page(request, browser, tmp_path, tiny_flow_graph):
    """The tiny Llama's graph, open in a window ``request.param`` px wide."""
    browser.set_window_size(request.param, 900)
    tiny_flow_graph.to_html(tmp_path / "g.html")
    open_page(browser, tmp_path / "g.html")
    yield tiny_flow_graph, tmp_path / "g.html"
    assert console_errors(browser) == []


def _drawn(browser) -> list:
    paths = browser.find_elements("css selector", "#graph path.edge")
    return [p.get_attribute("data-edge") for p in paths]


def _route(browser) -> list:
    """The route's hops as drawn, and whether they lie on top of every edge."""
    return browser.execute_script(
        "var paths = Array.prototype.slice.call(document.querySelectorAll("
        "'#graph path')), classes = paths.map(function (p) { return p.className"
        ".baseVal; }), first = classes.indexOf('route');"
        "return [paths.filter(function (p, i) { return classes[i] === 'route'; })"
        ".map(function (p) { return p.getAttribute('data-edge'); }),"
        "first >= 0 && classes.slice(first).every(function (c) "
        "{ return c === 'route'; })]"
    )


def _set_keep(browser, value: float) -> float:
    """Moves the slider as the page's input event sees it; returns its value."""
    return float(
        browser.execute_script(
            "var s = document.getElementById('keep'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('input')); return s.value",
            str(value),
        )
    )


def _tip(browser) -> str:
    tip = browser.find_element("id", "tip")
    assert tip.is_displayed()
    return tip.text


def test_the_page_opens_offline_and_fits_the_window(browser, graph_page):
    graph, page = graph_page
    assert requests_made(browser, page) == []
    width = browser.execute_script("return window.innerWidth")
    overflow = browser.execute_script(
        "var d = document.documentElement; return [d.scrollWidth, d.clientWidth]"
    )
    assert overflow[0] <= overflow[1]
    svg = browser.find_element("id", "graph")
    assert svg.rect["x"] >= 0 and svg.rect["x"] + svg.rect["width"] <= width
    circles = browser.find_elements("css selector", "#graph circle.node")
    assert [c.get_attribute("data-node") for c in circles] == graph.nodes
    for circle in circles:  # every node inside the drawing
        x = circle.rect["x"] + circle.rect["width"] / 2
        assert svg.rect["x"] < x < svg.rect["x"] + svg.rect["width"]
    checks = browser.find_element("id", "checks").text
    shown = dict(re.findall(r"(Δm|− Δm\||conservation error) = (\S+?);", checks))
    assert close_to(shown["Δm"], graph.delta_m)
    assert close_to(shown["− Δm|"], graph.completeness_error, 2)
    assert close_to(shown["conservation error"], graph.conservation_error, 2)
    screenshot(browser, f"graph-{width}.png")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_opens_on_at_most_100_edges_and_draws_the_route_at_any_share(
    browser, tmp_path, width
):
    from selenium.webdriver.common.action_chains import ActionChains

    graph = even_graph()  # half of |flow| is some 300 of its 813 edges
    browser.set_window_size(width, 900)
    graph.to_html(tmp_path / "g.html")
    open_page(browser, tmp_path / "g.html")
    keep = float(browser.find_element("id", "keep").get_attribute("value"))
    drawn = _drawn(browser)
    assert sorted(drawn) == sorted(graph.prune(keep).edge_scores())
    assert len(drawn) <= OPEN_EDGES < len(graph.prune(round(keep + 0.01, 2)).kept)
    route = graph.route()
    hops = [f"{u}->{w}" for u, w in zip(route.nodes, route.nodes[1:])]
    assert _route(browser) == [hops, True]
    legend = browser.find_element("id", "route").text
    assert legend.startswith(
        "route carrying the most of Δm: " + " → ".join(route.nodes) + ", bottleneck +"
    )
    assert close_to(legend.split("bottleneck ")[1].split()[0], route.bottleneck, 2)
    screenshot(browser, f"graph-route-{width}.png")
    # hovering a hop shows its flow, the q, k, v reads summed
    path = browser.find_elements("css selector", "#graph path.route")[-1]
    svg = browser.find_element("id", "graph")
    x, y = browser.execute_script(
        "var p = arguments[0], m = p.getPointAtLength(p.getTotalLength() / 2);"
        "var at = m.matrixTransform(p.getScreenCTM()), box = arguments[1]"
        ".getBoundingClientRect(); return [at.x - box.left, at.y - box.top]",
        path,
        svg,
    )
    ActionChains(browser).move_to_element_with_offset(
        svg, int(x - svg.rect["width"] / 2), int(y - svg.rect["height"] / 2)
    ).perform()
    lines = _tip(browser).splitlines()
    assert (
        lines[0] == hops[-1].replace("->", " → ") + ", on the route carrying the most"
    )
    assert close_to(lines[1].split()[1], route.flows[-1])
    for keep in (0.01, 1.0, 0.3):  # the route stays, whatever the share
        _set_keep(browser, keep)
        assert _route(browser) == [hops, True], keep
    assert console_errors(browser) == []


def test_the_slider_keeps_prunes_edges_and_redraws(browser, graph_page):
    graph, _ = graph_page
    counts = []
    for keep in (0.1, 0.5, 0.9, 1.0):
        value = _set_keep(browser, keep)
        drawn = _drawn(browser)
        assert sorted(drawn) == sorted(graph.prune(value).edge_scores()), value
        counts.append(len(drawn))
    assert counts == sorted(counts) and len(set(counts)) == 4
    note = browser.find_element("id", "drawn").text
    assert note.startswith(f"{counts[-1]} of {len(graph.edges)} edges")


def test_the_keyboard_moves_the_slider(browser, graph_page):
    from selenium.webdriver.common.keys import Keys

    graph, _ = graph_page
    _set_keep(browser, 0.5)
    slider = browser.find_element("id", "keep")
    slider.send_keys(Keys.ARROW_RIGHT * 30)
    value = float(slider.get_attribute("value"))
    assert value == pytest.approx(0.8)
    assert sorted(_drawn(browser)) == sorted(graph.prune(value).edge_scores())


def test_hovering_an_edge_shows_its_flow_and_share(browser, graph_page):
    from selenium.webdriver.common.action_chains import ActionChains

    graph, _ = graph_page
    svg = browser.find_element("id", "graph")
    # A point on the widest edge's stroke where an edge, not the route, is on
    # top; whichever edge that is.
    name = browser.execute_script(
        "var svg = document.getElementById('graph').getBoundingClientRect();"
        "var paths = document.querySelectorAll('#graph path.edge');"
        "for (var i = paths.length - 1; i >= 0; i--) {"
        "  var p = paths[i], m = p.getPointAtLength(p.getTotalLength() / 2);"
        "  var at = m.matrixTransform(p.getScreenCTM());"
        "  var top = document.elementFromPoint(at.x, at.y);"
        "  if (!top.hasAttribute('data-i')) continue;"
        "  window.__at = [at.x - svg.left, at.y - svg.top];"
        "  return top.getAttribute('data-edge');"
        "}"
    )
    x, y = browser.execute_script("return window.__at")
    ActionChains(browser).move_to_element_with_offset(
        svg, int(x - svg.rect["width"] / 2), int(y - svg.rect["height"] / 2)
    ).perform()
    lines = _tip(browser).splitlines()
    sender, receiver = name.split("->")
    assert lines[0] == f"{sender} → {receiver}"
    flow = graph.edge_scores()[name]
    assert lines[1].startswith("flow ") and close_to(lines[1][5:], flow)
    effect = graph.effects[graph.edges.index(name)]
    assert lines[2].startswith("effect ") and close_to(lines[2][7:], effect)
    share = abs(flow) / abs(graph.flows).sum()
    assert lines[3].startswith("share of |flow| ")
    assert close_to(lines[3].split()[-2], 100 * share, 2)


def test_the_edges_can_be_ranked_and_drawn_by_their_own_effect(browser, graph_page):
    from selenium.webdriver.support.ui import Select

    graph, _ = graph_page
    Select(browser.find_element("id", "score")).select_by_value("effect")
    value = _set_keep(browser, 0.5)
    by_flow = np.argsort(-np.abs(graph.flows), kind="stable")
    order = by_flow[np.argsort(-np.abs(graph.effects[by_flow]), kind="stable")]
    carried = np.cumsum(np.abs(graph.effects[order]))
    count = int(np.searchsorted(carried, value * carried[-1] * (1 - 1e-12))) + 1
    expected = [graph.edges[i] for i in order[:count]]
    assert sorted(_drawn(browser)) == sorted(expected)
    assert expected != sorted(graph.prune(value).edge_scores())  # another set
    note = browser.find_element("id", "drawn").text
    assert note.startswith(f"{count} of {len(graph.edges)} edges carry")
    assert note.endswith("of |effect|")
    widest = browser.find_elements("css selector", "#graph path.edge")[-1]
    assert widest.get_attribute("data-edge") == expected[0]  # drawn on top


def test_hovering_a_node_shows_its_in_and_out_flow(browser, graph_page):
    graph, _ = graph_page
    flows = graph.node_flows()
    for node in ("m0", "logits", "input"):
        circle = browser.find_element("css selector", f'circle[data-node="{node}"]')
        hover(browser, circle)
        lines = _tip(browser).splitlines()
        assert lines[0] == node
        shown = {line.split()[0]: line.split()[1:] for line in lines[1:]}
        into = [e for e in graph.edges if _ends(e)[1] == node]
        out = [e for e in graph.edges if _ends(e)[0] == node]
        assert ("in-flow" in shown) == bool(into)
        assert ("out-flow" in shown) == bool(out)
        for key, edges, flow in zip(("in-flow", "out-flow"), (into, out), flows[node]):
            if edges:
                assert close_to(shown[key][0], flow)
                assert shown[key][1:] == [f"({len(edges)}", "edges)"]


def test_clicking_a_node_highlights_its_edges_and_clicking_again_clears(
    browser, graph_page
):
    graph, _ = graph_page
    _set_keep(browser, 1.0)
    node = "a1.h2"
    circle = browser.find_element("css selector", f'circle[data-node="{node}"]')
    circle.click()
    svg = browser.find_element("id", "graph")
    assert "focus" in svg.get_attribute("class")
    lit = {
        p.get_attribute("data-edge")
        for p in browser.find_elements("css selector", "#graph path.edge.hl")
    }
    touching = {e for e in _drawn(browser) if node in _ends(e)}
    assert lit == touching and len(touching) >= 2
    opacity = browser.find_element(
        "css selector", "#graph path.edge:not(.hl)"
    ).value_of_css_property("stroke-opacity")
    assert float(opacity) < 0.1
    panel = browser.find_element("id", "node").text
    assert panel.startswith(node) and "largest in-flows" in panel
    # where it reads: its largest in-flow by sender and receiver position
    top = next(r for r in graph.pairs_table() if _ends(r["edge"])[1] == node)
    sender, receiver = top["edge"].split("->")

    def token(position):
        return json.dumps(graph.tokens[position], ensure_ascii=False)

    s, t = top["sender_position"], top["receiver_position"]
    row = f"{sender}@{s} {token(s)} → {receiver}@{t} {token(t)}"
    lines = panel.splitlines()
    assert lines[lines.index("largest in-flows by position") + 1].startswith(row)
    circle.click()
    assert "focus" not in (svg.get_attribute("class") or "")
    assert browser.find_elements("css selector", "#graph path.edge.hl") == []
    circle.click()  # and a click on an empty place clears it too
    browser.find_element("css selector", "#graph text.rowlabel").click()
    assert browser.find_elements("css selector", "#graph path.edge.hl") == []


@pytest.mark.parametrize("width", WIDTHS)
def test_a_large_graph_draws_at_most_the_cap_and_says_how_many_are_hidden(
    browser, tmp_path, width
):
    graph = synthetic_graph(12, 8, qkv=True)
    browser.set_window_size(width, 900)
    graph.to_html(tmp_path / "g.html")
    open_page(browser, tmp_path / "g.html")
    kept = len(graph.prune(1.0).edge_scores())
    assert kept > MAX_DRAWN
    _set_keep(browser, 1.0)
    assert len(_drawn(browser)) == MAX_DRAWN
    # The cap draws the largest: the kept set's first MAX_DRAWN by |flow|.
    largest = graph.prune(1.0).edges_table()[:MAX_DRAWN]
    assert set(_drawn(browser)) == {row["edge"] for row in largest}
    note = browser.find_element("id", "drawn").text
    hidden = kept - MAX_DRAWN
    assert f"drawing the largest {MAX_DRAWN:,}, {hidden:,} hidden" in note
    overflow = browser.execute_script(
        "var d = document.documentElement; return d.scrollWidth <= d.clientWidth"
    )
    assert overflow and console_errors(browser) == []


def test_hostile_tokens_render_as_text(browser, tmp_path):
    graph = synthetic_graph()
    graph.tokens = [HOSTILE[0], HOSTILE[1], " a", " b"]
    graph.counterfactual = {"kind": "prompt", "tokens": list(reversed(graph.tokens))}
    graph.to_html(tmp_path / "g.html")
    open_page(browser, tmp_path / "g.html")
    assert browser.execute_script("return window.__pwned === undefined")
    chips = browser.find_elements("css selector", ".tokflows .chip")
    assert [c.text for c in chips] == graph.tokens
    assert HOSTILE[1] in browser.find_element("id", "app").text
    assert console_errors(browser) == []
