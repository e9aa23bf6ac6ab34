"""Source tokens: each block's attention credit split over the source positions
(and heads) it reads, exactly, with the attention weights of the real forward."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr._utils.block_parts import split_tolerance
from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.attr.granularities.source import _head_outputs, check_reproduced
from tests.helpers import hook_snapshot, left_padded
from tests.attr.test_heads import PARALLEL, SEQUENTIAL
from tests.tiny_models import VOCAB, tiny_model

FP32_TOL = 1e-6
# Every family with a head split (sequential, post-norm, parallel), except
# BLOOM, whose attention does not go through transformers' attention interface.
REFUSED = {"bloom"}
ARCHS = [(a, o) for a, o in SEQUENTIAL + PARALLEL if a not in REFUSED]


def _by_block(result, n_blocks):
    """Per block: its attention columns summed, and its MLP column."""
    names = result.layer_names
    attn = torch.stack(
        [
            result.attributions[
                ..., [i for i, n in enumerate(names) if n.startswith(f"{j}.attn.")]
            ].sum(-1)
            for j in range(n_blocks)
        ],
        -1,
    )
    mlp = result.attributions[..., [names.index(f"{j}.mlp") for j in range(n_blocks)]]
    return attn, mlp


def _head_columns(result, block):
    names = result.layer_names
    cols = [
        i
        for i, n in enumerate(names)
        if n.startswith(f"{block}.attn.h") and ".s" not in n
    ]
    return result.attributions[..., cols]


def test_registered_granularities():
    assert {"source", "source_head"} <= set(GRANULARITIES)


@pytest.mark.parametrize("arch, overrides", ARCHS)
def test_sources_add_up_to_heads_and_blocks(arch, overrides):
    model = tiny_model(arch, **overrides)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    extra = (mask,)
    snapshot = hook_snapshot(model)
    implementation = model.config._attn_implementation
    n_heads = lens.block_parts.n_heads
    for method, n_steps in (
        ("prediction_aware", 1),
        ("prediction_aware", 7),
        ("gausslegendre", 3),
    ):
        kwargs = dict(additional_forward_args=extra, method=method, n_steps=n_steps)
        heads = lens.attribute_map(ids, granularity="head", **kwargs)
        sources = lens.attribute_map(ids, granularity="source", **kwargs)
        resolved = lens.attribute_map(ids, granularity="source_head", **kwargs)
        assert sum(n.startswith("0.attn.s") for n in sources.layer_names) == 6
        by_head = resolved.source_map(by_head=True)  # (B, P, k, H, T)
        assert by_head.shape[-2:] == (n_heads, 6)
        # Σ over heads of the head-resolved map = the heads-summed map
        assert (by_head.sum(-2) - sources.source_map()).abs().max() <= FP32_TOL
        for block in range(2):  # Σ over sources = each head's credit
            found = by_head[:, :, block].sum(-1)
            expected = _head_columns(heads, block)[..., :n_heads]
            assert (found - expected).abs().max() <= FP32_TOL
        for result in (sources, resolved):  # everything = the block credit
            attn, mlp = _by_block(result, 2)
            head_attn, head_mlp = _by_block(heads, 2)
            assert (attn - head_attn).abs().max() <= FP32_TOL
            assert (mlp - head_mlp).abs().max() <= FP32_TOL
            if method == "prediction_aware":
                assert result.delta.abs().max() <= FP32_TOL
        # nothing comes from a later position, nor from padding
        credits = sources.source_map()
        for p, t in enumerate(sources.positions.tolist()[:-1]):
            assert credits[:, p, :, t + 1 :].abs().max() == 0
        assert credits[1, :, :, :2].abs().max() == 0
    assert hook_snapshot(model) == snapshot
    assert model.config._attn_implementation == implementation


def test_per_dimension_attributions_add_up_to_the_map():
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    attrs, delta = lens.attribute(
        ids, granularity="source", n_steps=4, return_convergence_delta=True
    )
    found = lens.attribute_map(ids, granularity="source", n_steps=4)
    per_column = torch.stack([a.sum(-1) for a in attrs], -1)
    assert len(attrs) == len(found.layer_names)
    assert (per_column - found.attributions).abs().max() <= FP32_TOL
    assert delta.abs().max() <= FP32_TOL


def test_page_data_has_the_source_map():
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    result = lens.attribute_map(ids, positions=[2, 4], granularity="source_head")
    result.metadata["source_tokens"] = [[f"w{i}" for i in range(5)]]
    (data,) = result.page_data()["sources"]
    assert data["tokens"] == [f"w{i}" for i in range(5)]
    assert data["blocks"] == ["0", "1"] and data["positions"] == [2, 4]
    credits = torch.tensor(data["credits"])
    assert credits.shape == (2, 2, 5)
    assert torch.tensor(data["heads"]).shape == (2, 2, 4, 5)
    total = (
        credits.sum(-1) + torch.tensor(data["bias"]) + torch.tensor(data["mlp"])
    ).sum(-1) + torch.tensor(data["input"])
    assert (total - result.attributions[0].sum(-1)).abs().max() <= FP32_TOL
    blocks = lens.attribute_map(ids, positions=[2, 4])
    assert blocks.page_data()["sources"] is None
    with pytest.raises(ValueError, match="granularity"):
        blocks.source_map()


def _own_kernel(module, *args, **kwargs):
    """An attention kernel of the model's own, whose numerics the eager
    attention does not share (sdpa, 1e-4 larger)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, weights = sdpa_attention_forward(module, *args, **kwargs)
    return output * (1 + 1e-4), weights


def _register_own_kernel():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register("iglens_test_kernel", _own_kernel)
    sdpa_masks = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    ALL_MASK_ATTENTION_FUNCTIONS.register("iglens_test_kernel", sdpa_masks)


def _plain_prob(model, ids, mask, result):
    """The model's probability of each target from a plain forward (position
    ids counted from the first real token of each left-padded row)."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
    logits = logits[:, result.positions]
    log_probs = logits.float().flatten(0, 1).log_softmax(-1)
    picked = log_probs.gather(-1, result.targets.reshape(-1, 1))
    return picked.view_as(result.targets).exp()


@pytest.mark.parametrize("kernel", ["sdpa", "iglens_test_kernel"])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_p_model_is_the_real_forward_and_the_split_closes_on_it(arch, kernel):
    # The source weights are read by the eager attention; p_model, delta and the
    # path must come from the model's own forward all the same.
    _register_own_kernel()
    model = tiny_model(arch)
    model.config._attn_implementation = kernel
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), n_steps=5)
    blocks = lens.attribute_map(ids, **kwargs)
    heads = lens.attribute_map(ids, granularity="head", **kwargs)
    real = mask[:, blocks.positions].bool()
    plain = _plain_prob(model, ids, mask, blocks)
    assert (blocks.model_prob - plain)[real].abs().max() <= 1e-7
    n_heads = lens.block_parts.n_heads
    for granularity in ("source", "source_head"):
        found = lens.attribute_map(ids, granularity=granularity, **kwargs)
        assert torch.equal(found.model_prob, blocks.model_prob)
        assert torch.equal(found.base_prob, blocks.base_prob)
        attn, mlp = _by_block(found, 2)
        assert (attn + mlp - blocks.attributions)[real].abs().max() <= FP32_TOL
        assert found.delta.abs().max() <= FP32_TOL
        if granularity == "source_head":
            by_head = found.source_map(by_head=True)
            for block in range(2):
                expected = _head_columns(heads, block)[..., :n_heads]
                gap = by_head[:, :, block].sum(-1) - expected
                assert gap[real].abs().max() <= FP32_TOL
    assert model.config._attn_implementation == kernel


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_refused_where_the_weights_cannot_be_read(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    before = hook_snapshot(model)
    implementation = model.config._attn_implementation
    with pytest.raises(ValueError, match="attention interface; use granularity='head'"):
        lens.attribute_map(torch.tensor([[5, 6, 7]]), granularity="source")
    assert hook_snapshot(model) == before
    assert model.config._attn_implementation == implementation


def test_refused_without_a_head_split():
    model = tiny_model("qwen3_next")
    lens = LayerIGLens.from_model(model)
    with pytest.raises(ValueError, match="granularity: 'head'"):
        lens.attribute_map(torch.tensor([[5, 6, 7]]), granularity="source")


def test_reproduction_check_is_relative_to_the_values_an_output_averages():
    """An output that averages values of opposite sign is near zero; weights
    rounded as bfloat16 rounds them move it by a fraction of the values, not of
    the output (the Llama-3.1-8B shape at T = 4,096 in bfloat16). Values that
    the model changes after the projection are still refused."""
    values = torch.tensor([3.0, -3.0]).view(1, 1, 2, 1)  # (B, H_kv, T, e)
    exact = torch.tensor([0.5, 0.5]).view(1, 1, 1, 2)  # (B, H, P, T)
    rounded = torch.tensor([0.51, 0.49]).view(1, 1, 1, 2)
    real = _head_outputs(exact, values, 1)  # 0
    mask = torch.ones(1, 1, dtype=torch.bool)
    found = _head_outputs(rounded, values, 1)  # 0.06 from the real output
    check_reproduced(0, found, real, values, mask, split_tolerance(torch.bfloat16))
    doubled = _head_outputs(exact, torch.tensor([3.0, 3.0]).view(1, 1, 2, 1), 1)
    with pytest.raises(ValueError, match="chosen block 0 .* use granularity='head'"):
        check_reproduced(
            0, doubled, 2 * doubled, values, mask, split_tolerance(torch.bfloat16)
        )


def _planted_gpt2(source_token: int, target: int):
    """A tiny GPT-2 whose only update is head 0 of block 0 copying the token
    ``source_token`` (wherever it is) into the target's unembedding direction."""
    model = tiny_model("gpt2")
    d = model.config.n_embd
    e = d // model.config.n_head
    with torch.no_grad():
        wte = model.transformer.wte.weight
        wte[:, :2] = 0.0
        wte[source_token, :2] = 8.0  # a key direction and a value direction
        model.transformer.wpe.weight.zero_()
        for block in model.transformer.h:
            block.attn.c_proj.weight.zero_()
            block.attn.c_proj.bias.zero_()
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            block.ln_1.weight.fill_(1.0)
            block.ln_1.bias.zero_()
        attn = model.transformer.h[0].attn
        attn.c_attn.weight[:, : 3 * d].zero_()
        attn.c_attn.bias.zero_()
        attn.c_attn.bias[0] = 10.0  # head 0's query: a constant
        attn.c_attn.weight[0, d] = 10.0  # its key: the key direction
        attn.c_attn.weight[1, 2 * d] = 1.0  # its value: the value direction
        direction = model.lm_head.weight[target]
        attn.c_proj.weight[0] = 2.0 * direction / direction.norm()
        attn.c_proj.weight[1:e].zero_()
    return model


def test_planted_head_copies_a_known_source():
    source_token, target, source = 50, 60, 2
    model = _planted_gpt2(source_token, target)
    lens = LayerIGLens.from_model(model)
    ids = torch.tensor([[7, 9, source_token, 11, 13, 17]])
    result = lens.attribute_map(
        ids, target=torch.tensor([[target]]), positions=[5], granularity="source_head"
    )
    cells = result.source_map(by_head=True)[0, 0]  # (k, H, T)
    change = float(result.model_prob[0, 0] - result.base_prob[0, 0])
    assert change > 0.05
    best = divmod(int(cells.abs().argmax()), cells.shape[1] * cells.shape[2])
    assert best[0] == 0 and divmod(best[1], cells.shape[2]) == (0, source)
    assert cells[0, 0, source] > 0.9 * change  # nearly all of it
    summed = lens.attribute_map(
        ids, target=torch.tensor([[target]]), positions=[5], granularity="source"
    ).source_map()[0, 0]
    assert int(summed.sum(0).argmax()) == source


def test_prediction_aware_converges_to_gauss_legendre_per_source():
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    kwargs = dict(positions=[3, 5], granularity="source_head")
    reference = lens.attribute_map(ids, method="gausslegendre", n_steps=64, **kwargs)
    expected = reference.source_map(by_head=True)
    errors = [
        float(
            (
                lens.attribute_map(ids, n_steps=n, **kwargs).source_map(by_head=True)
                - expected
            )
            .abs()
            .max()
        )
        for n in (4, 16, 64)
    ]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] <= 1e-3 * max(float(expected.abs().max()), 1e-3)


def test_text_and_figure_of_the_sources():
    import matplotlib

    matplotlib.use("Agg")
    from captum_iglens.plots import plot_source_map

    model = _planted_gpt2(50, 60)
    lens = LayerIGLens.from_model(model)
    ids = torch.tensor([[7, 9, 50, 11, 13, 17]])
    result = lens.attribute_map(
        ids, target=torch.tensor([[60]]), positions=[5], granularity="source_head"
    )
    result.metadata["source_tokens"] = [["a", "b", "X\n", "c", "d", "e"]]
    text = result.format_sources(top=2)
    first, routes = text.splitlines()
    assert "'X\\n'@2 +0.5" in first  # the planted source first, escaped
    assert routes.split("routes: ")[1].startswith("'X\\n'@2→L0.h0 +0.5")
    fig, ax = plot_source_map(result, token=0)
    data = ax.images[0].get_array()
    assert data.shape == (2, 6)
    assert abs(data[0, 2] - result.source_map()[0, 0, 0, 2]) < 1e-6
    assert [t.get_text() for t in ax.get_xticklabels()][2] == repr("X\n")
    with pytest.raises(ValueError, match="token"):
        plot_source_map(result, token=3)
    blocks = lens.attribute_map(ids, positions=[5])
    with pytest.raises(ValueError, match="granularity"):
        blocks.format_sources()
    with pytest.raises(ValueError, match="granularity"):
        plot_source_map(blocks)


@pytest.mark.real_model
@pytest.mark.parametrize("n_steps", [2, 5])
def test_real_model_sources_add_up(embedded_model, n_steps):
    _, model, tokenizer = embedded_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = LayerIGLens.from_model(model)
    snapshot = hook_snapshot(model)
    implementation = model.config._attn_implementation
    kwargs = dict(positions=[-2, -1], n_steps=n_steps)
    if lens.block_parts is None:  # no head split for this family yet: refused
        with pytest.raises(ValueError, match="granularity: 'head'"):
            lens.attribute_map(ids, granularity="source", **kwargs)
        return
    # the references run the model's own attention (sdpa), as the source maps'
    # traced forward does: only their weights come from the eager attention
    blocks = lens.attribute_map(ids, positions=[-2, -1])
    heads = lens.attribute_map(ids, granularity="head", **kwargs)
    resolved = lens.attribute_map(ids, granularity="source_head", **kwargs)
    sources = lens.attribute_map(ids, granularity="source", **kwargs)
    with torch.no_grad():
        logits = model(ids).logits[:, -2:].float().flatten(0, 1)
    plain = logits.log_softmax(-1).gather(-1, blocks.targets.reshape(-1, 1)).exp()
    for result in (sources, resolved):
        gap = result.model_prob - plain.view_as(result.model_prob)
        assert gap.abs().max() <= 1e-7
        assert torch.equal(result.model_prob, blocks.model_prob)
    k, n_heads = len(lens.layers), lens.block_parts.n_heads
    by_head = resolved.source_map(by_head=True)
    assert (by_head.sum(-2) - sources.source_map()).abs().max() <= FP32_TOL
    for block in range(k):
        expected = _head_columns(heads, block)[..., :n_heads]
        assert (by_head[:, :, block].sum(-1) - expected).abs().max() <= FP32_TOL
    for result in (sources, resolved):
        attn, mlp = _by_block(result, k)
        assert (attn + mlp - blocks.attributions).abs().max() <= FP32_TOL
        assert result.delta.abs().max() <= FP32_TOL
    assert hook_snapshot(model) == snapshot
    assert model.config._attn_implementation == implementation


def test_config_restored_when_the_forward_fails():
    from captum_iglens.attr._utils import attention

    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    implementation = model.config._attn_implementation

    def fail(module, args, output):
        # the traced forward runs the model's own attention; the second
        # forward, which reads the weights, the capture's
        if model.config._attn_implementation == attention.IMPLEMENTATION:
            raise RuntimeError("planted failure")

    handle = model.model.layers[1].register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="planted failure"):
            lens.attribute_map(torch.tensor([[5, 6, 7]]), granularity="source")
    finally:
        handle.remove()
    assert model.config._attn_implementation == implementation
    assert len(attention._RECORDERS) == 0
    assert attention._SWITCH.acquire(blocking=False)  # released
    attention._SWITCH.release()


def test_llm_layer_attribution_with_sources():
    from captum.attr import TextTokenInput

    from captum_iglens.attr.llm_attr import LLMLayerAttribution
    from tests.attr.test_llm_attr import DummyTokenizer

    model = tiny_model("llama")
    tokenizer = DummyTokenizer()
    llm = LLMLayerAttribution(LayerIGLens.from_model(model), tokenizer)
    inp = TextTokenInput("a b c", tokenizer)
    res = llm.attribute(inp, target="d e", granularity="source", n_steps=3)
    result = res.iglens
    assert result.metadata["source_tokens"] == [["<s>", "a", "b", "c", "d", "e"]]
    assert result.source_map().shape == (1, 2, 2, 6)
    assert (
        res.token_attr.sum(-1) - (result.model_prob - result.base_prob)[0]
    ).abs().max() <= FP32_TOL
