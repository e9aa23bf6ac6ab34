"""Sub-layer resolution: attention and MLP credited separately, still telescoping."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr._utils.capture import ResidualCapture
from captum_iglens.hf import model_parts
from tests.helpers import hook_snapshot, left_padded
from tests.tiny_models import ARCHITECTURES, VOCAB, tiny_model

FP32_TOL = 1e-6
# Test ids whose blocks (as configured) add attention and MLP in parallel.
PARALLEL = {"gptj", "phi", "cohere", "falcon", "gpt_neox", "opt-no-final-norm"}
# Every other architecture, plus the sequential variants of the parallel ones.
SEQUENTIAL = [(a, {}) for a in ARCHITECTURES if a not in PARALLEL] + [
    ("gpt_neox", {"use_parallel_residual": False}),
    ("falcon", {"parallel_attn": False, "new_decoder_architecture": False}),
]


def test_table_marks_parallel_blocks():
    for arch in ARCHITECTURES:
        model = tiny_model(arch)
        modules = model_parts(model).mid
        assert (modules is None) == (arch in PARALLEL), arch


@pytest.mark.parametrize("arch, overrides", SEQUENTIAL)
def test_sublayer_credits_add_up_to_block_credits(arch, overrides):
    model = tiny_model(arch, **overrides)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    blocks = lens.attribute_map(ids, additional_forward_args=(mask,))
    subs = lens.attribute_map(
        ids, additional_forward_args=(mask,), granularity="sublayer"
    )
    names = [
        n for block in blocks.layer_names for n in (f"{block}.attn", f"{block}.mlp")
    ]
    assert subs.layer_names == names
    paired = subs.attributions.view(*subs.attributions.shape[:2], -1, 2).sum(-1)
    assert (paired - blocks.attributions).abs().max() <= FP32_TOL
    assert subs.delta.abs().max() <= FP32_TOL
    assert torch.equal(subs.levels[..., 1::2], blocks.levels)
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=(mask,),
        granularity="sublayer",
        n_steps=3,
        return_convergence_delta=True,
    )
    assert len(attrs) == len(names) and delta.abs().max() <= FP32_TOL
    per_segment = torch.stack([a.sum(-1) for a in attrs], dim=-1)
    assert (per_segment - subs.attributions).abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch", sorted(PARALLEL))
def test_parallel_blocks_refuse_sublayer(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="granularity.*parallel"):
        lens.attribute_map(torch.randint(0, VOCAB, (1, 4)), granularity="sublayer")
    assert hook_snapshot(model) == hooks


def test_bad_granularity():
    lens = LayerIGLens.from_model(tiny_model("llama"))
    with pytest.raises(ValueError, match="granularity"):
        lens.attribute_map(torch.randint(0, VOCAB, (1, 4)), granularity="neurons")


def test_mid_block_state_matches_submodules_by_hand():
    """h_mid = block input + attention output; the block's output is
    h_mid + mlp(norm(h_mid))."""
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    block = model_parts(model).blocks[1]
    seen = {}

    def keep(key, value):
        seen[key] = value.detach()

    handles = [
        block.register_forward_pre_hook(
            lambda m, a, k: keep("in", a[0] if a else k["hidden_states"]),
            with_kwargs=True,
        ),
        block.self_attn.register_forward_hook(lambda m, a, o: keep("attn", o[0])),
    ]
    ids = torch.randint(0, VOCAB, (2, 5))
    points, _ = lens._granularity("sublayer").path_points()
    capture = ResidualCapture(
        lens.input_layer, points, torch.arange(5), torch.device("cpu")
    )
    try:
        with capture, torch.no_grad():
            out = model(ids)
        _, states = capture.path()
    finally:
        for h in handles:
            h.remove()
    h_mid, h_out = states[2], states[3]
    assert torch.allclose(h_mid, seen["in"] + seen["attn"], atol=1e-6)
    with torch.no_grad():
        by_hand = h_mid + block.mlp(block.post_attention_layernorm(h_mid))
    assert torch.allclose(h_out, by_hand, atol=1e-6)
    assert out.logits.shape[:2] == (2, 5)


def test_mixed_block_kinds_have_their_own_mid_module():
    """OLMo hybrid: a Gated DeltaNet block (pre-norm) and an attention block (the
    MLP reads the stream); each block's output is h_mid plus its MLP branch,
    computed here by hand from the captured h_mid."""
    model = tiny_model("olmo_hybrid")
    lens = LayerIGLens.from_model(model)
    linear, attention = model_parts(model).blocks
    points, _ = lens._granularity("sublayer").path_points()
    ids = torch.randint(0, VOCAB, (2, 5))
    capture = ResidualCapture(
        lens.input_layer, points, torch.arange(5), torch.device("cpu")
    )
    with capture, torch.no_grad():
        model(ids)
    _, (mid0, out0, mid1, out1) = capture.path()
    with torch.no_grad():
        by_hand0 = mid0 + linear.mlp(linear.post_attention_layernorm(mid0))
        by_hand1 = mid1 + attention.post_feedforward_layernorm(attention.mlp(mid1))
    assert torch.allclose(out0, by_hand0, atol=1e-6)
    assert torch.allclose(out1, by_hand1, atol=1e-6)
