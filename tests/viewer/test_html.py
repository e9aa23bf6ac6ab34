"""The HTML builder without a browser: escaping, self-containment, the data a
page carries, its size bound, and the entry points of every result type."""

import html
import json
import math
import re

import pytest
import torch

from captum_iglens.studies.batch import write_html
from captum_iglens.viewer._page import DATA_ID, embed_json, result_html
from tests.viewer.conftest import HOSTILE
from tests.viewer.synthetic import synthetic_result

SVG_NAMESPACE = "http://www.w3.org/2000/svg"


def page_data(page: str) -> dict:
    """The JSON of a page, cut out by hand as a browser's parser would."""
    start = page.index(f'<script type="application/json" id="{DATA_ID}">')
    body = page[start:].split(">", 1)[1]
    return json.loads(body[: body.index("</script>")])


def close_to(shown: float, exact: float, digits: int = 4) -> bool:
    """``shown`` equals ``exact`` to ``digits`` significant digits."""
    if exact == 0:
        return shown == 0
    unit = 10 ** (math.floor(math.log10(abs(exact))) - digits + 1)
    return abs(shown - exact) <= 0.5 * unit * (1 + 1e-9)


def test_embedded_json_cannot_close_the_script_or_start_markup():
    data = {"t": HOSTILE + ["a & b", "\u2028line\u2029", "<!--", "]]>"]}
    text = embed_json(data)
    for char in "<>&\u2028\u2029":
        assert char not in text
    assert json.loads(text) == data


def test_hostile_tokens_stay_data(hostile_result):
    page = result_html(hostile_result)
    # The data element and the viewer's script are the only scripts in the page.
    assert page.count("<script") == 2 and page.lower().count("</script") == 2
    assert "<img" not in page and "onerror" not in page.split(DATA_ID)[0]
    data = page_data(page)
    rows = data["sequences"][0]["rows"]
    assert [r["token"] for r in rows] == hostile_result.tokens[0]
    assert HOSTILE[0] in data["vocab"] and data["about"]["prompt"] == HOSTILE[1]
    # The viewer writes strings with textContent, never as markup.
    script = page.split(DATA_ID)[1]
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
    assert "document.write" not in script and "eval(" not in script


def test_page_loads_nothing_from_anywhere():
    page = result_html(synthetic_result(3, 4))
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) <= {SVG_NAMESPACE}
    assert not re.search(r"\b(src|href)\s*=", page)
    assert "default-src 'none'" in page


def test_page_carries_the_result_to_the_displayed_precision():
    result = synthetic_result(5, 7)
    data = page_data(result_html(result))
    assert data["layers"] == result.layer_names
    rows = data["sequences"][0]["rows"]
    assert len(rows) == 5
    for p, row in enumerate(rows):
        for j in range(7):
            assert close_to(row["credit"][j], float(result.attributions[0, p, j]))
            assert close_to(row["lens"][j], float(result.levels[0, p, j]))
            assert close_to(row["entropy"][j], float(result.entropy[0, p, j]))
            assert row["rank"][j] == int(result.rank[0, p, j])
            shown = [data["vocab"][i] for i in row["top"][j]]
            assert shown == result.top_tokens[0][p][j]
            for got, want in zip(row["topp"][j], result.top_probs[0, p, j].tolist()):
                assert close_to(got, want)
        change = float(result.model_prob[0, p]) - float(result.base_prob[0, p])
        assert close_to(row["dp"], change)
        assert close_to(row["sum"], sum(result.attributions[0, p].tolist()))
        # The onset by hand: the first layer with half the |credit| mass.
        mass = result.attributions[0, p].abs().cumsum(0).tolist()
        assert row["onset"] == next(j for j, m in enumerate(mass) if m >= mass[-1] / 2)


def test_padding_rows_are_left_out_and_views_are_optional():
    result = synthetic_result(4, 3, batch=2, top_k=None)
    result.mask[1, :2] = False
    data = page_data(result_html(result))
    assert [len(s["rows"]) for s in data["sequences"]] == [4, 2]
    assert data["sequences"][1]["rows"][0]["pos"] == int(result.positions[2])
    assert "top" not in data["sequences"][0]["rows"][0] and data["vocab"] == []


def test_size_bound_200_tokens_30_layers_top5():
    page = result_html(synthetic_result(200, 30, top_k=5))
    size = len(page.encode("utf-8"))
    print(f"200 tokens x 30 layers, top-5 views: {size / 1e6:.2f} MB")
    assert size < 2e6


def test_to_html_and_notebook_repr(tmp_path, hostile_result):
    path = tmp_path / "r.html"
    hostile_result.to_html(path)
    page = path.read_text(encoding="utf-8")
    assert page == result_html(hostile_result)
    frame = hostile_result._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    srcdoc = re.match(r'<iframe srcdoc="([^"]*)"', frame).group(1)
    assert html.unescape(srcdoc) == page
    with pytest.raises(ValueError, match="path"):
        hostile_result.to_html(tmp_path / "missing" / "r.html")


@pytest.mark.parametrize("path", ["telescoping", "joint"])
def test_the_trajectory_caption_is_the_paths(path):
    # Issue 48: "lens level = f(h_base) + cumulative credit" is false on the
    # joint path; each path says what its two lines are.
    from dataclasses import replace

    from captum_iglens.attr.paths import PATHS

    data = page_data(result_html(replace(synthetic_result(3, 4), path=path)))
    assert data["trajectory"] == PATHS[path].trajectory_caption
    joint = "f(h_base) + cumulative credit" not in data["trajectory"].split(";")[0]
    assert joint == (path == "joint")


@pytest.mark.parametrize(
    "recorded, shown",
    [
        ("/root/.cache/captum_iglens/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
        ("~/models/tiny", "tiny"),
        ("./tiny", "tiny"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ],
)
def test_the_header_shows_the_models_name_not_its_folder(recorded, shown):
    # Issue 48: a page meant to be shared shows no local path.
    result = synthetic_result(3, 4)
    result.metadata = {"model": recorded, "prompt": "p"}
    page = result_html(result)
    assert page_data(page)["about"]["model"] == shown
    if shown != recorded:
        assert recorded not in page and "/root/.cache" not in page


def test_comparison_page(comparison_result, tmp_path):
    comparison_result.to_html(tmp_path / "c.html")
    data = page_data((tmp_path / "c.html").read_text(encoding="utf-8"))
    (seq,) = data["sequences"]
    assert [m["name"] for m in seq["methods"]] == list(comparison_result.methods)
    for m in seq["methods"]:
        method = comparison_result.methods[m["name"]]
        scores, change = method.scores[0].double(), method.prob_change[0].double()
        residual = (scores.sum(-1) - change).abs()
        for got, want in zip(m["resid"], residual.tolist()):
            assert close_to(got, want, 3) or abs(got - want) < 1e-9
    assert "<iframe" in comparison_result._repr_html_()


def test_validation_page(validation_result, tmp_path):
    validation_result.to_html(tmp_path / "v.html")
    data = page_data((tmp_path / "v.html").read_text(encoding="utf-8"))
    assert len(data["prompts"]) == 3 and data["methods"] == ["ig_lens", "random"]
    for prompt, drops in zip(data["prompts"], validation_result.drops):
        assert all(close_to(a, float(b)) for a, b in zip(prompt["drops"], drops))
    assert data["summary"]["all"]["ig_lens"]["top1"]["n"] == 3


def test_batch_page_mean_credit_sums_to_mean_change(batch_dir, tmp_path):
    path = write_html(batch_dir)
    assert path == batch_dir / "index.html"
    data = page_data(path.read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (batch_dir / "results.jsonl").open()]
    assert [p["id"] for p in data["prompts"]] == [r["id"] for r in records]
    credits = torch.cat([torch.tensor(r["attributions"][0]) for r in records])
    changes = torch.cat(
        [
            torch.tensor(r["model_prob"][0]) - torch.tensor(r["base_prob"][0])
            for r in records
        ]
    )
    assert data["n_tokens"] == len(credits) == 8
    for got, want in zip(data["mean_credit"], credits.double().mean(0).tolist()):
        assert close_to(got, want)
    assert close_to(data["mean_dp"], changes.double().mean().item())
    assert abs(data["mean_credit_sum"] - data["mean_dp"]) <= 1e-6
    assert sum(data["onsets"]) == 8
    with pytest.raises(ValueError, match="out_dir"):
        write_html(tmp_path)


def test_restoration_page(restoration_result, tmp_path):
    result = restoration_result
    result.to_html(tmp_path / "r.html")
    data = page_data((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert data["kind"] == "restoration" and data["layers"] == result.layer_names
    assert data["corruptions"] == ["noise", "counterfactual"]
    assert data["methods"] == ["ig_lens", "random"]
    assert [f["id"] for f in data["facts"]] == ["t0", "t1", "t2", "t3"]
    for i, fact in enumerate(data["facts"]):
        credit = result.scores["ig_lens"][i]
        # The PNG's IG-Lens curve: the share of the credit reached by each block.
        share = (credit.cumsum() / credit.sum()).tolist()
        assert all(close_to(a, b) for a, b in zip(fact["share"], share))
        onset = float(result.onsets["ig_lens"][i])
        assert fact["onsets"]["ig_lens"] == (None if math.isnan(onset) else int(onset))
        for c in result.corruptions:
            trace = fact["traces"][c]
            recovery = result.recovery(c)[i].tolist()
            assert all(close_to(a, b) for a, b in zip(trace["recovery"], recovery))
            assert close_to(trace["clean"], float(result.probs[c][i, 0]))
            causal = float(result.causal_onsets[c][i])
            assert trace["onset"] == (None if math.isnan(causal) else int(causal))
    stats = result.summary["noise"]["all"]["ig_lens"]["mean_abs_diff"]
    shown = data["summary"]["noise"]["all"]["ig_lens"]["mean_abs_diff"]
    assert shown["n"] == stats["n"] > 0 and close_to(shown["mean"], stats["mean"])
    assert "<iframe" in result._repr_html_()


def test_restoration_page_leaves_out_untraced_facts(restoration_result):
    from dataclasses import replace

    probs = {c: v.copy() for c, v in restoration_result.probs.items()}
    probs["noise"][1] = float("nan")
    causal = {c: v.copy() for c, v in restoration_result.causal_onsets.items()}
    causal["noise"][1] = float("nan")
    result = replace(restoration_result, probs=probs, causal_onsets=causal)
    data = page_data(result_html(result))
    assert set(data["facts"][1]["traces"]) == {"counterfactual"}
    assert set(data["facts"][0]["traces"]) == {"noise", "counterfactual"}


@pytest.fixture
def map_result():
    return synthetic_result(5, 7, batch=2)


@pytest.mark.parametrize(
    "fixture",
    ["map_result", "comparison_result", "validation_result", "restoration_result"],
)
def test_fresh_and_loaded_results_render_alike(fixture, request, tmp_path):
    # A loaded result stores NaN as None (JSON has no NaN): the page is the same.
    result = request.getfixturevalue(fixture)
    result.save(tmp_path / "r.json")
    loaded = type(result).load(tmp_path / "r.json")
    assert result_html(loaded) == result_html(result)


def test_a_result_without_a_page_is_refused():
    from captum_iglens.viewer._payload import payload

    with pytest.raises(TypeError, match="result: expected a result with a viewer"):
        payload({"kind": "map"})


def test_validation_page_with_nan_summary_renders_fresh_and_loaded(
    validation_result, tmp_path
):
    """The tiny model never gives the facts' answers: the "correct" group is
    empty and its summary holds NaN, which must render the same after a load."""
    from captum_iglens.studies.validation import ValidationResult

    correct = validation_result.summary["correct"]["ig_lens"]
    assert any(
        isinstance(v, float) and math.isnan(v)
        for stat in correct.values()
        for v in (stat.values() if isinstance(stat, dict) else [stat])
    )
    validation_result.save(tmp_path / "v.json")
    loaded = ValidationResult.load(tmp_path / "v.json")
    pages = []
    for name, result in (("fresh", validation_result), ("loaded", loaded)):
        result.to_html(tmp_path / f"{name}.html")
        pages.append(page_data((tmp_path / f"{name}.html").read_text("utf-8")))
    assert pages[0]["summary"] == pages[1]["summary"]
    assert pages[0]["summary"]["correct"]["ig_lens"]["top1"]["n"] == 0


def test_learned_readout_rows_carry_the_lens_change_part(learned_result, tmp_path):
    learned_result.to_html(tmp_path / "l.html")
    data = page_data((tmp_path / "l.html").read_text(encoding="utf-8"))
    assert data["about"]["readout"].startswith(learned_result.readout_kind)
    for row, change in zip(data["sequences"][0]["rows"], learned_result.lens_change[0]):
        assert all(close_to(a, float(b)) for a, b in zip(row["change"], change))


def _neuron_names(blocks: int, neurons: int) -> list:
    names = []
    for b in range(blocks):
        names += [f"{b}.attn", *(f"{b}.mlp.n{i}" for i in range(neurons))]
        names.append(f"{b}.mlp.bias")
    return names


def test_page_groups_the_parts_of_each_segment():
    from captum_iglens.viewer._columns import column_groups

    groups = column_groups(_neuron_names(2, 40))
    assert [g["name"] for g in groups] == ["0.attn", "0.mlp", "1.attn", "1.mlp"]
    assert groups[1]["members"] == list(range(1, 42))
    assert groups[3]["members"] == list(range(43, 84))
    assert [g["foldable"] for g in groups] == [False, True, False, True]
    # 84 columns: the neuron groups open folded.
    assert [g["folded"] for g in groups] == [False, True, False, True]
    assert groups[1]["what"] == "40 neurons, bias" and groups[0]["what"] == ""
    experts = ["input", "0.attn", "0.mlp.e0", "0.mlp.e1", "0.mlp.shared"]
    groups = column_groups(experts)
    assert [g["members"] for g in groups] == [[0], [1], [2, 3, 4]]
    assert groups[2]["what"] == "2 experts, shared experts"
    assert not groups[2]["folded"]  # few columns: open unfolded
    heads = ["input", "0.attn.h0", "0.attn.h1", "0.attn.bias", "0.mlp"]
    assert [g["name"] for g in column_groups(heads)] == [
        "input",
        "0.attn",
        "0.mlp",
    ]
    # Per-source parts always open folded (the source panel shows them).
    sources = ["input", "0.attn.h0.s0", "0.attn.h0.s1", "0.attn.bias", "0.mlp"]
    (_, attention, _) = column_groups(sources)
    assert attention["folded"] and attention["what"] == "2 source parts, bias"


def test_map_and_batch_pages_carry_the_groups(batch_dir):
    result = synthetic_result(2, 84, layer_names=_neuron_names(2, 40), top_k=None)
    data = page_data(result_html(result))
    assert [g["name"] for g in data["groups"]] == ["0.attn", "0.mlp", "1.attn", "1.mlp"]
    batch = page_data(write_html(batch_dir).read_text(encoding="utf-8"))
    assert [g["members"] for g in batch["groups"]] == [
        [j] for j in range(len(batch["layers"]))
    ]


def test_the_script_reads_no_column_names():
    # The groups come made from Python: no name pattern in the script.
    from captum_iglens.viewer._page import _static

    script = _static("viewer.js")
    for pattern in ("attn", "mlp.", "h\\d", "s\\d", "n\\d", "e\\d", "bias)"):
        assert pattern not in script
