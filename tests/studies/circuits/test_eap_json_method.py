"""``--methods eap-json:PATH``: an EAP-IG graph file, written here by hand in
EAP-IG's documented format (names built by this test, not by the package),
is scored as a method: a file holding EAP's scores gives EAP's curve, CPR and
CMD; a changed file is scored again, never resumed; a file of another model
is refused in one line naming the field."""

import json
import math

import pytest
import torch

from captum_iglens.cli import main


def _eap_names(n_layers, n_heads):
    """EAP-IG's senders and receivers, in the (S, R) order the harness
    documents: senders input, then per layer its heads and MLP; receivers per
    layer every head's <q>, then <k>, then <v>, then the MLP; last logits."""
    senders, receivers = ["input"], []
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        receivers += [f"{head}<{kind}>" for kind in "qkv" for head in heads]
        receivers.append(f"m{layer}")
        senders += heads + [f"m{layer}"]
    return senders, receivers + ["logits"]


def _is_edge(sender, receiver):
    """EAP-IG's edges of sequential blocks: a head reads every earlier block's
    writes; an MLP also its own block's heads; logits everything."""
    if receiver == "logits" or sender == "input":
        return True
    layer = int(sender.split(".")[0][1:])  # "a3.h1" or "m3" -> 3
    reader = int(receiver.split(".")[0][1:].split("<")[0])
    if receiver.startswith("m"):
        return layer < reader or (layer == reader and sender.startswith("a"))
    return layer < reader


def _document(folder, scores):
    """The EAP-IG JSON object of an (S, R) score tensor for the tiny model."""
    config = json.loads((folder / "config.json").read_text())
    n_layers, n_heads = config["num_hidden_layers"], config["num_attention_heads"]
    senders, receivers = _eap_names(n_layers, n_heads)
    assert tuple(scores.shape) == (len(senders), len(receivers))
    edges = {
        f"{u}->{w}": {"score": float(scores[s, r]), "in_graph": False}
        for s, u in enumerate(senders)
        for r, w in enumerate(receivers)
        if _is_edge(u, w)
    }
    nodes = {name: {"in_graph": False} for name in senders + ["logits"]}
    cfg = dict(
        n_layers=n_layers,
        n_heads=n_heads,
        parallel_attn_mlp=False,
        d_model=config["hidden_size"],
    )
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def _write(path, document):
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def eap_run(tmp_path_factory, tiny_folder):
    """A task of two pairs, and EAP's record and result on it."""
    folder, pair = tiny_folder
    tmp = tmp_path_factory.mktemp("eap")
    task = tmp / "task.jsonl"
    other = next(f"t{i}" for i in range(4, 10) if f"t{i}" not in pair.values())
    rows = [pair, dict(pair, foil=other)]  # two pairs: another foil
    task.write_text("".join(json.dumps(p) + "\n" for p in rows), encoding="utf-8")
    common = ["circuits", "--task", str(task), "--model", str(folder)]
    common += ["--pairs", "2", "--bootstrap", "20"]
    assert main([*common, "--methods", "eap", "--out", str(tmp / "eap")]) == 0
    scores = torch.load(tmp / "eap" / "methods" / "eap.pt", weights_only=True)
    return folder, tmp, common, scores


def test_a_file_of_eaps_scores_gives_eaps_curve(eap_run, capsys):
    folder, tmp, common, scores = eap_run
    path = _write(tmp / "eap:copy.json", _document(folder, scores))
    method = f"eap-json:{path}"  # the path holds a ':'
    out, result = tmp / "both", tmp / "both.json"
    command = [*common, "--methods", f"eap,{method}", "--out", str(out)]
    assert main([*command, "--json", str(result)]) == 0
    curves = json.loads(result.read_text())["curves"]
    assert [c["method"] for c in curves] == ["eap", method]
    for key in ("f", "f_abs", "cpr", "cmd", "n_edges"):
        assert curves[0][key] == curves[1][key], key
    capsys.readouterr()
    assert main(command) == 0
    assert f"{method}: resumed" in capsys.readouterr().err
    _write(tmp / "eap:copy.json", _document(folder, -scores))  # the file changes
    assert main([*command, "--json", str(result)]) == 0
    err = capsys.readouterr().err
    assert f"{method}: score" in err and "eap: resumed" in err
    curves = json.loads(result.read_text())["curves"]
    assert curves[0]["cpr"] != curves[1]["cpr"]  # the new file's ranking


def test_the_files_scores_land_on_their_edges(eap_run, capsys):
    """One edge hugely scored is the best: the saved scores are the file's,
    edge by edge, and the file's top edge is the method's."""
    folder, tmp, common, scores = eap_run
    generator = torch.Generator().manual_seed(1)
    made = torch.rand(scores.shape, generator=generator, dtype=torch.float64)
    senders, receivers = _eap_names(2, 4)
    top = (senders.index("a1.h2"), receivers.index("logits"))
    made[top] = 1e6
    path = _write(tmp / "made.json", _document(folder, made))
    out = tmp / "made"
    assert main([*common, "--methods", f"eap-json:{path}", "--out", str(out)]) == 0
    (saved,) = (out / "methods").glob("eap-json-*.pt")
    got = torch.load(saved, weights_only=True)
    legal = torch.tensor(
        [[_is_edge(u, w) for w in receivers] for u in senders], dtype=torch.bool
    )
    assert torch.equal(got[legal], made[legal])
    assert torch.isnan(got[~legal]).all()
    best = got.nan_to_num(-math.inf).reshape(-1).argmax()
    assert divmod(int(best), len(receivers)) == top


def _error(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    err = [line for line in err if "warning" not in line]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda d: d["cfg"].update(n_layers=3),
            "cfg.n_layers is 3, but the model has 2",
        ),
        (lambda d: d["cfg"].update(d_model=7), "cfg.d_model is 7, but the model has"),
        (lambda d: d["edges"].pop("a0.h1->m0"), "1 of the model's 110 edges missing"),
        (
            lambda d: d["edges"].update({"a1.h0->a0.h0<q>": {"score": 1.0}}),
            "1 edges the model's graph does not have, e.g. 'a1.h0->a0.h0<q>'",
        ),
        (
            lambda d: d["edges"]["m0->logits"].update(score=float("nan")),
            "edges['m0->logits'].score is not finite",
        ),
    ],
)
def test_a_file_of_another_graph_is_refused_in_one_line(
    eap_run, capsys, change, expected
):
    folder, tmp, common, scores = eap_run
    document = _document(folder, scores)
    change(document)
    path = _write(tmp / "bad.json", document)
    capsys.readouterr()
    assert main([*common, "--methods", f"eap,eap-json:{path}"]) == 2
    line = _error(capsys)
    assert line.startswith("captum-iglens") and f"--methods: {path}: " in line
    assert expected in line


def test_a_missing_file_or_path_is_refused_before_loading(tmp_path, capsys):
    task = tmp_path / "task.jsonl"
    task.write_text(
        json.dumps({"clean": "a", "counterfactual": "b", "answer": " c", "foil": " d"})
        + "\n"
    )
    common = ["circuits", "--task", str(task), "--model", "/nonexistent"]
    missing = tmp_path / "none.json"
    assert main([*common, "--methods", f"eap-json:{missing}"]) == 2
    assert f"--methods: eap-json:{missing}: no readable file" in _error(capsys)
    assert main([*common, "--methods", "eap-json"]) == 2
    assert "--methods: eap-json scores a file, expected eap-json:PATH" in _error(capsys)
