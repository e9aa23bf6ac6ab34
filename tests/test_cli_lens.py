"""``--lens``: a tuned-lens folder read by the attribute command, checked before
the model loads (the folder) and before any forward (the model)."""

import pytest
import torch
from captum_iglens import IGLensResult
from captum_iglens.cli import main
from captum_iglens.hf import model_parts
from captum_iglens.readout.translators import Translators, unembedding_hash
from tests.helpers import word_tokenizer
from tests.tiny_models import HIDDEN, tiny_model


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    tiny_model("llama").save_pretrained(folder)
    word_tokenizer(128).save_pretrained(folder)
    return folder


def _lens(folder, n_layers=2, d=HIDDEN, **meta):
    g = torch.Generator().manual_seed(0)
    t = Translators(
        0.3 * torch.randn(n_layers, d, d, generator=g),
        0.3 * torch.randn(n_layers, d, generator=g),
        **meta,
    )
    return t.save(folder)


@pytest.mark.parametrize("granularity", ["block", "head"])
def test_a_lens_folder_splits_the_credits(tmp_path, model_folder, capsys, granularity):
    own = unembedding_hash(model_parts(tiny_model("llama")).head)
    lens = _lens(tmp_path / "lens", unembed_sha256=own)
    out = tmp_path / "r.json"
    args = ["w5 w6", "--model", str(model_folder), "--no-chat", "--max-new-tokens"]
    args += ["3", "--granularity", granularity]
    assert main([*args, "--lens", str(lens), "--json", str(out)]) == 0
    assert "lens-change part (tuned readout" in capsys.readouterr().out
    result = IGLensResult.load(out)
    assert result.readout_kind == "tuned"
    assert result.readout_checksum == Translators.load(lens).checksum()
    change = result.model_prob - result.base_prob
    parts = result.block_part.sum(-1) + result.lens_change.sum(-1)
    assert (parts - change).abs().max() <= 1e-6


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "is not a folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "has no params.pt"),
        (lambda p: p, "has no params.pt"),
    ],
)
def test_a_bad_lens_folder_is_refused_before_the_model_loads(
    tmp_path, make, message, capsys, monkeypatch
):
    import captum_iglens.hf.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --lens was checked")

    monkeypatch.setattr(models, "load_embedded", no_model)
    monkeypatch.setattr(models, "load_model", no_model)
    status = main(["x", "--lens", str(make(tmp_path))])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert err.startswith("captum-iglens: error: --lens:") and message in err


def test_another_models_lens_is_refused_before_any_forward(
    tmp_path, model_folder, capsys, monkeypatch
):
    import captum_iglens.attr as attr

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran before the lens was checked")

    monkeypatch.setattr(attr, "attribute_text", no_forward)
    lens = _lens(tmp_path / "lens", n_layers=3)
    status = main(["w5", "--model", str(model_folder), "--lens", str(lens)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert "3 blocks, but this model has" in err


@pytest.mark.slow
def test_linear_fits_the_models_lens_once_then_reads_the_cache(
    tmp_path, model_folder, capsys, monkeypatch
):
    import captum_iglens.lens_fit.fit as fit
    from captum_iglens.hf.checksum import weights_checksum
    from captum_iglens.lens_fit import lens_cache_folder

    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    args = ["w5 w6", "--model", str(model_folder), "--no-chat", "--max-new-tokens"]
    args += ["2", "--lens", "linear", "--json", str(out)]
    assert main(args) == 0
    cached = lens_cache_folder(weights_checksum(tiny_model("llama")))
    assert (cached / "params.pt").is_file() and (cached / "fit_report.json").is_file()
    first = IGLensResult.load(out)
    assert first.readout_checksum == Translators.load(cached).checksum()
    change = first.model_prob - first.base_prob
    parts = first.block_part.sum(-1) + first.lens_change.sum(-1)
    assert (parts - change).abs().max() <= 1e-6

    def no_fit(*args, **kwargs):
        raise AssertionError("the cached lens was fitted again")

    monkeypatch.setattr(fit, "fit_lens", no_fit)
    capsys.readouterr()
    assert main(args) == 0
    assert IGLensResult.load(out).readout_checksum == first.readout_checksum


def test_a_lens_with_a_granularity_it_cannot_split_is_refused_before_loading(
    tmp_path, capsys, monkeypatch
):
    import captum_iglens.hf.models as models
    from captum_iglens.attr.granularities import GRANULARITIES, Blocks

    class Unplaced(Blocks):  # a granularity no learned readout can split
        name = "unplaced"
        learned_readout = False

    granularity = Unplaced.name
    monkeypatch.setitem(GRANULARITIES, granularity, Unplaced)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --granularity was checked")

    monkeypatch.setattr(models, "load_embedded", no_model)
    monkeypatch.setattr(models, "load_model", no_model)
    lens = _lens(tmp_path / "lens")
    status = main(["x", "--lens", str(lens), "--granularity", granularity])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("captum-iglens: error: --granularity:")
    assert "'block'" in err and "'sublayer'" in err


def test_the_granularities_a_lens_takes_are_those_with_blocks():
    from captum_iglens.attr import LayerIGLens
    from captum_iglens.attr.granularities import GRANULARITIES

    lens = LayerIGLens.from_model(tiny_model("llama"))
    for name, kind in GRANULARITIES.items():
        shape = lens._granularity(name)
        try:
            shape.path_points()
        except ValueError:
            pass  # e.g. experts on a dense model: refused anyway
        blocks = shape.column_blocks() or shape.segment_blocks()
        assert kind.learned_readout == (blocks is not None), name


def test_batch_takes_a_lens_folder_and_refuses_a_rerun_without_it(
    tmp_path, model_folder, capsys
):
    import json

    own = unembedding_hash(model_parts(tiny_model("llama")).head)
    lens = _lens(tmp_path / "lens", unembed_sha256=own)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "w5 w6", "answer": "w7 w8"}\n')
    args = ["batch", str(prompts), "--out", str(tmp_path / "out"), "--quiet"]
    args += ["--model", str(model_folder), "--no-chat"]
    assert main([*args, "--lens", str(lens)]) == 0
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["readout"]["checksum"] == Translators.load(lens).checksum()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "other readout" in err


@pytest.mark.parametrize(
    "command, extra",
    [
        ([], ["x"]),
        (["batch"], ["prompts.jsonl", "--out", "out"]),
        (["validate"], ["--test", "restoration"]),
    ],
)
def test_a_lens_with_the_joint_path_is_refused_before_loading(
    tmp_path, capsys, monkeypatch, command, extra
):
    import captum_iglens.hf.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --path was checked")

    monkeypatch.setattr(models, "load_embedded", no_model)
    monkeypatch.setattr(models, "load_model", no_model)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"id": 1, "prompt": "x"}\n')
    args = [*command, *extra, "--lens", "linear", "--path", "joint"]
    status = main(args)
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("captum-iglens: error: --lens:") and "joint" in err
