"""``captum-iglens graph``: every option checked before the model loads, and
one real run that writes JSON, CSV and HTML."""

import csv
import json

import pytest

from captum_iglens.cli import main
from captum_iglens.attr.flow.graph import FlowGraph
from tests.viewer.test_html import page_data

PROMPT = "The capital of France is"
OTHER = "The capital of Italy is"


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded")


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--target-kind", "prob_diff"], "--foil: --target-kind 'prob_diff' needs"),
        (["--foil", " Rome"], "--foil: --target-kind 'prob' takes no foil"),
        (["--counterfactual", "  "], "--counterfactual: expected a non-empty"),
        (["--counterfactual", OTHER, "--baseline", "pad"], "--baseline: give either"),
        (["--json", "/no/such/folder/g.json"], "--json: the folder /no/such/folder"),
        (["--json", "same.json", "--csv", "same.json"], "--csv: the same path as"),
        (["--pairs-csv", "p.csv"], "--pairs-csv: needs --receiver-positions"),
        (["--eap-json", "g.json"], "--eap-json: EAP-IG's graph has separate query"),
        (
            ["--receiver-positions", "--pairs-csv", "/no/such/folder/p.csv"],
            "--pairs-csv: the folder /no/such/folder",
        ),
        (
            ["--receiver-positions", "--csv", "p.csv", "--pairs-csv", "p.csv"],
            "--pairs-csv: the same path as --csv",
        ),
        (["--n-steps", "100000"], "--n-steps: expected at most 1024, got 100000"),
        (["--device", "nonsense"], "--device: expected a torch device"),
        (["--device-map", "auto"], "--device-map: graph runs the model on one"),
        (
            ["--corrupt-subject", "France", "--counterfactual", OTHER],
            "--corrupt-subject: give either --counterfactual or --corrupt-subject",
        ),
        (
            ["--corrupt-subject", "France", "--baseline", "pad"],
            "--corrupt-subject: give either --baseline",
        ),
        (
            ["--corrupt-subject", "Spain"],
            "--corrupt-subject: 'Spain' is not in the prompt 'The capital of France",
        ),
        (["--corrupt-subject", " "], "--corrupt-subject: expected the subject's"),
        (
            ["--corrupt-subject", "France", "--target-kind", "prob_diff"],
            "--foil: --target-kind 'prob_diff' needs",
        ),
    ],
)
def test_options_checked_before_the_model_loads(
    monkeypatch, capsys, tmp_path, extra, named
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("captum_iglens.hf.models.load_embedded", _no_model)
    assert main(["graph", PROMPT, *extra]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--n-steps", "0"],
        ["--keep", "1.5"],
        ["--target-kind", "kl"],
        ["--max-chunk-mib", "0"],
        ["--internal-batch-size", "0"],
        ["--noise-seed", "-1"],
    ],
)
def test_argument_types_refused(monkeypatch, capsys, extra):
    monkeypatch.setattr("captum_iglens.hf.models.load_embedded", _no_model)
    with pytest.raises(SystemExit) as stop:
        main(["graph", PROMPT, *extra])
    assert stop.value.code == 2
    assert extra[0] in capsys.readouterr().err


@pytest.mark.real_model
def test_graph_writes_json_csv_html(tmp_path, capsys):
    out = [tmp_path / name for name in ("g.json", "g.csv", "g.html", "eap.json")]
    status = main(
        [
            "graph",
            PROMPT,
            "--counterfactual",
            OTHER,
            "--n-steps",
            "1",
            "--quiet",
            "--qkv",
            "--keep",
            "0.9",
            "--json",
            str(out[0]),
            "--csv",
            str(out[1]),
            "--html",
            str(out[2]),
            "--eap-json",
            str(out[3]),
            "--eap-score",
            "effect",
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "completeness: |Σ F(u->logits) - Δm|" in printed
    graph = FlowGraph.load(out[0])
    assert graph.counterfactual["kind"] == "prompt"
    assert graph.settings["pruned"] == {"keep": 0.9, "by": "share"}
    assert graph.completeness_error <= 1e-6 and graph.conservation_error <= 1e-6
    header = out[1].read_text().splitlines()[0]
    assert header == "edge,sender,receiver,flow,share,effect"
    page = page_data(out[2].read_text())
    kept = graph.edge_scores()
    assert page["kind"] == "graph" and len(page["edges"]["flow"]) == len(kept)
    assert json.loads(out[0].read_text())["kind"] == "flow_graph"
    eap = json.loads(out[3].read_text())["edges"]
    assert {name for name, edge in eap.items() if edge["in_graph"]} == set(kept)
    assert len(eap) == len(graph.edges) == 123_211
    effects = dict(zip(graph.edges, graph.effects.tolist()))
    assert {name: edge["score"] for name, edge in eap.items()} == effects


@pytest.mark.real_model
def test_counterfactual_of_another_length_is_refused(capsys):
    status = main(
        [
            "graph",
            PROMPT,
            "--counterfactual",
            "The capital of the United Kingdom is",
            "--quiet",
        ]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert "--counterfactual: 7 tokens, but the prompt has 5" in err


@pytest.mark.real_model
def test_the_counterfactual_is_stripped_as_the_prompt_is(capsys):
    argv = ["graph", PROMPT + " ", "--counterfactual", OTHER + " ", "--n-steps", "1"]
    assert main([*argv, "--quiet"]) == 0, capsys.readouterr().err


@pytest.mark.real_model
@pytest.mark.parametrize(
    "extra, named",
    [
        (["--position", "99"], "--position: expected an int in [-5, 5), got 99"),
        (["--target", " Parisian Frenchman"], "--target: ' Parisian Frenchman' is"),
        (
            ["--corrupt-subject", "France", "--noise-seed", "9" * 23],
            "--noise-seed: expected an int in [0, 2**63)",
        ),
    ],
)
def test_arguments_the_model_resolves_are_refused_before_the_job(capsys, extra, named):
    """Refused in one line after the load, before any path point runs."""
    assert main(["graph", PROMPT, "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.real_model
def test_graph_from_the_noised_subject(tmp_path, capsys):
    out = tmp_path / "g.json"
    argv = ["graph", PROMPT, "--corrupt-subject", "France", "--n-steps", "1"]
    status = main([*argv, "--max-chunk-mib", "1", "--quiet", "--json", str(out)])
    assert status == 0
    graph = FlowGraph.load(out)
    assert graph.counterfactual["kind"] == "subject_noise"
    assert graph.counterfactual["subject"] == "France"
    noised = graph.counterfactual["positions"]
    assert [graph.tokens[i] for i in noised] == [" France"]
    assert graph.completeness_error <= 1e-6 and graph.conservation_error <= 1e-6
    quiet = [i for i in range(len(graph.tokens)) if i not in noised]
    assert (graph.input_flows[quiet] == 0).all()


@pytest.mark.real_model
def test_batch_over_the_budget_is_refused(capsys):
    argv = ["graph", PROMPT, "--counterfactual", OTHER, "--quiet"]
    status = main([*argv, "--internal-batch-size", "4", "--max-chunk-mib", "1"])
    assert status == 2
    assert "--internal-batch-size: 4 path points need about" in capsys.readouterr().err


@pytest.mark.real_model
def test_graph_by_receiver_position(tmp_path, capsys):
    out, table = tmp_path / "g.json", tmp_path / "pairs.csv"
    argv = ["graph", PROMPT, "--counterfactual", OTHER, "--n-steps", "1"]
    argv += ["--receiver-positions", "--quiet", "--pairs-csv", str(table)]
    status = main([*argv, "--json", str(out)])
    assert status == 0
    assert "edge, by position (sender@s -> receiver@t)" in capsys.readouterr().out
    graph = FlowGraph.load(out)
    length = len(graph.tokens)
    assert graph.pair_flows.shape == (len(graph.edges), length, length)
    assert graph.completeness_error <= 1e-6 and graph.conservation_error <= 1e-6
    # the prompts differ at " France" alone: the input's flow leaves from there
    france = graph.tokens.index(" France")
    out_of_input = [i for i, e in enumerate(graph.edges) if e.startswith("input->")]
    others = [s for s in range(length) if s != france]
    assert (graph.pair_flows[out_of_input][:, others] == 0).all()
    assert abs(graph.pair_flows[out_of_input][:, france]).sum() > 0
    with open(table, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == int((graph.pair_flows != 0).sum())
    first = rows[0]
    e = graph.edges.index(first["edge"])
    s, t = int(first["sender_position"]), int(first["receiver_position"])
    assert float(first["flow"]) == graph.pair_flows[e, s, t]
    assert abs(graph.pair_flows[e, s, t]) == abs(graph.pair_flows).max()
    assert first["receiver_token"] == graph.tokens[t]


@pytest.mark.real_model
@pytest.mark.parametrize("model_files", [True, False])
def test_receiver_positions_over_the_memory_are_refused(
    monkeypatch, capsys, model_files
):
    """Before the model loads where its config and tokenizer files can be read;
    else once it has loaded, before it runs."""
    short = "captum_iglens.attr.flow.pair_memory.free_memory"
    monkeypatch.setattr(short, lambda: 2**20)
    if model_files:
        monkeypatch.setattr("captum_iglens.hf.models.load_embedded", _no_model)
    else:
        monkeypatch.setattr(
            "captum_iglens.hf.model_files.read_text_config", lambda m: None
        )
    argv = ["graph", PROMPT, "--counterfactual", OTHER, "--receiver-positions"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--receiver-positions: the flows by sender and receiver position" in err[0]
