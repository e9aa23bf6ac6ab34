"""The model's files read before the load: the text model's settings of a
``config.json``, a multimodal one's ``text_config`` included."""

import json

import pytest

from captum_iglens.cli import main
from captum_iglens.hf.model_files import read_text_config

TEXT = {"num_hidden_layers": 3, "num_attention_heads": 2, "vocab_size": 50}


@pytest.mark.parametrize(
    "written, expected",
    [
        (TEXT, TEXT),
        ({"model_type": "gemma3", "text_config": TEXT}, TEXT),
        ({"model_type": "x", "text_config": None, **TEXT}, {**TEXT}),
        ([1, 2], None),
    ],
)
def test_the_text_models_settings(tmp_path, written, expected):
    (tmp_path / "config.json").write_text(json.dumps(written), encoding="utf-8")
    found = read_text_config(str(tmp_path))
    if expected is None:
        assert found is None
    else:
        assert {k: found[k] for k in TEXT} == expected


def test_an_unreadable_config_is_left_to_the_load(tmp_path):
    assert read_text_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    assert read_text_config(str(tmp_path)) is None


def test_a_multimodal_configs_blocks_are_checked_before_the_load(
    tmp_path, monkeypatch, capsys
):
    config = {"model_type": "gemma3", "text_config": TEXT}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    monkeypatch.setattr("captum_iglens.hf.models.load_model", _no_model)
    assert main(["x", "--model", str(tmp_path), "--layers", "0,5", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--layers: the model has 3 blocks" in err[0]


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded")
