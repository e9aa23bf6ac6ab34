"""Exactness and completeness on real weights, for each embedded model: SmolLM2-
135M-Instruct (the default) and Gemma 3 270M (embeddings scaled by sqrt(d), pre-
and post-norms in each block, a 262144-token vocabulary tied to the embeddings)."""

import re
from pathlib import Path

import pytest
import torch

from captum_iglens import LayerIGLens, attribute_text
from captum_iglens.hf import encode_prompt
from captum_iglens.hf import model_parts
from tests.helpers import assert_state_unchanged, hook_snapshot, state_snapshot

pytestmark = pytest.mark.real_model

FP32_TOL = 1e-6
PROMPTS = ["The capital of France is", "Water is made of hydrogen and"]


@pytest.fixture(scope="module")
def padded_batch(embedded_model):
    _, _, tokenizer = embedded_model
    rows = [tokenizer(p, return_tensors="pt").input_ids[0] for p in PROMPTS]
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask


def test_readout_reproduces_model_logits(embedded_model, padded_batch):
    name, model, _ = embedded_model
    ids, mask = padded_batch
    lens = LayerIGLens.from_model(model)
    captured = {}
    handle = (
        model_parts(model)
        .blocks[-1]
        .register_forward_hook(lambda m, a, o: captured.setdefault("h", o.detach()))
    )
    try:
        with torch.no_grad():
            logits = lens.forward_func(ids, mask)
            ours = lens.readout(captured["h"])
    finally:
        handle.remove()
    if name == "smollm2":
        assert torch.equal(ours, logits)  # same shapes, same kernels: bitwise equal
    probs, read = logits.float().softmax(-1), ours.float().softmax(-1)
    assert (read - probs)[mask.bool()].abs().max() <= FP32_TOL


@pytest.mark.parametrize("n_steps", [1, 7])
def test_completeness_every_position_padded_batch(
    embedded_model, padded_batch, n_steps
):
    _, model, _ = embedded_model
    ids, mask = padded_batch
    lens = LayerIGLens.from_model(model)
    hooks, state = hook_snapshot(model), state_snapshot(model)
    result = lens.attribute_map(ids, additional_forward_args=(mask,))
    real = result.mask
    assert real.sum() == mask.sum()
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
        n_steps=n_steps,
        positions=[-2, -1],
        return_convergence_delta=True,
    )
    assert delta.abs().max() <= FP32_TOL
    per_layer = torch.stack([a.sum(-1) for a in attrs], dim=-1)
    assert (per_layer - result.attributions[:, -2:]).abs().max() <= FP32_TOL
    assert hook_snapshot(model) == hooks
    assert_state_unchanged(model, state)


def test_sublayer_map_on_real_weights(embedded_model, padded_batch):
    _, model, _ = embedded_model
    ids, mask = padded_batch
    n = len(model_parts(model).blocks)
    chosen = [n // 6, n // 2]
    lens = LayerIGLens.from_model(model, layers=chosen)
    blocks = lens.attribute_map(ids, additional_forward_args=(mask,), positions=[-1])
    subs = lens.attribute_map(
        ids, additional_forward_args=(mask,), positions=[-1], granularity="sublayer"
    )
    assert subs.layer_names == [
        f"{block}.{part}" for block in (*chosen, n - 1) for part in ("attn", "mlp")
    ]
    paired = subs.attributions.view(2, 1, 3, 2).sum(-1)
    assert (paired - blocks.attributions).abs().max() <= FP32_TOL
    assert subs.delta.abs().max() <= FP32_TOL


def test_gemma3_is_the_text_model_with_its_tokenizer(gemma3_model):
    model, tokenizer = gemma3_model
    assert model.config.model_type == "gemma3_text"
    assert len(model_parts(model).blocks) == 18
    ids = tokenizer("The capital of France is").input_ids
    assert ids[0] == tokenizer.bos_token_id  # Gemma reads a BOS first


def test_attribute_text_answer(default_model):
    model, tokenizer = default_model
    result = attribute_text(
        model, tokenizer, "What is the capital of Vietnam?", max_new_tokens=8
    )
    assert result.attributions.shape[:2] == (1, len(result.tokens[0]))
    assert result.attributions.shape[-1] == 30
    assert result.delta.abs().max() <= FP32_TOL
    prompt_length = encode_prompt(tokenizer, "What is the capital of Vietnam?").shape[1]
    assert result.positions[0] == prompt_length - 1
    assert "".join(result.tokens[0]) == result.metadata["answer"]


def test_readme_python_examples_run(default_model, capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 2
    assert len([line for line in blocks[0].splitlines() if line.strip()]) <= 10
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    match = re.search(r"max \|Σ - Δp\| = ([0-9.e+-]+)", out)
    assert match and float(match.group(1)) <= FP32_TOL
    attributions, delta = namespace["attributions"], namespace["delta"]
    assert len(attributions) == 30 and attributions[0].shape == (1, 1, 576)
    assert delta.shape == (1,) and delta.abs().max() <= FP32_TOL
    result = namespace["result"]
    per_dimension = sum(float(a.sum()) for a in attributions)
    assert abs(float(result.total[0, 0]) - per_dimension) <= 1e-5
    res = namespace["res"]
    assert res.token_attr.shape == (1, 30)
    assert namespace["fig"] is not None


def test_joint_path_adds_up_and_nests_on_real_weights(embedded_model, padded_batch):
    """The joint path on real weights: block and head maps add up to Δp, and
    each block's heads, MLP (and the first block's input column) add up to its
    block credit."""
    _, model, _ = embedded_model
    ids, mask = padded_batch
    n = len(model_parts(model).blocks)
    lens = LayerIGLens.from_model(model, layers=list(range(n - 4, n)))
    found = {
        g: lens.attribute_map(
            ids,
            additional_forward_args=(mask,),
            positions=[-1],
            path="joint",
            granularity=g,
            n_steps=16,
        )
        for g in ("block", "head")
    }
    blocks, heads = found["block"], found["head"]
    change = blocks.model_prob - blocks.base_prob
    for result in found.values():
        assert (result.total - change).abs().max() <= FP32_TOL
    per_block = torch.zeros_like(blocks.attributions)
    for j, name in enumerate(heads.layer_names):
        block = 0 if name == "input" else blocks.layer_names.index(name.split(".")[0])
        per_block[..., block] += heads.attributions[..., j]
    # float32 rounding of credits up to ~5 in size (relative 3e-7)
    scale = blocks.attributions.abs().max().clamp_min(1)
    assert (per_block - blocks.attributions).abs().max() <= FP32_TOL * scale
