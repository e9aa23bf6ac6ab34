"""The model is bound once: one architecture lookup per entry point, one unwrap."""

import pytest
import torch
from torch import nn

from captum_iglens import LayerIGLens, attribute_text
from captum_iglens.hf import ModelParts, architectures, model_parts
from captum_iglens.studies import compare, run_batch, run_validation
from tests.tiny_models import VOCAB, tiny_model, tiny_tokenizer


@pytest.fixture
def lookups(monkeypatch):
    """Counts the architecture lookups and the bindings of a model's parts."""
    counts = {"architecture": 0, "bind": 0}
    lookup, bind = architectures.architecture, ModelParts.bind.__func__

    def counted_lookup(model):
        counts["architecture"] += 1
        return lookup(model)

    def counted_bind(cls, model, arch):
        counts["bind"] += 1
        return bind(cls, model, arch)

    monkeypatch.setattr(architectures, "architecture", counted_lookup)
    monkeypatch.setattr(ModelParts, "bind", classmethod(counted_bind))
    return counts


def test_parts_are_the_models_own(llama):
    parts = model_parts(llama)
    assert parts.model is llama and model_parts(parts) is parts
    assert parts.blocks == list(llama.model.layers)
    assert parts.mid == [b.post_attention_layernorm for b in parts.blocks]
    assert parts.attn_out == [b.self_attn.o_proj for b in parts.blocks]
    assert (parts.n_heads, parts.attn_scale) == (4, 1.0)
    assert (parts.norm, parts.head, parts.post) == (
        llama.model.norm,
        llama.lm_head,
        None,
    )
    assert parts.norm_kind == "rms"
    readout = parts.readout(max_chunk_bytes=1024)
    assert readout.head is llama.lm_head and readout.max_chunk_bytes == 1024
    assert parts.attn_norm is None and parts.parallel_mlp is None


def test_post_norm_and_parallel_parts():
    from tests.tiny_models import tiny_model

    gemma = model_parts(tiny_model("gemma3_text"))
    assert gemma.attn_out == [b.self_attn.o_proj for b in gemma.blocks]
    assert gemma.attn_norm == [b.post_attention_layernorm for b in gemma.blocks]
    assert gemma.parallel_mlp is None
    gptj = model_parts(tiny_model("gptj"))
    assert gptj.attn_out == [b.attn.out_proj for b in gptj.blocks]
    assert gptj.parallel_mlp == [b.mlp for b in gptj.blocks]
    assert gptj.mid is None and gptj.attn_norm is None
    # GPT-NeoX is parallel or sequential as configured.
    neox = model_parts(tiny_model("gpt_neox", use_parallel_residual=False))
    assert neox.parallel_mlp is None and neox.mid is not None


def test_from_model_looks_the_model_up_once(llama, lookups):
    lens = LayerIGLens.from_model(llama, [0])
    assert lookups == {"architecture": 1, "bind": 1}
    assert lens.layer_names == ["0", "1"] and lens.block_parts is not None
    LayerIGLens.from_model(model_parts(llama))  # bound parts: no new lookup
    assert lookups == {"architecture": 2, "bind": 2}


def test_studies_look_the_model_up_once(llama, lookups, tmp_path):
    tokenizer = tiny_tokenizer()
    prompts = [{"id": 1, "prompt": "t5 t6 t7"}]
    run_batch(
        llama,
        tokenizer,
        prompts,
        tmp_path,
        progress=False,
        chat=False,
        max_new_tokens=2,
    )
    assert lookups == {"architecture": 1, "bind": 1}
    compare(llama, torch.tensor([[5, 6, 7]]), positions=[-1], methods=["dla"])
    assert lookups == {"architecture": 2, "bind": 2}
    attribute_text(llama, tokenizer, "t5 t6", answer="t7", chat=False)
    assert lookups == {"architecture": 3, "bind": 3}
    run_validation(
        llama,
        tokenizer,
        ["t5 t6 t7"],
        mode="mean",
        methods=["ig_lens", "dla"],
        progress=False,
    )
    assert lookups == {"architecture": 4, "bind": 4}


def test_studies_accept_a_wrapped_model(llama):
    ids = torch.randint(3, VOCAB, (2, 5))
    plain = compare(llama, ids, positions=[-1], methods=["ig_lens", "dla"])
    wrapped = compare(
        nn.DataParallel(llama), ids, positions=[-1], methods=["ig_lens", "dla"]
    )
    for name in ("ig_lens", "dla"):
        torch.testing.assert_close(
            wrapped.methods[name].scores, plain.methods[name].scores, rtol=0, atol=0
        )
    lens = LayerIGLens.from_model(nn.DataParallel(llama))
    assert lens.forward_func.model is llama


def test_a_model_outside_the_table_is_named():
    with pytest.raises(ValueError, match="Linear"):
        model_parts(nn.Linear(4, 4))
    gpt2 = tiny_model("gpt2")
    with pytest.raises(TypeError, match="layers"):
        model_parts(gpt2).choose(1)


def test_a_per_block_path_list_of_the_wrong_length_is_refused(llama):
    from dataclasses import replace

    arch = replace(
        architectures.architecture(llama),
        mid=lambda config: ("post_attention_layernorm",),  # one path, two blocks
    )
    with pytest.raises(ValueError, match="1 paths of the mid-block state, one per"):
        ModelParts.bind(llama, arch)


@pytest.mark.parametrize("subcommand", [[], ["compare", "--methods", "ig_lens"]])
def test_the_command_line_binds_the_model_once(lookups, tmp_path, subcommand):
    from captum_iglens.cli import main
    from tests.helpers import word_tokenizer

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    argv = ["w5 w6", "--model", str(tmp_path), "--no-chat", "--max-new-tokens", "2"]
    assert main(subcommand + argv) == 0
    assert lookups == {"architecture": 1, "bind": 1}
