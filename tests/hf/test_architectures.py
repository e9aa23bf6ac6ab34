"""The architecture registry: built-in entries, block selection, user registration."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, GPTBigCodeConfig

from captum_iglens import LayerIGLens, register_architecture
from captum_iglens.hf import model_parts, supported_model_types
from captum_iglens.hf.architectures import unregister_architecture
from captum_iglens.hf.table import NORM_KINDS
from captum_iglens.readout import Softcap
from tests.helpers import block_states, hook_snapshot, left_padded


@pytest.fixture
def bigcode():
    config = GPTBigCodeConfig(
        vocab_size=64, n_embd=32, n_layer=3, n_head=2, n_positions=64
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_block_selection_is_one_rule(llama):
    assert model_parts(llama).choose(None) == [0, 1]
    assert model_parts(llama).choose([0]) == [0, 1]
    assert model_parts(llama).choose([-2, 0]) == [0, 1]
    for bad in ([2], [-3]):
        with pytest.raises(ValueError, match="layers"):
            model_parts(llama).choose(bad)
    for bad in ([True], [0.0], [torch.tensor(1.0)], ["1"]):
        with pytest.raises(TypeError, match="integer block indices"):
            model_parts(llama).choose(bad)
    with pytest.raises(TypeError, match="layers"):
        LayerIGLens.from_model(llama, layers=[True])  # once read as block 1
    # numpy and torch integers are integers
    assert model_parts(llama).choose([np.int64(0), torch.tensor(-2)]) == [0, 1]
    with pytest.raises(TypeError, match="layers"):
        model_parts(llama).choose(1)


def test_norm_kind_is_data(llama):
    assert model_parts(llama).norm_kind == "rms"
    assert set(NORM_KINDS) == {"rms", "layer", "none"}


def test_register_a_new_model_type(bigcode):
    assert "gpt_bigcode" not in supported_model_types()
    # Unregistered, the probe verifies the blocks and readout but proposes no
    # mid-block module: the sub-layer split needs the registration.
    with pytest.raises(ValueError, match="mid="):
        LayerIGLens.from_model(bigcode).attribute_map(
            torch.tensor([[5, 6, 7]]), granularity="sublayer"
        )
    register_architecture(
        "gpt_bigcode",
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid="ln_2",
        norm_kind="layer",
        attn_out="attn.c_proj",
    )
    try:
        assert "gpt_bigcode" in supported_model_types()
        lens = LayerIGLens.from_model(bigcode)
        assert lens.layer_names == ["0", "1", "2"]
        ids, mask = left_padded([6, 4], 64)
        for granularity in ("block", "sublayer", "head"):
            result = lens.attribute_map(
                ids, additional_forward_args=(mask,), granularity=granularity
            )
            change = result.model_prob - result.base_prob
            residual = (result.total - change)[result.mask].abs().max()
            assert residual <= 1e-6
        # The readout of the last block's output is the model's own head.
        states, logits = block_states(bigcode, ids, mask)
        with torch.no_grad():
            ours = model_parts(bigcode).readout()(states[-1])
        torch.testing.assert_close(ours, logits, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="already registered"):
            register_architecture(
                "gpt_bigcode", layers="transformer.h", norm=("transformer.ln_f",)
            )
    finally:
        unregister_architecture("gpt_bigcode")
    assert "gpt_bigcode" not in supported_model_types()


def test_a_wrong_registration_is_caught_on_first_use(bigcode):
    # Forgetting the final norm: the readout no longer reproduces the logits.
    register_architecture("gpt_bigcode", layers="transformer.h", norm=())
    hooks, bigcode.training = hook_snapshot(bigcode), True
    try:
        for build in (LayerIGLens.from_model, model_parts):
            with pytest.raises(ValueError, match="does not reproduce the model's"):
                build(bigcode)
        assert hook_snapshot(bigcode) == hooks and bigcode.training
    finally:
        unregister_architecture("gpt_bigcode")
        bigcode.training = False


def test_registration_in_a_few_lines_with_a_transform(bigcode):
    """``post`` may be the transform itself; a missing mid module is named."""
    cap = 0.5
    logits = bigcode(torch.tensor([[5, 6, 7]])).logits

    class Capped(type(bigcode)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = torch.tanh(out.logits / cap) * cap
            return out

    capped = Capped(bigcode.config).eval()
    capped.load_state_dict(bigcode.state_dict())
    register_architecture(
        "gpt_bigcode", layers="transformer.h", norm=("transformer.ln_f",), mid="nope"
    )
    try:
        with pytest.raises(ValueError, match="no module 'nope'"):
            LayerIGLens.from_model(capped)
        register_architecture(
            "gpt_bigcode",
            layers="transformer.h",
            norm=("transformer.ln_f",),
            post=Softcap(cap),
            mid="ln_2",
            norm_kind="layer",
            replace=True,
        )
        lens = LayerIGLens.from_model(capped)
        result = lens.attribute_map(torch.tensor([[5, 6, 7]]), granularity="sublayer")
        expected = (torch.tanh(logits / cap) * cap).softmax(-1).max(-1).values
        assert (result.model_prob - expected).abs().max() <= 1e-6
        assert result.delta.abs().max() <= 1e-6
    finally:
        unregister_architecture("gpt_bigcode")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(layers=""), "layers"),
        (dict(layers="transformer.h", norm="transformer.ln_f"), "norm"),
        (dict(layers="transformer.h", norm=(), norm_kind="batch"), "norm_kind"),
        (dict(layers="transformer.h", norm=(), mid=""), "mid"),
        (dict(layers="transformer.h", norm=(), attn_out=""), "attn_out"),
        (dict(layers="transformer.h", norm=(), head=()), "head"),
    ],
)
def test_bad_registration_is_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        register_architecture("my_model", **{"norm": (), **kwargs})
    assert "my_model" not in supported_model_types()


def _my_llama():
    from tests.tiny_models import tiny_model

    model = tiny_model("llama")
    model.config.model_type = "my_llama"  # a user type with llama's layout
    return model


LLAMA = dict(layers="model.layers", norm=("model.norm",))
BIGCODE = dict(layers="transformer.h", norm=("transformer.ln_f",), norm_kind="layer")


@pytest.mark.parametrize(
    "which, fields, message",
    [
        (
            "llama",
            dict(mid="input_layernorm"),
            "mid: the input of block 0's mid module is the block input itself",
        ),
        (
            "llama",
            dict(mid="self_attn.o_proj"),
            "mid: the input of block 0's mid module is not the block input plus",
        ),
        (
            "llama",
            dict(mid="mlp.down_proj"),
            "mid: the input of block 0's mid module has shape",
        ),
        (
            "llama",
            dict(mid="post_attention_layernorm", attn_out="mlp.down_proj"),
            "attn_out: the output of block 0's attn_out module is not the attention",
        ),
        ("llama", dict(norm_kind="layer"), "norm_kind: registered 'layer'"),
        ("bigcode", dict(mid="ln_1"), "block input itself"),
        ("bigcode", dict(mid="ln_2", norm_kind="rms"), "norm_kind: registered 'rms'"),
        ("bigcode", dict(mid="ln_2", attn_out="mlp.c_proj"), "attn_out:"),
    ],
)
def test_declared_fields_are_measured_on_first_use(bigcode, which, fields, message):
    """A wrong mid, attn_out or norm_kind is one sentence naming the field, on
    first use, before any credit is computed."""
    model = _my_llama() if which == "llama" else bigcode
    model_type = model.config.model_type
    register_architecture(
        model_type, **{**(LLAMA if which == "llama" else BIGCODE), **fields}
    )
    try:
        with pytest.raises(ValueError, match=message) as error:
            LayerIGLens.from_model(model)
        assert len(str(error.value).splitlines()) == 1
    finally:
        unregister_architecture(model_type)


@pytest.mark.parametrize("which", ["llama", "bigcode"])
def test_correct_declarations_pass_and_split_exactly(bigcode, which):
    model = _my_llama() if which == "llama" else bigcode
    fields = (
        dict(LLAMA, mid="post_attention_layernorm", attn_out="self_attn.o_proj")
        if which == "llama"
        else dict(BIGCODE, mid="ln_2", attn_out="attn.c_proj")
    )
    register_architecture(model.config.model_type, **fields)
    try:
        lens = LayerIGLens.from_model(model)
        for granularity in ("sublayer", "head"):
            result = lens.attribute_map(
                torch.tensor([[5, 6, 7, 8]]), granularity=granularity
            )
            assert result.delta.abs().max() <= 1e-6
    finally:
        unregister_architecture(model.config.model_type)


def test_built_in_entries_cannot_be_unregistered():
    with pytest.raises(ValueError, match="'llama' is built in"):
        unregister_architecture("llama")
    assert "llama" in supported_model_types()
    built_in = model_parts(_my_llama_as("llama")).architecture
    register_architecture("llama", **LLAMA, replace=True)
    unregister_architecture("llama")  # the built-in entry comes back
    assert model_parts(_my_llama_as("llama")).architecture is built_in
    with pytest.raises(ValueError, match="built in"):
        unregister_architecture("llama")


def _my_llama_as(model_type):
    model = _my_llama()
    model.config.model_type = model_type
    return model
