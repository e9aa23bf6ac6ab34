"""``captum-iglens fit-lens`` and ``validate --lens``: input errors in one line,
exit 2, before the model loads; a tiny model fitted end to end from the CLI."""

import json

import pytest
import torch

from captum_iglens.cli import main
from captum_iglens.readout.translators import Translators


def _no_model(monkeypatch):
    import captum_iglens.hf.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_embedded", no_model)
    monkeypatch.setattr(models, "load_model", no_model)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tokens", "1"], "--tokens: expected an int >= 2"),
        (["--eval-tokens", "0"], "--eval-tokens: expected an int >= 1"),
        (["--length", "1"], "--length: expected an int >= 2"),
        (["--ridge", "0"], "--ridge: expected a number > 0"),
        (["--ridge", "nan"], "--ridge: expected a number > 0"),
        (["--kl-steps", "-1"], "--kl-steps: expected an int >= 0"),
        (["--kl-lr", "-1"], "--kl-lr: expected a number > 0"),
        (["--curve", "10,x"], "--curve: expected comma-separated"),
        (["--curve", "99999"], "curve: expected sizes in"),
        (["--corpus", "/nonexistent.txt"], "--corpus: /nonexistent.txt is not a file"),
        (["--out", "/nonexistent/dir/lens"], "--out: the folder /nonexistent/dir"),
        (["--png", "/nonexistent/x.png"], "--png"),
    ],
)
def test_fit_lens_refuses_bad_options_before_loading(
    args, message, capsys, monkeypatch
):
    _no_model(monkeypatch)
    assert main(["fit-lens", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_fit_lens_refuses_a_malformed_corpus(tmp_path, capsys, monkeypatch):
    _no_model(monkeypatch)
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    assert main(["fit-lens", "--corpus", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    empty = tmp_path / "e.txt"
    empty.write_text("  \n")
    assert main(["fit-lens", "--corpus", str(empty)]) == 2
    assert "holds no text" in capsys.readouterr().err


def test_fit_lens_refuses_a_folder_that_is_not_a_lens(tmp_path, capsys, monkeypatch):
    _no_model(monkeypatch)
    (tmp_path / "other.txt").write_text("x")
    assert main(["fit-lens", "--out", str(tmp_path)]) == 2
    assert "holds no lens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lens", "/nonexistent"], "--lens: /nonexistent is not a folder"),
        (["--test", "ablation", "--lens", "."], "--lens: only validate --test"),
        (["--test", "ablation", "--noise-seeds", "1"], "--noise-seeds: only"),
        (["--methods", "ig_lens,fitted_lens"], "--methods: expected names"),
    ],
)
def test_validate_lens_refusals(args, message, capsys, monkeypatch):
    _no_model(monkeypatch)
    full = ["validate", *args]
    if "--test" not in args:
        full[1:1] = ["--test", "restoration"]
    assert main(full) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_fit_lens_end_to_end_on_a_tiny_model(tmp_path, capsys, monkeypatch):
    from tests.tiny_models import tiny_model, tiny_tokenizer

    folder = tmp_path / "model"
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lens"
    args = ["fit-lens", "--model", str(folder), "--out", str(out), "--quiet"]
    args += ["--tokens", "200", "--eval-tokens", "30", "--length", "16"]
    args += ["--batch", "8", "--curve", "100", "--json", str(tmp_path / "r.json")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "fitted KL below the logit lens's at" in printed
    lens = Translators.load(out)
    assert lens.n_layers == 2 and lens.d_model == 32
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["fit_tokens"] == 200
    assert (out / "fit_report.png").is_file()
    assert Translators.load(tmp_path / "lens-tokens100").n_layers == 2
    assert not torch.equal(lens.weight, Translators.identity(2, 32).weight)
