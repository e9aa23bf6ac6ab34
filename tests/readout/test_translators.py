"""Translators and their tuned-lens folder; the per-layer readout built on them."""

import json

import pytest
import torch
from captum_iglens.hf import model_parts
from captum_iglens.readout.layer_readout import LayerReadout
from captum_iglens.readout.translators import (
    Translators,
    read_config,
    unembedding_hash,
)
from tests.tiny_models import HIDDEN, tiny_model


def _random(n_layers=2, d=HIDDEN, seed=0, bias=True, **meta):
    g = torch.Generator().manual_seed(seed)
    weight = 0.1 * torch.randn(n_layers, d, d, generator=g)
    b = 0.1 * torch.randn(n_layers, d, generator=g) if bias else None
    return Translators(weight, b, **meta)


def test_the_folder_has_the_tuned_lens_layout(tmp_path):
    t = _random(3, 8, base_model="org/model", unembed_sha256="abc")
    t.save(tmp_path / "lens")
    state = torch.load(tmp_path / "lens" / "params.pt", weights_only=True)
    expected = {f"{i}.{n}" for i in range(3) for n in ("weight", "bias")}
    assert set(state) == expected
    assert all(state[f"{i}.weight"].shape == (8, 8) for i in range(3))
    assert all(state[f"{i}.bias"].shape == (8,) for i in range(3))
    assert torch.equal(state["1.weight"], t.weight[1])
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert config["d_model"] == 8 and config["num_hidden_layers"] == 3
    assert config["bias"] is True and config["lens_type"] == "linear_tuned_lens"
    assert config["base_model_name_or_path"] == "org/model"
    # Nothing but the two files (no temporary file left behind).
    assert sorted(p.name for p in (tmp_path / "lens").iterdir()) == [
        "config.json",
        "params.pt",
    ]


def test_a_saved_folder_round_trips(tmp_path):
    t = _random(2, 8, seed=3, base_model="m", unembed_sha256="h", extra={"n": 5})
    back = Translators.load(t.save(tmp_path / "lens"))
    assert torch.equal(back.weight, t.weight) and torch.equal(back.bias, t.bias)
    assert (back.base_model, back.unembed_sha256, back.extra) == ("m", "h", {"n": 5})
    assert back.checksum() == t.checksum()
    no_bias = _random(2, 8, bias=False)
    back = Translators.load(no_bias.save(tmp_path / "nb"))
    assert not back.has_bias and back.bias.abs().sum() == 0


def test_a_tuned_lens_state_dict_from_linear_modules_loads(tmp_path):
    # The tuned-lens package saves a ModuleList of nn.Linear(d, d).
    linears = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
    (tmp_path / "tl").mkdir()
    torch.save(linears.state_dict(), tmp_path / "tl" / "params.pt")
    (tmp_path / "tl" / "config.json").write_text(
        json.dumps(
            dict(
                base_model_name_or_path="gpt2",
                d_model=8,
                num_hidden_layers=3,
                bias=True,
                base_model_revision=None,
                unembed_hash="x",
                lens_type="linear_tuned_lens",
            )
        )
    )
    t = Translators.load(tmp_path / "tl")
    h = torch.randn(5, 8)
    expected = h + linears[1](h)
    got = t(h, torch.full((5,), 1))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "params.pt").unlink(), "has no params.pt"),
        (lambda d: (d / "config.json").write_text("{"), "not JSON"),
        (lambda d: (d / "config.json").write_text('{"d_model": 8}'), "num_hidden"),
        (
            lambda d: (d / "config.json").write_text(
                '{"d_model": 8, "num_hidden_layers": 4}'
            ),
            "keys missing or extra",
        ),
        (
            lambda d: (d / "config.json").write_text(
                '{"d_model": 6, "num_hidden_layers": 2}'
            ),
            "should have shape",
        ),
        (lambda d: (d / "params.pt").write_bytes(b"junk"), "not a readable"),
    ],
)
def test_a_malformed_folder_is_refused(tmp_path, damage, message):
    folder = _random(2, 8).save(tmp_path / "lens")
    damage(folder)
    with pytest.raises(ValueError, match=message):
        Translators.load(folder)


def test_a_missing_folder_is_refused_cheaply(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        read_config(tmp_path / "nope")


def test_identity_and_translation():
    t = Translators.identity(3, 4)
    h = torch.randn(6, 4)
    assert torch.equal(t(h, torch.tensor([0, 1, 2, 3, 0, 3])), h)
    assert t.is_identity(0) and t.same(1, 3)
    r = _random(3, 4, seed=1)
    index = torch.tensor([0, 1, 2, 3, 1, 0])
    out = r(h, index)
    for row, i in enumerate(index.tolist()):
        want = h[row] if i == 3 else h[row] + r.weight[i] @ h[row] + r.bias[i]
        torch.testing.assert_close(out[row], want)
    assert not r.same(0, 1) and not r.same(0, 3)


def test_the_translation_is_differentiable():
    r = _random(2, 4)
    h = torch.randn(3, 4, requires_grad=True)
    r(h, torch.tensor([0, 1, 2])).sum().backward()
    expected = torch.stack(
        [1 + r.weight[0].sum(0), 1 + r.weight[1].sum(0), torch.ones(4)]
    )
    torch.testing.assert_close(h.grad, expected)


def _readout(model):
    parts = model_parts(model)
    return parts.readout(), parts.blocks


def test_a_checkpoint_for_another_model_is_refused_on_construction():
    readout, blocks = _readout(tiny_model("llama"))
    with pytest.raises(ValueError, match="d_model=16 and 2 blocks"):
        LayerReadout(readout, _random(2, 16), blocks)
    with pytest.raises(ValueError, match="3 blocks"):
        LayerReadout(readout, _random(3, HIDDEN), blocks)
    other = torch.nn.Linear(HIDDEN, readout.vocab_size, bias=False)
    made_for = unembedding_hash(other)
    with pytest.raises(ValueError, match="unembedding differs"):
        LayerReadout(readout, _random(2, unembed_sha256=made_for), blocks)
    own = unembedding_hash(readout.head)
    LayerReadout(readout, _random(2, unembed_sha256=own), blocks)  # accepted


def test_the_layer_readout_reads_each_state_through_its_translator():
    readout, blocks = _readout(tiny_model("llama"))
    t = _random(2)
    lr = LayerReadout(readout, t, blocks)
    h = torch.randn(4, HIDDEN)
    layer = torch.tensor([0, 1, 2, 1])
    expected = readout(t(h, layer))
    torch.testing.assert_close(lr(h, layer), expected)
    assert torch.equal(lr(h), readout(h))  # no layer: the model's own
    assert torch.equal(lr(h[2:3], layer[2:3]), readout(h[2:3]))  # state L
    assert lr.state_index(blocks[0]) == 1 and lr.state_index(blocks[1]) == 2


def test_the_same_model_in_another_dtype_is_refused_saying_so():
    model = tiny_model("llama")
    own = unembedding_hash(model_parts(model).head)  # fitted in float32
    readout, blocks = _readout(model.to(torch.bfloat16))
    with pytest.raises(ValueError, match="unembedding differs") as error:
        LayerReadout(readout, _random(2, unembed_sha256=own), blocks)
    assert "dtype" in str(error.value) and "float32" in str(error.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_new_parameters_are_used_after_a_cast_was_made(dtype):
    t = _random(2, 8)
    h = torch.randn(5, 8, dtype=dtype)
    index = torch.tensor([0, 1, 0, 1, 2])
    t(h, index)  # casts the parameters to h's dtype once
    fresh = _random(2, 8, seed=1)
    t.load_state_dict(fresh.state_dict())
    w, b = fresh.weight.to(dtype), fresh.bias.to(dtype)
    expected = h.clone()
    for i in (0, 1):
        rows = index == i
        expected[rows] = h[rows] + h[rows] @ w[i].T + b[i]
    torch.testing.assert_close(t(h, index), expected)


def test_lens_names_in_python():
    """ "logit" is the model's own readout; "linear" says how to get the cached
    fit's folder in Python."""
    from captum_iglens import LayerIGLens

    model = tiny_model("llama")
    ids = torch.randint(0, 50, (1, 4))
    plain = LayerIGLens.from_model(model).attribute_map(ids)
    named = LayerIGLens.from_model(model, lens="logit").attribute_map(ids)
    assert torch.equal(plain.attributions, named.attributions)
    assert named.readout_kind == "logit"
    with pytest.raises(ValueError, match="lens: 'linear'.*cached_lens"):
        LayerIGLens.from_model(model, lens="linear")


def test_the_readout_is_resolved_and_recorded_in_one_shape(tmp_path):
    from captum_iglens.readout.layer_readout import readout_record, resolve_readout

    readout, blocks = _readout(tiny_model("llama"))
    assert resolve_readout(readout, None, blocks) is readout
    assert resolve_readout(readout, "logit", blocks) is readout
    logit = {"kind": "logit", "checksum": None}
    assert readout_record(readout) == logit and readout_record(None) == logit
    t = _random(2)
    learned = resolve_readout(readout, t.save(tmp_path / "lens"), blocks)
    assert isinstance(learned, LayerReadout) and learned.base is readout
    assert readout_record(learned) == {"kind": learned.kind, "checksum": t.checksum()}
    assert learned.kind in ("linear", "tuned")
    with pytest.raises(ValueError, match="lens: 'linear'.*cached_lens"):
        resolve_readout(readout, "linear", blocks)


def test_what_is_not_a_lens_is_refused_naming_the_argument(llama):
    from captum_iglens import LayerIGLens, attribute_text
    from captum_iglens.readout.layer_readout import resolve_readout
    from tests.helpers import word_tokenizer

    parts = model_parts(llama)
    ig_lens = LayerIGLens.from_model(llama)
    for bad in (ig_lens, 3, object()):
        with pytest.raises(TypeError, match="lens: expected None, 'logit'"):
            resolve_readout(parts.readout(), bad, parts.blocks)
    tokenizer = word_tokenizer(llama.config.vocab_size)
    with pytest.raises(TypeError, match="passed as attribution="):
        attribute_text(llama, tokenizer, "w5 w6 w7", answer="w8", lens=ig_lens)
