"""``captum-iglens circuits``: input errors are one line and exit status 2,
before the model runs; a small real run writes its outputs and resumes."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import captum_iglens
from captum_iglens.cli import main
from tests.helpers import task_lines

GOOD = {"clean": "a b", "counterfactual": "a c", "answer": " d", "foil": " e"}
#: Runs the command, then prints which of torch and transformers it imported.
_IMPORTS = """
import sys
from captum_iglens.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(sorted({"torch", "transformers"} & set(sys.modules)))
sys.exit(code)
"""


def _task(tmp_path, lines):
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _distinct(pair, n):
    """``n`` distinct rows of ``pair``, each with another foil among t4-t9 (the
    tiny model prefers the answer to each)."""
    foils = [f"t{i}" for i in range(4, 10) if f"t{i}" != pair["answer"]]
    return [json.dumps(dict(pair, foil=foil)) for foil in foils[:n]]


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
        (
            ["--methods", "eap-ig-inputs,eap-ig-inputs:5"],
            "--methods: 'eap-ig-inputs' and 'eap-ig-inputs:5' are one method in",
        ),
        (
            ["--methods", "mean:eap+flow:4+effect,mean:effect:16+eap+flow:4"],
            "--methods: 'mean:eap+flow:4+effect' and 'mean:effect:16+eap+flow:4' are "
            "one method",
        ),
        (
            ["--methods", "search:flow,search:flow:16", "--train", "1"],
            "--methods: 'search:flow' and 'search:flow:16' are one method",
        ),
        (["--pairs", "0"], "--pairs: expected an int >= 1, got 0"),
        (
            ["--methods", "eap,effect:5000"],
            "--methods: effect:5000: expected at most 1024, got 5000",
        ),
        (
            ["--methods", "mean:eap+flow:2000"],
            "--methods: in 'mean:eap+flow:2000', flow:2000: expected at most 1024",
        ),
        (
            ["--methods", "eap,search:eap-ig-inputs:5"],
            "--methods: search:eap-ig-inputs:5 searches on training pairs apart from "
            "the scored ones; add --train N",
        ),
        (["--train", "0"], "--train: expected an int >= 1, got 0"),
        (
            ["--methods", "search:eap", "--pairs", "1", "--train", "1"],
            "--train: 1 training pairs apart from --pairs 1 need 2 pairs, and the "
            "task has 1; add pairs to the task file, or lower --pairs or --train",
        ),
        (
            ["--methods", "search:patching", "--train", "1"],
            "--methods: 'search:patching' starts from 'patching', a ground truth",
        ),
        (
            ["--methods", "flow:\u00b2"],
            "--methods: expected a positive step count in ASCII digits in "
            "'flow:\u00b2'",
        ),
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
    error = _error(capsys)
    assert "--task: no such file: no-such-task" in error
    assert "shipped task: ioi, greater-than, addition, facts" in error


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--task", "TASK", "--methods", "nope", "--model", "/nonexistent"],
        ["--task", "TASK", "--methods", "mean:eap+eap", "--model", "/nonexistent"],
        ["--task", "TASK", "--methods", "search:eap", "--model", "/nonexistent"],
        ["--task", "ioi", "--train", "90", "--generate", "100", "--model", "/x"],
    ],
)
def test_help_and_refusals_import_no_torch_and_answer_at_once(tmp_path, argv):
    task = _task(tmp_path, [json.dumps(GOOD)])
    root = str(Path(captum_iglens.__file__).parents[1])
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    argv = ["circuits", *(task if a == "TASK" else a for a in argv)]
    start = time.perf_counter()
    ran = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *argv], capture_output=True, text=True, env=env
    )
    seconds = time.perf_counter() - start
    assert ran.returncode == (0 if "--help" in argv else 2), ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]"  # neither torch nor transformers
    assert seconds < 2.0
    if "--help" in argv:
        assert "eap-ig-inputs[:STEPS, default 5]" in " ".join(ran.stdout.split())
        assert "mean:A+B[+C...]" in " ".join(ran.stdout.split())
        assert "search:METHOD" in " ".join(ran.stdout.split())
        assert "ioi" in ran.stdout
    else:
        assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"\xff\xfe{", "task.jsonl:1: not UTF-8 (byte 0 of the file is 0xff)"),
        (
            (json.dumps(GOOD) + "\n" + json.dumps(GOOD)).encode(),
            "task.jsonl: lines 1 and 2 are the same pair; remove the duplicates",
        ),
        (b"{" + b" " * 1_000_000 + b"}", "task.jsonl:1: a line longer than 1,000,000"),
        (None, "is a folder; expected a JSON Lines file"),
    ],
)
def test_bad_task_files_are_refused_before_loading(tmp_path, capsys, content, expected):
    task = tmp_path / "task.jsonl"
    task.mkdir() if content is None else task.write_bytes(content)
    assert main(["circuits", "--task", str(task), "--model", "/nonexistent"]) == 2
    assert expected in _error(capsys)


def _record(out, name, text=None, scores=True):
    """Writes a method's record in ``out``: its .json ``text`` (a valid one
    by default) and, with ``scores``, its .pt."""
    import torch

    methods = out / "methods"
    methods.mkdir(parents=True, exist_ok=True)
    record = dict(name=name, curve=None, seconds={})
    (methods / f"{name}.json").write_text(text or json.dumps(record))
    if scores:
        torch.save(torch.zeros(3, 2, dtype=torch.float64), methods / f"{name}.pt")
    return methods


@pytest.mark.parametrize(
    "corrupt, expected",
    [
        (lambda out: _record(out, "eap", "{oops"), "eap.json: not a JSON file"),
        (lambda out: _record(out, "eap"), "eap.json: expected the record of eap"),
        (
            lambda out: _record(out, "patching", scores=False),
            "patching.pt: missing, the scores of its .json",
        ),
        (
            lambda out: (
                lambda m: m.joinpath("patching.pt").write_bytes(
                    m.joinpath("patching.pt").read_bytes()[:-50]
                )
            )(_record(out, "patching")),
            "patching.pt: not a complete torch file",
        ),
    ],
)
def test_a_corrupt_record_is_refused_before_loading(
    tmp_path, capsys, corrupt, expected
):
    task, out = _task(tmp_path, [json.dumps(GOOD)]), tmp_path / "out"
    corrupt(out)
    command = ["circuits", "--task", task, "--model", "/nonexistent", "--out", str(out)]
    assert main([*command, "--methods", "eap,patching"]) == 2
    message = _error(capsys)
    assert expected in message and "to score" in message and "again" in message


def test_scores_of_another_shape_and_no_pair_left_are_one_line(
    tmp_path, capsys, tiny_folder
):
    folder, pair = tiny_folder
    task = _task(tmp_path, _distinct(pair, 2))
    out = tmp_path / "out"
    command = ["circuits", "--task", task, "--model", str(folder), "--out", str(out)]
    assert main([*command, "--methods", "random", "--bootstrap", "5"]) == 0
    capsys.readouterr()
    _record(out, "patching")  # (3, 2) scores: not the tiny model's graph
    assert main([*command, "--methods", "random,patching", "--bootstrap", "5"]) == 2
    assert "patching.pt: expected scores of shape (" in _error(capsys)
    swapped = [dict(pair, answer=pair["foil"], foil=pair["answer"])]
    task = _task(tmp_path, [json.dumps(swapped[0])])
    command = ["circuits", "--task", task, "--model", str(folder), "--bootstrap", "5"]
    assert main(command) == 2
    assert "--task: " in (message := _error(capsys))
    assert "0 of 1 pairs left to score (1 the model prefers the foil" in message


@pytest.mark.real_model
def test_unequal_lengths_are_refused_before_any_forward(tmp_path, capsys):
    lines = [json.dumps(GOOD), json.dumps(dict(GOOD, counterfactual="a c c c"))]
    assert main(["circuits", "--task", _task(tmp_path, lines)]) == 2
    assert "--task: line 2: the clean prompt has" in _error(capsys)


def test_a_user_task_runs_end_to_end_and_resumes(tmp_path, capsys, tiny_folder):
    folder, pair = tiny_folder
    task = _task(tmp_path, _distinct(pair, 3))
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
    task = _task(tmp_path, _distinct(pair, 2))
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
    task = _task(tmp_path, _distinct(pair, 2))
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


def test_a_search_trains_apart_records_the_split_and_resumes(
    tmp_path, capsys, tiny_folder
):
    folder, pair = tiny_folder
    task = _task(tmp_path, task_lines(folder, 8))
    out, page, result = tmp_path / "out", tmp_path / "c.html", tmp_path / "c.json"
    common = ["circuits", "--task", task, "--model", str(folder), "--pairs", "3"]
    common += ["--methods", "eap,search:eap", "--bootstrap", "20", "--train", "4"]
    assert (
        main([*common, "--out", str(out), "--json", str(result), "--html", str(page)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "scored 3, train 4" in printed
    assert (
        "3 pairs scored (the first filtered); every method found its circuits on 4 "
        "training pairs" in printed
    )
    data = json.loads(result.read_text())
    split = data["split"]
    assert split["test"] == [0, 1, 2] and len(split["train"]) == 4
    assert not set(split["train"]) & {0, 1, 2} and split["seed"] == 0
    assert data["options"]["train"] == 4
    assert data["options"]["circuits_found_on"] == "train"
    assert [c["method"] for c in data["curves"]] == ["eap", "search:eap"]
    assert data["curves"][1]["f"][-1] == pytest.approx(1.0, abs=1e-4)
    assert "search:eap" in data["best"] and "search:eap" in str(data["curves"])
    text = page.read_text()
    assert "found its circuits on 4 training pairs" in text
    assert "Searched (search:eap)" in text
    run = json.loads((out / "run.json").read_text())
    assert run["split"] == split
    assert main([*common, "--out", str(out)]) == 0
    assert "search:eap: resumed" in capsys.readouterr().err
    run["split"]["train"] = [3, 4, 5, 7]  # another split in the folder
    (out / "run.json").write_text(json.dumps(run))
    assert main([*common, "--out", str(out)]) == 2
    assert "holds a run with another split" in _error(capsys)
    assert main([*common, "--out", str(tmp_path / "o2"), "--train", "9"]) == 2
    assert "need 12 pairs, and the task has 8" in _error(capsys)
    del run["circuits_found_on"]  # a run that scored only its searches there
    run["split"] = split
    (out / "run.json").write_text(json.dumps(run))
    assert main([*common, "--out", str(out)]) == 2
    assert "holds a run with another circuits_found_on (None" in _error(capsys)
    alone = tmp_path / "eap.json"  # no search: eap is still found on the training pairs
    eap = [{"eap,search:eap": "eap"}.get(word, word) for word in common]
    assert main([*eap, "--json", str(alone)]) == 0
    found = json.loads(alone.read_text())["curves"][0]
    assert (found["f"], found["cpr"], found["cmd"]) == tuple(
        data["curves"][0][k] for k in ("f", "cpr", "cmd")
    )


def test_too_few_pairs_left_to_train_on_after_the_filter_is_one_line(
    tmp_path, capsys, tiny_folder
):
    folder, pair = tiny_folder
    task = _task(tmp_path, _distinct(pair, 3))  # one clean prompt, three foils
    command = ["circuits", "--task", task, "--model", str(folder), "--pairs", "1"]
    assert main([*command, "--train", "1", "--methods", "search:eap"]) == 2
    assert _error(capsys).endswith(
        "--train: 0 of the 3 kept pairs are left to train on apart from the 1 "
        "scored, 2 more share a prompt with one; expected 1; add pairs to the task "
        "file, or lower --pairs or --train"
    )


def test_a_folder_another_run_writes_is_refused_before_loading(tmp_path, capsys):
    import socket

    task, out = _task(tmp_path, [json.dumps(GOOD)]), tmp_path / "out"
    out.mkdir()
    holder = {"host": socket.gethostname(), "pid": os.getppid()}  # alive, not us
    (out / ".batch.lock").write_text(json.dumps(holder))
    command = ["circuits", "--task", task, "--model", "/nonexistent", "--out", str(out)]
    assert main(command) == 2
    assert f"--out: {out} is being written by another run (pid" in _error(capsys)
    assert (out / ".batch.lock").exists()


def test_a_refused_load_leaves_no_folder_and_no_lock(tmp_path, capsys):
    task, out = _task(tmp_path, [json.dumps(GOOD)]), tmp_path / "out"
    command = ["circuits", "--task", task, "--model", "/nonexistent", "--out", str(out)]
    assert main(command) == 2
    assert "--model: /nonexistent does not exist" in _error(capsys)
    assert not out.exists()
