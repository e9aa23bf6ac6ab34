"""The viewer in a real headless Chromium (Debian's chromium and chromium-driver
packages, driven by Selenium through that executable; nothing is downloaded).
Skipped only where Chromium is not installed; CI (.ci/run) installs it."""

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from captum_iglens.studies.batch import write_html
from captum_iglens.viewer._page import render_page
from captum_iglens.viewer._payload import batch_payload
from tests.viewer.conftest import HOSTILE, NEEDS_CHROMIUM
from tests.viewer.synthetic import synthetic_result

pytestmark = NEEDS_CHROMIUM
#: Where the screenshots of a run are kept for a person to look at.
SHOTS = Path(os.environ.get("IGLENS_SCREENSHOTS", "/tmp/iglens-viewer-shots"))


def open_page(browser, path: Path) -> None:
    browser.get_log("browser")
    browser.get_log("performance")
    browser.get(path.resolve().as_uri())
    assert browser.find_element("id", "app").text


def console_errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def requests_made(browser, page: Path) -> list:
    """Every URL the page asked for (CDP network log), but the page itself."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return [u for u in urls if u != page.resolve().as_uri()]


def hover(browser, element) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(element).perform()


def field(browser, name: str) -> str:
    return browser.find_element("css selector", f'#info [data-field="{name}"]').text


def cells(browser):
    return browser.find_elements("css selector", "#map .cell")


def cell_colours(browser) -> list:
    return [c.value_of_css_property("background-color") for c in cells(browser)]


def screenshot(browser, name: str) -> None:
    """Saves a screenshot for a person to look at and checks it is not blank."""
    from PIL import Image

    png = browser.get_screenshot_as_png()
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / name).write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    inked = sum(n for n, c in colours if sum(c) < 3 * 245)
    assert len(colours) > 20 and inked > 0.02 * image.width * image.height


def close_to(shown: str, exact: float, digits: int = 4) -> bool:
    from tests.viewer.test_html import close_to as close

    return close(float(shown), exact, digits)


@pytest.fixture
def map_page(tmp_path):
    result = synthetic_result(7, 12)
    result.save(tmp_path / "r.json")
    result.to_html(tmp_path / "r.html")
    return result, tmp_path


def test_map_loads_offline_cleanly(browser, map_page):
    result, folder = map_page
    page = folder / "r.html"
    open_page(browser, page)
    assert console_errors(browser) == []
    assert requests_made(browser, page) == []
    entries = browser.execute_script(
        "return performance.getEntriesByType('resource').length"
    )
    assert entries == 0
    assert len(cells(browser)) == 7 * 12
    assert len(browser.find_elements("css selector", "#map .cell.onset")) == 7
    screenshot(browser, "map.png")


def test_hover_shows_the_numbers_of_the_results_json(browser, map_page):
    result, folder = map_page
    saved = json.loads((folder / "r.json").read_text())
    open_page(browser, folder / "r.html")
    k = len(saved["layer_names"])
    for row, col in [(0, 0), (3, 5), (6, 11)]:
        hover(browser, cells(browser)[row * k + col])
        assert field(browser, "layer") == saved["layer_names"][col]
        assert close_to(field(browser, "credit"), saved["attributions"][0][row][col])
        before = saved["lens"][0][row][col - 1] if col else saved["base_prob"][0][row]
        assert close_to(field(browser, "lens_before"), before)
        assert close_to(field(browser, "lens_after"), saved["lens"][0][row][col])
        # The optional views come from the result itself (not saved in its JSON).
        assert close_to(field(browser, "entropy"), float(result.entropy[0, row, col]))
        assert close_to(field(browser, "kl"), float(result.kl[0, row, col]))
        assert field(browser, "rank") == str(int(result.rank[0, row, col]))
        top = browser.find_elements("css selector", "#top-tokens tr")
        shown = [r.find_element("css selector", "td").text for r in top]
        assert shown == result.top_tokens[0][row][col]
        probs = [float(r.find_elements("css selector", "td")[1].text) for r in top]
        for shown, exact in zip(probs, result.top_probs[0, row, col].tolist()):
            assert close_to(str(shown), exact)
    assert console_errors(browser) == []


def test_click_draws_trajectory_and_completeness(browser, map_page):
    result, folder = map_page
    open_page(browser, folder / "r.html")
    browser.find_elements("css selector", "#map .rowhead")[2].click()
    lens = browser.find_element("css selector", "#trajectory polyline.lens")
    points = lens.get_attribute("points").split()
    assert len(points) == 12 + 1
    ys = [float(p.split(",")[1]) for p in points]
    # Higher probability is drawn higher (smaller y): the order of the levels.
    levels = [float(result.base_prob[0, 2])] + result.levels[0, 2].tolist()
    for a, b in zip(range(13), range(1, 13)):
        if abs(levels[a] - levels[b]) > 1e-3:
            assert (ys[a] > ys[b]) == (levels[a] < levels[b])
    text = browser.find_element("id", "completeness").text
    total = sum(result.attributions[0, 2].tolist())
    change = float(result.model_prob[0, 2] - result.base_prob[0, 2])
    sigma = text.split("Σ = ")[1].split()[0]
    delta_p = text.split("Δp = ")[1].split()[0]
    assert close_to(sigma, total) and close_to(delta_p, change)
    assert "|Σ − Δp| = " in text
    screenshot(browser, "trajectory.png")


def test_toggles_recolour_the_map(browser, map_page):
    result, folder = map_page
    open_page(browser, folder / "r.html")

    signed = cell_colours(browser)
    browser.find_element("id", "absolute").click()
    absolute = cell_colours(browser)
    browser.find_element("css selector", 'input[value="lens"]').click()
    lens = cell_colours(browser)
    assert signed != absolute != lens
    negative = (result.attributions[0] < 0).flatten().nonzero()[0].item()
    assert signed[negative] != absolute[negative]
    assert len(lens) == 7 * 12 and console_errors(browser) == []


def test_learned_readout_shows_block_and_lens_change_parts(
    browser, tmp_path, learned_result
):
    learned_result.to_html(tmp_path / "l.html")
    open_page(browser, tmp_path / "l.html")
    k = len(learned_result.layer_names)

    credit = cell_colours(browser)
    browser.find_element("css selector", 'input[value="change"]').click()
    change = cell_colours(browser)
    browser.find_element("css selector", 'input[value="block"]').click()
    block = cell_colours(browser)
    assert credit != change and credit != block and change != block
    row, col = 2, k - 2
    hover(browser, cells(browser)[row * k + col])
    assert close_to(
        field(browser, "credit"), float(learned_result.attributions[0, row, col])
    )
    assert close_to(
        field(browser, "change"), float(learned_result.lens_change[0, row, col])
    )
    assert console_errors(browser) == []


def test_signed_colours_are_the_heatmaps(browser, map_page):
    # Green for positive credit, red for negative: the PNG heatmap's colours.
    from captum_iglens.plots import color_map

    result, folder = map_page
    open_page(browser, folder / "r.html")
    colours = [c.value_of_css_property("background-color") for c in cells(browser)]
    credits = result.attributions[0].flatten()
    for index in (int(credits.argmax()), int(credits.argmin())):
        r, g, b = [int(v) for v in colours[index].split("(")[1].split(",")[:3]]
        png = color_map()(1.0 if credits[index] > 0 else 0.0)
        assert (g > r) == (png[1] > png[0])
        assert (g > r) == bool(credits[index] > 0)


def test_hostile_tokens_render_as_text(browser, tmp_path, hostile_result):
    page = tmp_path / "h.html"
    hostile_result.to_html(page)
    open_page(browser, page)
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text
    assert browser.execute_script("return window.__pwned === undefined")
    assert browser.find_elements("css selector", "#app img") == []
    assert len(browser.find_elements("tag name", "script")) == 2
    labels = browser.find_elements("css selector", "#map .rowhead .tok")
    texts = [e.get_attribute("textContent") for e in labels]
    assert texts == hostile_result.tokens[0]
    hover(browser, cells(browser)[1 * 6 + 2])
    top = browser.find_elements("css selector", "#top-tokens td.tok")
    assert top[0].get_attribute("textContent") == HOSTILE[0]
    browser.find_elements("css selector", "#map .rowhead")[2].click()
    assert browser.execute_script("return window.__pwned === undefined")
    assert console_errors(browser) == [] and requests_made(browser, page) == []
    screenshot(browser, "hostile.png")


def test_heads_fold_per_block_and_unfold(browser, tmp_path):
    names = []
    for block in range(6):
        names += [f"L{block}.attn.h{h}" for h in range(12)] + [f"L{block}.attn.bias"]
        names.append(f"L{block}.mlp")
    result = synthetic_result(5, len(names), layer_names=names)
    result.to_html(tmp_path / "heads.html")
    open_page(browser, tmp_path / "heads.html")
    assert len(cells(browser)) == 5 * 12  # attention folded into one column
    hover(browser, cells(browser)[0])
    credit = sum(result.attributions[0, 0, :13].tolist())
    assert abs(float(field(browser, "credit")) - credit) <= 2e-3 * max(1, abs(credit))
    assert close_to(field(browser, "lens_after"), float(result.levels[0, 0, 12]))
    screenshot(browser, "heads-collapsed.png")
    browser.find_element("xpath", "//button[text()='unfold all']").click()
    assert len(cells(browser)) == 5 * len(names)
    hover(browser, cells(browser)[len(names) + 3])
    assert field(browser, "layer") == "L0.attn.h3"
    assert close_to(field(browser, "credit"), float(result.attributions[0, 1, 3]))
    screenshot(browser, "heads-expanded.png")
    assert console_errors(browser) == []


def count(browser, selector: str) -> int:
    return browser.execute_script(
        "return document.querySelectorAll(arguments[0]).length", selector
    )


def group_heads(browser):
    return browser.find_elements("css selector", "#map .colhead.group")


def parts_page(tmp_path, name, blocks, parts, last, positions=4):
    """A synthetic map with, per block, ``<b>.attn``, then ``parts`` MLP
    columns ``<b>.mlp.<part><i>`` and ``<b>.mlp.<last>`` (if any)."""
    names = []
    for b in range(blocks):
        names += [f"{b}.attn", *(f"{b}.mlp.{parts[0]}{i}" for i in range(parts[1]))]
        names += [f"{b}.mlp.{last}"] if last else []
    result = synthetic_result(positions, len(names), layer_names=names, top_k=None)
    result.to_html(tmp_path / f"{name}.html")
    return result, tmp_path / f"{name}.html"


def test_neuron_page_opens_folded_and_unfolds_per_block(browser, tmp_path):
    result, page = parts_page(tmp_path, "neurons", 3, ("n", 100), "bias")
    names = result.layer_names
    open_page(browser, page)
    assert len(cells(browser)) == 4 * 3 * 2  # each block: attention, MLP folded
    assert [e.text for e in group_heads(browser)] == [f"{b}.mlp ▸101" for b in range(3)]
    hover(browser, cells(browser)[1])
    assert field(browser, "layer") == "0.mlp (100 neurons, bias, summed)"
    credit = sum(result.attributions[0, 0, 1:102].tolist())
    assert abs(float(field(browser, "credit")) - credit) <= 2e-3 * max(1, abs(credit))
    assert close_to(field(browser, "lens_after"), float(result.levels[0, 0, 101]))
    group_heads(browser)[1].click()  # block 1's neurons unfold, alone
    width = 3 * 2 - 1 + 101
    assert len(cells(browser)) == 4 * width and len(group_heads(browser)) == 2
    row, column = 2, names.index("1.mlp.n5")
    hover(browser, cells(browser)[row * width + 3 + 5])
    assert field(browser, "layer") == "1.mlp.n5"
    assert close_to(
        field(browser, "credit"), float(result.attributions[0, row, column])
    )
    screenshot(browser, "neurons-unfolded.png")
    browser.find_elements("css selector", "#map .colhead.member")[7].click()
    assert len(cells(browser)) == 4 * 3 * 2  # a member's head folds its block
    assert console_errors(browser) == []


def test_expert_page_opens_folded_and_unfolds_per_block(browser, tmp_path):
    result, page = parts_page(tmp_path, "experts", 4, ("e", 64), "shared")
    names = result.layer_names
    open_page(browser, page)
    assert len(cells(browser)) == 4 * 4 * 2
    hover(browser, cells(browser)[4 * 2 + 3])  # row 1, block 1's experts
    assert field(browser, "layer") == "1.mlp (64 experts, shared experts, summed)"
    screenshot(browser, "experts-folded.png")
    group_heads(browser)[3].click()
    width = 4 * 2 - 1 + 65
    assert len(cells(browser)) == 4 * width
    hover(browser, cells(browser)[width + 7 + 64])  # row 1, block 3's shared experts
    assert field(browser, "layer") == "3.mlp.shared"
    exact = float(result.attributions[0, 1, names.index("3.mlp.shared")])
    assert close_to(field(browser, "credit"), exact)
    browser.find_element("xpath", "//button[text()='unfold all']").click()
    assert len(cells(browser)) == 4 * len(names)
    browser.find_element("xpath", "//button[text()='fold per block']").click()
    assert len(cells(browser)) == 4 * 4 * 2 and console_errors(browser) == []


def test_a_smollm2_sized_neuron_page_stays_usable(browser, tmp_path):
    # 30 blocks of 1,536 neurons (no MLP bias): 46,110 columns, 60 on open.
    result, page = parts_page(tmp_path, "big", 30, ("n", 1536), None, positions=3)
    open_page(browser, page)
    assert count(browser, "#map .cell") == 3 * 60
    assert browser.find_elements("xpath", "//button[text()='unfold all']") == []
    # The first token's trajectory runs over the 60 columns on show.
    lens = browser.find_element("css selector", "#trajectory polyline.lens")
    assert len(lens.get_attribute("points").split()) == 1 + 60
    group_heads(browser)[29].click()
    assert count(browser, "#map .cell") == 3 * (59 + 1536)
    assert count(browser, "#map .colhead.group") == 29
    browser.find_elements("css selector", "#map .colhead.member")[0].click()
    assert count(browser, "#map .cell") == 3 * 60 and console_errors(browser) == []


def test_the_groups_are_the_page_datas(browser, tmp_path):
    # Names that say nothing: the page folds what the groups say, nothing else.
    result = synthetic_result(3, 4, layer_names=["a", "b", "c", "d"], top_k=None)
    data = result.page_data()
    assert len(data["groups"]) == 4
    data["groups"] = [
        dict(name="a", members=[0], foldable=False, folded=False, what=""),
        dict(name="b+c", members=[1, 2], foldable=True, folded=True, what="2 parts"),
        dict(name="d", members=[3], foldable=False, folded=False, what=""),
    ]
    page = tmp_path / "g.html"
    page.write_text(render_page(data), encoding="utf-8")
    open_page(browser, page)
    assert len(cells(browser)) == 3 * 3
    hover(browser, cells(browser)[1])
    assert field(browser, "layer") == "b+c (2 parts, summed)"
    group_heads(browser)[0].click()
    assert len(cells(browser)) == 3 * 4 and console_errors(browser) == []


def test_batch_page_lists_prompts_and_opens_their_maps(browser, batch_dir):
    page = write_html(batch_dir, batch_dir / "view.html")
    open_page(browser, page)
    assert console_errors(browser) == [] and requests_made(browser, page) == []
    items = browser.find_elements("css selector", "#prompts li")
    assert len(items) == 3
    records = [json.loads(line) for line in (batch_dir / "results.jsonl").open()]
    for i in (2, 1):
        items[i].click()
        k = len(records[i]["layer_names"])
        assert len(cells(browser)) == len(records[i]["positions"]) * k
    assert "mean Δp" in browser.find_element("id", "mean-sum").text
    screenshot(browser, "batch.png")


@pytest.mark.slow
def test_large_batch_page_loads(browser, tmp_path):
    items = [
        {"id": i, "prompt": f"prompt {i}", "answer": "x", "result": r}
        for i, r in enumerate(synthetic_result(40, 30, seed=s) for s in range(20))
    ]
    page = tmp_path / "big.html"
    page.write_text(render_page(batch_payload(items, {})), encoding="utf-8")
    open_page(browser, page)
    assert len(cells(browser)) == 40 * 30 and console_errors(browser) == []


def test_comparison_and_validation_pages(
    browser, tmp_path, comparison_result, validation_result
):
    comparison_result.to_html(tmp_path / "c.html")
    open_page(browser, tmp_path / "c.html")
    expected = sum(
        m.scores.shape[1] * m.scores.shape[2]
        for m in comparison_result.methods.values()
    )
    assert len(cells(browser)) == expected
    hover(browser, cells(browser)[0])
    first = next(iter(comparison_result.methods.values()))
    assert close_to(field(browser, "score"), float(first.scores[0, 0, 0]))
    assert console_errors(browser) == []
    screenshot(browser, "comparison.png")
    validation_result.to_html(tmp_path / "v.html")
    open_page(browser, tmp_path / "v.html")
    assert len(cells(browser)) == 3 * len(validation_result.layer_names)
    hover(browser, cells(browser)[1])
    assert close_to(field(browser, "drop"), float(validation_result.drops[0, 1]))
    browser.find_elements("css selector", "#map .rowhead")[0].click()
    assert browser.find_element("css selector", "#trajectory polyline.lens")
    assert console_errors(browser) == []
    screenshot(browser, "validation.png")


def test_sequences_padding_and_empty_result(browser, tmp_path):
    from selenium.webdriver.support.ui import Select

    from captum_iglens import IGLensResult

    result = synthetic_result(4, 3, batch=2)
    result.mask[1, :2] = False
    result.to_html(tmp_path / "b2.html")
    open_page(browser, tmp_path / "b2.html")
    assert len(cells(browser)) == 4 * 3
    Select(browser.find_element("tag name", "select")).select_by_index(1)
    assert len(cells(browser)) == 2 * 3  # padding rows are not drawn
    IGLensResult.empty(["0", "1"], "prediction_aware", 8).to_html(tmp_path / "e.html")
    open_page(browser, tmp_path / "e.html")
    assert cells(browser) == [] and console_errors(browser) == []


def test_restoration_page(browser, tmp_path, restoration_result):
    result = restoration_result
    result.to_html(tmp_path / "r.html")
    open_page(browser, tmp_path / "r.html")
    k = len(result.layer_names)
    assert len(cells(browser)) == len(result.facts) * k
    hover(browser, cells(browser)[k + 2])
    assert close_to(field(browser, "recovery"), float(result.recovery("noise")[1, 2]))
    framed = browser.find_elements("css selector", "#map .cell.igonset")
    assert len(framed) == int((~np.isnan(result.onsets["ig_lens"])).sum())
    browser.find_elements("css selector", "#map .rowhead")[0].click()
    assert browser.find_element("css selector", "#trajectory polyline.recovery")
    assert browser.find_element("css selector", "#trajectory polyline.share")
    counterfactual = browser.find_element(
        "css selector", 'input[name="corruption"][value="counterfactual"]'
    )
    counterfactual.click()
    hover(browser, cells(browser)[k + 2])
    expected = float(result.recovery("counterfactual")[1, 2])
    assert close_to(field(browser, "recovery"), expected)
    assert console_errors(browser) == []
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, "restoration.png")


def escaped(text: str) -> str:
    """A token as the viewer labels it: the terminal table's escapes (Python's
    own for what is not printable), plain spaces as '␣', the empty token '∅'."""
    from captum_iglens._result_tables import visible

    if text == "":
        return "∅"
    return "␣" * len(text) if text.strip(" ") == "" else visible(text)


def test_cells_show_their_layers_top_token_on_open(browser, tmp_path):
    # The classic logit-lens grid, before any hover: each cell its layer's
    # top-1 token, readable, the target's cells marked.
    result = synthetic_result(6, 10, seed=3)
    result.rank[0, 1, 4] = 1
    result.rank[0, 3, 9] = 1
    result.to_html(tmp_path / "t.html")
    open_page(browser, tmp_path / "t.html")
    shown = cells(browser)
    assert len(shown) == 6 * 10
    for row in range(6):
        for col in range(10):
            cell = shown[row * 10 + col]
            top = result.top_tokens[0][row][col][0]
            assert cell.get_attribute("textContent") == top
            hit = "hit" in cell.get_attribute("class").split()
            assert hit == (int(result.rank[0, row, col]) == 1)
    width = shown[0].size["width"]
    size = float(shown[0].value_of_css_property("font-size").rstrip("px"))
    assert width >= 40 and size >= 10
    # The text is not clipped away: the cell is as wide as its token needs.
    fits = browser.execute_script(
        "var c = arguments[0]; return c.scrollWidth <= c.clientWidth + 1", shown[0]
    )
    assert fits
    assert console_errors(browser) == []
    screenshot(browser, "top-tokens.png")


def test_invisible_tokens_are_labelled_escaped(browser, tmp_path):
    tokens = [" The", "\n", " ", "\t", "a\x00b", "\u200b", "", "\n\n"]
    result = synthetic_result(len(tokens), 4, tokens=tokens)
    result.top_tokens[0][0][2][0] = "\n"
    result.to_html(tmp_path / "e.html")
    open_page(browser, tmp_path / "e.html")
    labels = browser.find_elements("css selector", "#map .rowhead .tok")
    texts = [e.get_attribute("textContent") for e in labels]
    assert texts == [escaped(t) for t in tokens]
    assert texts[1] == "\\n" and texts[2] == "␣" and texts[5] == "\\u200b"
    assert labels[1].is_displayed() and labels[1].size["width"] > 0
    assert cells(browser)[2].get_attribute("textContent") == "\\n"
    hover(browser, cells(browser)[1 * 4])
    assert field(browser, "token") == "\\n"
    assert console_errors(browser) == []
    screenshot(browser, "escaped.png")


def test_first_token_trajectory_is_drawn_on_open(browser, map_page):
    result, folder = map_page
    open_page(browser, folder / "r.html")
    lens = browser.find_element("css selector", "#trajectory polyline.lens")
    ys = [float(p.split(",")[1]) for p in lens.get_attribute("points").split()]
    levels = [float(result.base_prob[0, 0])] + result.levels[0, 0].tolist()
    assert len(ys) == len(levels)
    low, high = int(np.argmin(levels)), int(np.argmax(levels))
    assert ys[high] < ys[low]
    text = browser.find_element("id", "completeness").text
    sigma = text.split("Σ = ")[1].split()[0]
    assert close_to(sigma, sum(result.attributions[0, 0].tolist()))
    selected = browser.find_elements("css selector", "#map .rowhead.selected")
    assert [e.get_attribute("data-row") for e in selected] == ["0"]


def test_click_shows_the_source_map_with_exact_credit_on_hover(browser, tmp_path):
    from tests.viewer.synthetic import synthetic_source_result

    result = synthetic_source_result(4, 3, 9)
    page = tmp_path / "s.html"
    result.to_html(page)
    open_page(browser, page)
    # Per-source columns fold into their block's attention in the map.
    assert len(cells(browser)) == 4 * (1 + 3 * 2)
    sources = result.source_map()[0]  # (P, k, T)
    row = 2
    position = int(result.positions[row])
    browser.find_elements("css selector", "#map .rowhead")[row].click()
    shown = browser.find_elements("css selector", "#source-map .cell")
    assert len(shown) == (position + 1) * 3 + 2 * 3  # sources, bias and MLP rows
    labels = browser.find_elements("css selector", "#source-map .rowhead .tok")
    words = result.metadata["source_tokens"][0][: position + 1]
    assert [e.get_attribute("textContent") for e in labels] == [
        escaped(w) for w in words
    ]
    for source, block in [(0, 0), (position, 2), (3, 1)]:
        hover(browser, shown[source * 3 + block])
        credit = browser.find_element(
            "css selector", '#source-info [data-field="credit"]'
        ).text
        exact = float(sources[row, block, source])
        assert abs(float(credit) - exact) <= 1e-6 * max(1.0, abs(exact))
        assert browser.find_element(
            "css selector", '#source-info [data-field="source"]'
        ).text.startswith(f"{source} ")
    # The strongest routes, the largest |credit| first, drawn as a flow.
    routes = browser.find_elements("css selector", "#routes path.route")
    causal = sources[row, :, : position + 1].flatten()
    assert len(routes) == min(8, int((causal != 0).sum()))
    first = float(routes[0].get_attribute("data-credit"))
    assert abs(abs(first) - float(causal.abs().max())) <= 1e-6
    total = browser.find_element("id", "source-sum").text
    change = float(result.model_prob[0, row] - result.base_prob[0, row])
    assert close_to(total.split("= ")[1].split()[0], change)
    assert console_errors(browser) == [] and requests_made(browser, page) == []
    screenshot(browser, "sources.png")


def test_comparison_page_shows_source_rank_agreement(browser, tmp_path):
    from captum_iglens.studies.comparison import (
        ComparisonResult,
        MethodResult,
        source_rank_agreement,
    )

    gen = torch.Generator().manual_seed(0)
    names = [f"{j} ' w{j}'" for j in range(6)]
    positions = torch.tensor([3, 5])
    causal = (torch.arange(6)[None, :] <= positions[:, None]).float()

    def method(unit):
        scores = torch.rand(1, 2, 6, generator=gen) * causal
        zeros = torch.zeros(1, 2)
        return MethodResult(scores, names, zeros, zeros, unit, unit, *[0] * 7)

    result = ComparisonResult(
        {
            "ig_lens_sources": method("probability"),
            "lig_embeddings": method("probability"),
            "attention_rollout": method("share"),
        },
        torch.tensor([[5, 9]]),
        positions,
        torch.ones(1, 2, dtype=torch.bool),
        ["0"],
        tokens=[[" a", "\n"]],
        input_tokens=[[" w3", " w5"]],
    )
    page = tmp_path / "agree.html"
    result.to_html(page)
    open_page(browser, page)
    rho = source_rank_agreement(result)
    for name in ("lig_embeddings", "attention_rollout"):
        shown = browser.find_elements(
            "css selector", f'#agreement td[data-method="{name}"]'
        )
        assert len(shown) == 2
        for p, cell in enumerate(shown):
            assert close_to(cell.text, float(rho[name][0, p]), 3)
    rows = browser.find_elements("css selector", "#agreement .tok")
    assert [e.get_attribute("textContent") for e in rows] == [" a", "\\n"]
    assert console_errors(browser) == []
    screenshot(browser, "agreement.png")


def test_routes_go_through_heads_when_the_result_has_them(browser, tmp_path):
    from tests.viewer.synthetic import synthetic_source_result

    result = synthetic_source_result(3, 2, 6, heads=3)
    page = tmp_path / "sh.html"
    result.to_html(page)
    open_page(browser, page)
    per_head = result.source_map(by_head=True)[0, 0]  # (k, H, T), the first token
    position = int(result.positions[0])
    visible = per_head[..., : position + 1]
    block, head, source = np.unravel_index(
        int(visible.abs().argmax()), tuple(visible.shape)
    )
    routes = browser.find_elements("css selector", "#routes path.route")
    assert len(routes) == 8
    first = float(routes[0].get_attribute("data-credit"))
    assert abs(first - float(visible[block, head, source])) <= 1e-6
    title = routes[0].find_element("tag name", "title").get_attribute("textContent")
    assert title.startswith(f"{source} ") and f"→ {block}.h{head} →" in title
    assert console_errors(browser) == []


def test_trajectory_ticks_fit_their_axis_and_the_header_is_escaped(browser, tmp_path):
    # Issue 35: "0.00044" showed as ".00044" and "-0.000047" as "000047"; the
    # header's prompt applied U+202E and hid a zero-width space.
    result = synthetic_result(3, 6)
    result.levels = result.levels * 1e-3
    result.base_prob = result.base_prob * 1e-3 + 5e-5
    result.model_prob = result.levels[..., -1].clone()
    result.attributions = torch.diff(
        torch.cat([result.base_prob[..., None], result.levels], -1), dim=-1
    )
    result.attributions[0, 0, 2] -= 4.7e-5
    result.metadata["prompt"] = "left \u202eright\u200b end"
    result.to_html(tmp_path / "small.html")
    open_page(browser, tmp_path / "small.html")
    boxes = browser.execute_script(
        "return Array.from(document.querySelectorAll('#trajectory svg text'))"
        ".map(function (t) { var b = t.getBBox(); return [t.textContent, b.x]; })"
    )
    assert boxes and all(x >= 0 for _, x in boxes), boxes
    about = browser.execute_script(
        "return Array.from(document.querySelectorAll('.about'))"
        ".map(function (e) { return e.textContent; })"
    )
    prompt = next(line for line in about if line.startswith("prompt"))
    assert prompt == "prompt: left \\u202eright\\u200b end"
    screenshot(browser, "small-ticks.png")
    assert console_errors(browser) == []


def test_unfolded_head_names_do_not_overlap(browser, tmp_path):
    # Issue 35: nine heads, the bias and the MLP (SmolLM2's blocks): the last
    # named head's name ran into the MLP's ("11.attn.h2" read as "1.attn.h2").
    names = []
    for block in range(10, 30):
        names += [f"{block}.attn.h{h}" for h in range(9)] + [f"{block}.attn.bias"]
        names.append(f"{block}.mlp")
    synthetic_result(3, len(names), layer_names=names).to_html(tmp_path / "h.html")
    open_page(browser, tmp_path / "h.html")
    browser.find_element("xpath", "//button[text()='unfold all']").click()
    spans = browser.execute_script(
        "return Array.from(document.querySelectorAll('#map .colhead'))"
        ".filter(function (e) { return e.textContent; }).map(function (e) {"
        "  var range = document.createRange(); range.selectNodeContents(e);"
        "  var r = range.getBoundingClientRect();"
        "  return [e.textContent, r.left, r.right]; })"
    )
    assert len(spans) > 2 * 20
    for (name, _, right), (after, left, _) in zip(spans, spans[1:]):
        assert right <= left, f"{name!r} runs into {after!r}"
    screenshot(browser, "heads-unfolded-names.png")
    assert console_errors(browser) == []


def test_the_trajectory_labels_do_not_run_into_the_last(browser, tmp_path):
    # Issue 33's SmolLM2 neuron page: 60 columns on show, labels every 8 and the
    # last, so the last two were 4 columns apart and their slanted names touched.
    names = [f"{block}.{part}" for block in range(30) for part in ("attn", "mlp")]
    synthetic_result(3, len(names), layer_names=names).to_html(tmp_path / "t.html")
    open_page(browser, tmp_path / "t.html")
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#trajectory svg text'))"
        ".filter(function (t) { return t.getAttribute('transform'); })"
        ".map(function (t) { return [t.textContent, Number(t.getAttribute('x')),"
        "  t.getBBox().height]; })"
    )
    assert labels[0][0] == "h_base" and labels[-1][0] == "29.mlp"
    slant = np.sin(np.radians(35))  # the labels are drawn at -35 degrees
    for (name, x, height), (after, x_after, _) in zip(labels, labels[1:]):
        assert (x_after - x) * slant >= height, f"{name!r} runs into {after!r}"
    assert console_errors(browser) == []


@pytest.mark.parametrize("path", ["telescoping", "joint"])
def test_the_trajectory_caption_says_what_the_lines_are_on_each_path(
    browser, tmp_path, path
):
    # Issue 48: the caption was "lens level = f(h_base) + cumulative credit" on
    # every path; the joint path's two lines differ.
    from dataclasses import replace

    from captum_iglens.attr.paths import PATHS

    result = replace(synthetic_result(4, 6), path=path)
    result.metadata = {"model": "/root/.cache/captum_iglens/Tiny-Model"}
    result.to_html(tmp_path / f"{path}.html")
    open_page(browser, tmp_path / f"{path}.html")
    caption = browser.find_element("id", "trajectory-caption").text
    assert caption.startswith(PATHS[path].trajectory_caption + "; f(h_base) = ")
    about = browser.execute_script(
        "return Array.from(document.querySelectorAll('.about'))"
        ".map(function (e) { return e.textContent; })"
    )
    assert "model: Tiny-Model" in about and "/root" not in " ".join(about)
    screenshot(browser, f"trajectory-{path}.png")
    assert console_errors(browser) == []
