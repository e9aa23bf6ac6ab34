"""A model dispatched with accelerate's device_map (CPU and disk here, blocks,
norm and head offloaded): the same map, no hook left behind."""

import json

import pytest
import torch
from accelerate import cpu_offload, dispatch_model

from captum_iglens import LayerIGLens
from tests.helpers import hook_snapshot, left_padded, word_tokenizer
from tests.tiny_models import VOCAB, tiny_model


def test_device_map_model_gives_the_same_map():
    reference = tiny_model("llama")
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.norm": "cpu",
        "lm_head": "cpu",
    }
    # force_hooks: accelerate's device-alignment hooks even on one device, as a
    # real multi-device map installs them.
    sharded = dispatch_model(tiny_model("llama"), device_map, force_hooks=True)
    assert hasattr(sharded.model.layers[0], "_hf_hook")
    ids, mask = left_padded([6, 4], VOCAB)
    expected = LayerIGLens.from_model(reference).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    hooks = hook_snapshot(sharded)
    result = LayerIGLens.from_model(sharded).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    assert hook_snapshot(sharded) == hooks
    assert result.delta.abs().max() <= 1e-6
    assert torch.allclose(result.attributions, expected.attributions, atol=1e-6)


OFFLOADED = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "disk",
    "model.layers.1": "cpu",
    "model.norm": "disk",
    "lm_head": "disk",
}


@pytest.mark.parametrize("granularity", ["block", "head", "source", "neuron"])
def test_offloaded_blocks_norm_and_head_give_the_same_map(granularity, tmp_path):
    # accelerate keeps the first block, the final norm and the head on disk (their
    # parameters on the meta device between calls) and the rest on the CPU
    reference = tiny_model("llama")
    sharded = dispatch_model(
        tiny_model("llama"), OFFLOADED, main_device="cpu", offload_dir=str(tmp_path)
    )
    assert sharded.lm_head.weight.is_meta
    assert sharded.model.layers[0].self_attn.o_proj.weight.is_meta
    ids, mask = left_padded([6, 4], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), granularity=granularity, n_steps=4)
    expected = LayerIGLens.from_model(reference).attribute_map(ids, **kwargs)
    hooks = hook_snapshot(sharded)
    result = LayerIGLens.from_model(sharded).attribute_map(ids, **kwargs)
    assert hook_snapshot(sharded) == hooks
    assert sharded.lm_head.weight.is_meta  # offloaded again after the call
    assert result.layer_names == expected.layer_names
    torch.testing.assert_close(result.attributions, expected.attributions)
    assert result.delta.abs().max() <= 1e-6


def test_cpu_offload_gives_the_same_map():
    # every weight kept in accelerate's CPU store, loaded for each module's call
    reference = tiny_model("llama")
    offloaded = cpu_offload(tiny_model("llama"), execution_device="cpu")
    assert offloaded.model.layers[1].mlp.down_proj.weight.is_meta
    ids, mask = left_padded([6, 4], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), granularity="head", n_steps=4)
    expected = LayerIGLens.from_model(reference).attribute_map(ids, **kwargs)
    result = LayerIGLens.from_model(offloaded).attribute_map(ids, **kwargs)
    torch.testing.assert_close(result.attributions, expected.attributions)


def test_load_model_with_a_device_map(tmp_path):
    from captum_iglens.hf.models import load_model

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    reference, _ = load_model(tmp_path)
    placement = {**OFFLOADED, "model.layers.0": "cpu"}
    model, _ = load_model(tmp_path, device_map=placement)
    assert model.hf_device_map == placement
    assert model.lm_head.weight.is_meta
    ids, mask = left_padded([6, 4], VOCAB)
    expected = LayerIGLens.from_model(reference).attribute_map(ids)
    result = LayerIGLens.from_model(model).attribute_map(ids)
    torch.testing.assert_close(result.attributions, expected.attributions)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(device_map="everywhere"), ValueError, "device_map: expected one of"),
        (dict(device_map=["cpu"]), TypeError, "device_map: expected a strategy"),
        (dict(device_map="auto", device="cpu"), ValueError, "either device"),
        # Issue 48: each value checked before the load, in one line.
        (dict(device_map={"": None}), ValueError, "'' maps to None; expected 'cpu'"),
        (dict(device_map={"model": "gpu7"}), ValueError, "'model' maps to 'gpu7'"),
        (dict(device_map={"": "cuda:99"}), ValueError, "'' maps to 'cuda:99'"),
        (dict(device_map={"": 99}), ValueError, "'' maps to 99"),
        (dict(device_map={"": True}), ValueError, "'' maps to True"),
        (dict(device_map={"": "meta"}), ValueError, "'' maps to 'meta'"),
        (dict(device_map={"": "disk"}), ValueError, "every module is mapped to 'disk'"),
        (dict(device_map={0: "cpu"}), TypeError, "module names .str. as keys"),
    ],
)
def test_load_model_refuses_a_bad_device_map(kwargs, error, match, tmp_path):
    from captum_iglens.hf.models import load_model

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    with pytest.raises(error, match=match) as raised:
        load_model(tmp_path, **kwargs)
    assert "\n" not in str(raised.value)


def test_an_offload_folder_that_is_a_file_is_named(tmp_path, monkeypatch):
    # Issue 48: a raw NotADirectoryError after the load; now before it, saying why.
    from captum_iglens.hf.models import load_model

    tiny_model("llama").save_pretrained(tmp_path / "model")
    word_tokenizer(VOCAB).save_pretrained(tmp_path / "model")
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "offload").write_text("not a folder")
    placement = {**OFFLOADED, "model.layers.0": "cpu"}
    with pytest.raises(ValueError, match=r"offload folder .*cache/offload.* is a file"):
        load_model(tmp_path / "model", device_map=placement)


def test_cli_device_map_file(tmp_path, capsys):
    from captum_iglens.cli import main

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    placement = tmp_path / "map.json"
    placement.write_text(json.dumps(OFFLOADED), encoding="utf-8")
    out = tmp_path / "out.json"
    args = ["w5 w6", "--model", str(tmp_path), "--no-chat", "--max-new-tokens", "2"]
    assert main([*args, "--device-map", str(placement), "--json", str(out)]) == 0
    sharded = json.loads(out.read_text(encoding="utf-8"))
    assert main([*args, "--json", str(out)]) == 0
    plain = json.loads(out.read_text(encoding="utf-8"))
    torch.testing.assert_close(
        torch.tensor(sharded["attributions"]), torch.tensor(plain["attributions"])
    )
    assert sharded["tokens"] == plain["tokens"]
    capsys.readouterr()
    assert main([*args, "--device-map", str(tmp_path / "missing.json")]) == 2
    assert "--device-map" in capsys.readouterr().err
    assert main([*args, "--device-map", "auto", "--device", "meta"]) == 2
    assert "either --device or --device-map" in capsys.readouterr().err
    # Issue 48: --device cpu is --device too; a value that is no device, at once.
    assert main([*args, "--device-map", "auto", "--device", "cpu"]) == 2
    assert "either --device or --device-map" in capsys.readouterr().err
    placement.write_text(json.dumps({"": "gpu7"}), encoding="utf-8")
    assert main([*args, "--device-map", str(placement)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("captum-iglens: error: --device-map: ")
    assert "'' maps to 'gpu7'" in err[-1] and "Traceback" not in " ".join(err)
