"""``captum-iglens circuits``: input errors are one line and exit status 2,
before the model runs; a small real run writes its outputs and resumes."""

import json

import pytest

from captum_iglens.cli import main

GOOD = {"clean": "a b", "counterfactual": "a c", "answer": " d", "foil": " e"}


def _task(tmp_path, lines):
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _error(capsys):
    err = [
        line for line in capsys.readouterr().err.splitlines() if "warning" not in line
    ]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--methods", "eap,nope"], "--methods: expected names from"),
        (["--methods", "eap:5"], "--methods: eap takes no step count"),
        (["--methods", "eap-ig-inputs:0"], "--methods: expected a positive step count"),
        (["--methods", "eap,eap"], "--methods: a method is named twice"),
        (["--pairs", "0"], "--pairs: expected an int >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_before_loading(tmp_path, capsys, options, expected):
    task = _task(tmp_path, [json.dumps(GOOD)])
    assert main(["circuits", "--task", task, "--model", "/nonexistent", *options]) == 2
    assert expected in _error(capsys)


def test_a_bad_task_line_is_refused_by_number_before_loading(tmp_path, capsys):
    task = _task(tmp_path, [json.dumps(GOOD), json.dumps(dict(GOOD, foil=" d"))])
    assert main(["circuits", "--task", task, "--model", "/nonexistent"]) == 2
    assert "task.jsonl:2: 'answer' and 'foil' are the same text" in _error(capsys)
    assert main(["circuits", "--task", "no-such-task", "--model", "/nonexistent"]) == 2
    assert "--task: no such file: no-such-task" in _error(capsys)


@pytest.mark.real_model
def test_unequal_lengths_are_refused_before_any_forward(tmp_path, capsys):
    lines = [json.dumps(GOOD), json.dumps(dict(GOOD, counterfactual="a c c c"))]
    assert main(["circuits", "--task", _task(tmp_path, lines)]) == 2
    assert "--task: line 2: the clean prompt has" in _error(capsys)


def test_a_user_task_runs_end_to_end_and_resumes(tmp_path, capsys, tiny_folder):
    folder, pair = tiny_folder
    task = _task(tmp_path, [json.dumps(pair)] * 3)
    out, page = tmp_path / "out", tmp_path / "c.html"
    common = ["circuits", "--task", task, "--model", str(folder), "--pairs", "3"]
    common += ["--methods", "random,eap,flow:2", "--bootstrap", "20"]
    outputs = ["--json", str(tmp_path / "c.json"), "--html", str(page)]
    assert main([*common, "--out", str(out), *outputs]) == 0
    printed = capsys.readouterr()
    assert "pairs 3, kept 3, prefers foil 0, scored 3" in printed.out
    assert "CPR" in printed.out
    assert "Spearman" not in printed.out  # no patching method, no correlation
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["counts"]["kept"] == 3 and [c["method"] for c in data["curves"]] == [
        "random",
        "eap",
        "flow:2",
    ]
    for c in data["curves"]:  # every edge kept: the model itself
        assert c["f"][-1] == pytest.approx(1.0, abs=1e-4)
    flow = json.loads((out / "methods" / "flow-2.json").read_text())
    assert flow["curve"]["cmd"] <= data["curves"][0]["cmd"]  # beats random
    assert "<img" in page.read_text()
    assert main([*common, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "random: resumed" in err and "eap: resumed" in err
    assert "flow:2: resumed" in err
    assert main([*common, "--out", str(out), "--metric", "prob"]) == 2
    assert "holds a run with another metric" in _error(capsys)


def test_the_lifted_node_maps_run_end_to_end(tmp_path, capsys, tiny_folder):
    folder, pair = tiny_folder
    task = _task(tmp_path, [json.dumps(pair)] * 2)
    out = tmp_path / "out"
    command = ["circuits", "--task", task, "--model", str(folder), "--pairs", "2"]
    command += ["--methods", "joint,telescoping", "--bootstrap", "20"]
    command += ["--out", str(out), "--json", str(tmp_path / "c.json")]
    assert main(command) == 0
    printed = capsys.readouterr()
    assert "joint: score" in printed.err and "telescoping: score" in printed.err
    data = json.loads((tmp_path / "c.json").read_text())
    assert [c["method"] for c in data["curves"]] == ["joint", "telescoping"]
    for c in data["curves"]:  # every edge kept: the model itself
        assert c["f"][-1] == pytest.approx(1.0, abs=1e-4)
    for name in ("joint", "telescoping"):
        assert (out / "methods" / f"{name}.pt").exists()
    assert main(command) == 0
    err = capsys.readouterr().err
    assert "joint: resumed" in err and "telescoping: resumed" in err


def test_both_ground_truths_are_correlated_end_to_end(tmp_path, capsys, tiny_folder):
    """Each ground truth is compared its own way: single-edge patching on its
    sampled edges, node patching on each sender's total over its out-edges
    (checked against scipy on the saved scores)."""
    import torch
    from scipy.stats import spearmanr

    from captum_iglens.graph.circuit import legal_edges
    from captum_iglens.graph.model_graph import model_graph

    folder, pair = tiny_folder
    task = _task(tmp_path, [json.dumps(pair)] * 2)
    out = tmp_path / "out"
    command = ["circuits", "--task", task, "--model", str(folder), "--pairs", "2"]
    command += ["--methods", "eap,random,patching-nodes,patching", "--sample", "30"]
    command += ["--bootstrap", "20", "--out", str(out)]
    command += ["--json", str(tmp_path / "c.json")]
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert "Spearman with patching-nodes: eap" in printed
    assert "Spearman with patching: random" in printed
    data = json.loads((tmp_path / "c.json").read_text())
    assert [c["method"] for c in data["curves"]] == ["eap", "random"]
    saved = {
        name: torch.load(out / "methods" / f"{name}.pt", weights_only=True)
        for name in ("eap", "random", "patching-nodes", "patching")
    }
    legal = legal_edges(model_graph(2, 4))
    assert legal.shape == saved["eap"].shape

    def totals(x):
        return torch.where(legal, x, 0.0).sum(1).numpy()

    sampled = torch.isfinite(saved["patching"])
    assert int(sampled.sum()) == 30
    for name in ("eap", "random"):
        nodes = spearmanr(totals(saved[name]), totals(saved["patching-nodes"]))[0]
        edges = spearmanr(
            saved[name][sampled].numpy(), saved["patching"][sampled].numpy()
        )[0]
        assert data["correlations"]["patching-nodes"][name] == pytest.approx(nodes)
        assert data["correlations"]["patching"][name] == pytest.approx(edges)
    assert data["correlations"]["patching-nodes"]["eap"] > 0.5  # first-order term
