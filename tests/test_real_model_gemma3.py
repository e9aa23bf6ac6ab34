"""Exactness and completeness on real weights of the second model family: Gemma 3
270M (18 blocks, embeddings scaled by sqrt(d), pre- and post-norms in each block,
a 262144-token vocabulary tied to the embeddings)."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.hf.architectures import decoder_layers
from tests.helpers import assert_state_unchanged, hook_snapshot, state_snapshot

pytestmark = pytest.mark.real_model

FP32_TOL = 1e-6
PROMPTS = ["The capital of France is", "Water is made of hydrogen and"]


@pytest.fixture(scope="module")
def padded_batch(gemma3_model):
    _, tokenizer = gemma3_model
    rows = [tokenizer(p, return_tensors="pt").input_ids[0] for p in PROMPTS]
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask


def test_gemma3_is_the_text_model_with_its_tokenizer(gemma3_model):
    model, tokenizer = gemma3_model
    assert model.config.model_type == "gemma3_text"
    assert len(decoder_layers(model)) == 18
    ids = tokenizer("The capital of France is").input_ids
    assert ids[0] == tokenizer.bos_token_id  # Gemma reads a BOS first


def test_readout_reproduces_model_logits(gemma3_model, padded_batch):
    model, _ = gemma3_model
    ids, mask = padded_batch
    lens = LayerIGLens.from_model(model)
    captured = {}
    handle = decoder_layers(model)[-1].register_forward_hook(
        lambda m, a, o: captured.setdefault("h", o.detach())
    )
    try:
        with torch.no_grad():
            logits = lens.forward_func(ids, mask)
            ours = lens.readout(captured["h"])
    finally:
        handle.remove()
    probs, read = logits.float().softmax(-1), ours.float().softmax(-1)
    real = mask.bool()
    assert (read - probs)[real].abs().max() <= FP32_TOL


def test_completeness_every_position_padded_batch(gemma3_model, padded_batch):
    model, _ = gemma3_model
    ids, mask = padded_batch
    lens = LayerIGLens.from_model(model)
    hooks, state = hook_snapshot(model), state_snapshot(model)
    result = lens.attribute_map(ids, additional_forward_args=(mask,))
    real = result.mask
    gap = result.total - (result.model_prob - result.base_prob)
    assert gap[real].abs().max() <= FP32_TOL
    with torch.no_grad():
        probs = (
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            )
            .logits.float()
            .softmax(-1)
        )
    expected = probs.gather(-1, result.targets[..., None])[..., 0]
    assert (result.model_prob - expected)[real].abs().max() <= FP32_TOL
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=(mask,),
        n_steps=3,
        positions=[-1],
        return_convergence_delta=True,
    )
    assert delta.abs().max() <= FP32_TOL
    assert hook_snapshot(model) == hooks
    assert_state_unchanged(model, state)


def test_sublayer_map_on_real_weights(gemma3_model, padded_batch):
    model, _ = gemma3_model
    ids, mask = padded_batch
    lens = LayerIGLens.from_model(model, layers=[3, 9])
    blocks = lens.attribute_map(ids, additional_forward_args=(mask,), positions=[-1])
    subs = lens.attribute_map(
        ids, additional_forward_args=(mask,), positions=[-1], granularity="sublayer"
    )
    assert subs.layer_names == [
        "3.attn",
        "3.mlp",
        "9.attn",
        "9.mlp",
        "17.attn",
        "17.mlp",
    ]
    paired = subs.attributions.view(2, 1, 3, 2).sum(-1)
    assert (paired - blocks.attributions).abs().max() <= FP32_TOL
    assert subs.delta.abs().max() <= FP32_TOL
