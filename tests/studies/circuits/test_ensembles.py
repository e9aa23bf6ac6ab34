"""Ensembles of the circuit harness, ``mean:A+B[+C…]``: the form parsed and its
bad parts refused before the model loads; its scores the mean of its parts'
signed ranks of ``|score|`` over the edges (checked against scipy); a part the
run has scored is reused; a real run scores, saves and resumes it."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import rankdata
from transformers import AutoModelForCausalLM

from captum_iglens.cli import main
from captum_iglens.graph.circuit import edge_values
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.ensemble_scores import average_ranks
from captum_iglens.studies.circuits.methods import parse_method
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import SCORERS, ScoringContext
from captum_iglens.studies.circuits.study import method_scores
from tests.studies.circuits.test_cli_circuits import GOOD, _distinct, _error, _task
from tests.tiny_models import tiny_model


def test_an_average_is_parsed_into_its_parts():
    method = parse_method("mean:eap+eap-ig-inputs:7+effect")
    assert (method["name"], method["scorer"], method["steps"]) == (
        "mean:eap+eap-ig-inputs:7+effect",
        "mean",
        0,
    )
    parts = [(p["name"], p["scorer"], p["steps"]) for p in method["parts"]]
    assert parts == [
        ("eap", "eap", 0),
        ("eap-ig-inputs:7", "eap-ig-inputs", 7),
        ("effect", "effect", SCORERS["effect"].steps),
    ]
    assert parse_method("eap")["parts"] == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("mean", "--methods: mean averages two or more methods, expected mean:A+B"),
        ("mean:eap", "averages two or more methods, expected mean:A+B[+C...], got"),
        ("mean:eap+nope", "--methods: in 'mean:eap+nope', expected names from"),
        (
            "mean:eap+mean:random+flow",
            "--methods: 'mean:eap+mean:random+flow' holds the part 'mean:random', "
            "itself an average; list every part in one mean:A+B+...",
        ),
        ("mean:eap+eap", "--methods: 'mean:eap+eap' holds 'eap' twice; list each"),
        (
            "mean:eap-ig-inputs+eap-ig-inputs:5",
            "holds 'eap-ig-inputs:5' twice (as 'eap-ig-inputs' too); list each part",
        ),
        (
            "mean:eap+flow:0",
            "--methods: in 'mean:eap+flow:0', expected a positive step count in "
            "ASCII digits in 'flow:0'",
        ),
        ("mean:eap+random:3", "in 'mean:eap+random:3', random takes no step count"),
        ("mean:eap+patching", "holds the part 'patching', a ground truth"),
        ("mean:eap+eap-json:a.json", "holds the part 'eap-json:a.json', which reads"),
        ("mean:eap++random", "--methods: in 'mean:eap++random', expected names from"),
    ],
)
def test_bad_averages_are_refused_before_loading(tmp_path, capsys, text, expected):
    with pytest.raises(ValueError) as refused:
        parse_method(text)
    assert expected in str(refused.value)
    task = _task(tmp_path, [json.dumps(GOOD)])
    argv = ["circuits", "--task", task, "--model", "/nonexistent", "--methods", text]
    assert main(argv) == 2
    assert expected in _error(capsys)


def test_average_ranks_are_scipys():
    values = torch.tensor([0.5, 0.0, 2.0, 0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    expected = rankdata(values.numpy(), method="average")
    assert average_ranks(values).tolist() == expected.tolist()


@pytest.fixture(scope="module")
def bound():
    """The tiny Llama bound for the harness, and one batch of three pairs."""
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(4, 128, (3, 6), generator=generator)
    other = clean.clone()
    other[:, [1, 3]] = torch.randint(4, 128, (3, 2), generator=generator)
    answer, foil = torch.tensor([7, 9, 11]), torch.tensor([8, 10, 12])
    batch = Batch(clean, other, answer, foil, torch.arange(3))
    return CircuitModel(tiny_model("llama")), batch


def _expected(graph, parts):
    """The mean of the parts' ``sign(s) · rankdata(|s|) / E`` over the legal
    edges (scipy), 0 elsewhere."""
    total = np.zeros(graph.legal.shape)
    for scores in parts:
        values = edge_values(graph, scores).numpy()
        ranked = np.sign(values) * rankdata(np.abs(values)) / graph.n_edges
        matrix = np.zeros(graph.legal.shape)
        matrix[graph.edge_senders, graph.edge_receivers] = ranked
        total += matrix
    return total / len(parts)


def test_the_average_is_its_parts_signed_ranks_and_reuses_them(bound):
    model, batch = bound
    base = ScoringContext(model, None, [batch], 3, "logit_diff", seed=1)
    method = parse_method("mean:eap+eap-ig-inputs:2+random")
    parts = [
        SCORERS[p["scorer"]].function(
            ScoringContext(
                model, None, [batch], 3, "logit_diff", steps=p["steps"], seed=1
            )
        )
        for p in method["parts"]
    ]
    scored = {}
    scores, _ = method_scores(base, method, scored)
    assert scores.dtype == torch.float64 and bool(
        (scores[~model.graph.legal] == 0).all()
    )
    expected = _expected(model.graph, parts)
    np.testing.assert_allclose(scores.numpy(), expected, rtol=0, atol=1e-12)
    assert (scores.abs().max() <= 1) and not bool((scores < 0).all())
    assert [key[:2] for key in scored] == [
        ("eap", 0),
        ("eap-ig-inputs", 2),
        ("random", 0),
    ]
    flipped = -parts[0]  # a part already scored is reused, not scored again
    scored = {("eap", 0, None): (flipped, 4.0)}
    scores, seconds = method_scores(base, method, scored)
    again = _expected(model.graph, [flipped, *parts[1:]])
    np.testing.assert_allclose(scores.numpy(), again, rtol=0, atol=1e-12)
    assert seconds > 4.0  # its parts' seconds, the reused one's too


def test_an_average_runs_end_to_end_and_resumes(tmp_path, capsys, tiny_folder):
    folder, pair = tiny_folder
    task = _task(tmp_path, _distinct(pair, 2))
    out, result = tmp_path / "out", tmp_path / "c.json"
    command = ["circuits", "--task", task, "--model", str(folder), "--pairs", "2"]
    command += ["--methods", "eap,random,mean:eap+random", "--bootstrap", "20"]
    command += ["--out", str(out), "--json", str(result), "--seed", "3"]
    assert main(command) == 0
    printed = capsys.readouterr()
    assert "mean:eap+random: score" in printed.err
    assert "mean:eap+random" in printed.out.split("CPR")[1]
    data = json.loads(result.read_text())
    names = [c["method"] for c in data["curves"]]
    assert names == ["eap", "random", "mean:eap+random"]
    assert data["curves"][2]["f"][-1] == pytest.approx(1.0, abs=1e-4)
    assert "mean:eap+random" in data["best"]
    records = out / "methods"
    eap, rand, mean = (
        torch.load(records / f"{stem}.pt", weights_only=True)
        for stem in ("eap", "random", "mean-eap+random")
    )
    graph = CircuitModel(AutoModelForCausalLM.from_pretrained(folder)).graph
    expected = _expected(graph, [eap, rand])
    np.testing.assert_allclose(mean.numpy(), expected, rtol=0, atol=1e-12)
    first = {p.name: p.read_bytes() for p in records.iterdir()}
    assert main(command) == 0
    assert "mean:eap+random: resumed" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in records.iterdir()} == first
    resumed = json.loads(result.read_text())
    assert resumed["curves"] == data["curves"] and resumed["best"] == data["best"]
