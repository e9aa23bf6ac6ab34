"""Head resolution: each block's attention credit split across its heads."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.estimators import Segments
from captum_iglens.attr.estimators.prediction_aware import (
    prediction_aware_components,
)
from captum_iglens.hf import model_parts
from captum_iglens.readout.readout import Readout
from captum_iglens.readout.scores import TokenScore
from tests.helpers import hook_snapshot, left_padded
from tests.tiny_models import VOCAB, tiny_model

FP32_TOL = 1e-6
# Blocks with no sum of head outputs on the stream: hybrid recurrent blocks
# (not every block has attention heads) and OPT's post-norm, which normalises
# the stream itself after attention.
NO_SPLIT = {
    "opt-no-final-norm",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "qwen3_next",
    "granitemoehybrid",
    "jamba",
    "falcon_h1",
    "olmo_hybrid",
}
# Blocks that add attention and MLP, both read from the block's input, along
# one segment: the heads and the MLP split it.
PARALLEL = [
    ("gptj", {}),
    ("phi", {}),
    ("cohere", {}),
    ("falcon", {}),
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    ("gpt_neox", {}),
    ("stablelm", {"use_parallel_residual": True}),
]
SEQUENTIAL = [
    ("llama", {}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("gemma", {}),
    ("gpt2", {}),
    ("opt", {}),
    ("opt-project-out", {}),
    ("phi3", {}),
    ("bloom", {}),
    ("stablelm", {}),
    ("granite", {"residual_multiplier": 0.5}),
    ("olmo", {}),
    ("gpt_neox", {"use_parallel_residual": False}),
    ("falcon", {"parallel_attn": False, "new_decoder_architecture": False}),
    # Post-norm: an RMSNorm on the attention output before it is added.
    ("gemma2", {}),
    ("gemma3_text", {}),
    ("gemma4_text", {}),
    ("olmo2", {}),
    ("olmo3", {}),
    # Mixture-of-experts and current dense families.
    ("llama4_text", {}),
    ("qwen3_moe", {}),
    ("qwen2_moe", {}),
    ("mixtral", {}),
    ("olmoe", {}),
    ("smollm3", {}),
    ("gpt_oss", {}),
    ("deepseek_v3", {}),
    ("glm4_moe", {}),
    ("phimoe", {}),
    ("granitemoe", {"residual_multiplier": 0.5}),
    ("granitemoeshared", {"residual_multiplier": 0.5}),
]


def test_every_tiny_architecture_is_split_or_refused():
    from tests.tiny_models import _SPECS

    split = {arch for arch, _ in SEQUENTIAL + PARALLEL}
    assert set(_SPECS) <= split | NO_SPLIT and not split & NO_SPLIT


def _blocks_of(result, n_blocks):
    """Per block: the sum of its head (and bias) columns, and its MLP column."""
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


@pytest.mark.parametrize("arch, overrides", SEQUENTIAL)
def test_heads_add_up_to_blocks_and_sublayers(arch, overrides):
    model = tiny_model(arch, **overrides)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    extra = (mask,)
    blocks = lens.attribute_map(ids, additional_forward_args=extra)
    n_heads = model.config.num_attention_heads
    for method, steps in (
        ("prediction_aware", (1, 3, 16)),
        ("gausslegendre", (2, 9)),
        ("riemann_trapezoid", (5,)),
    ):
        for n_steps in steps:
            kwargs = dict(additional_forward_args=extra, method=method, n_steps=n_steps)
            heads = lens.attribute_map(ids, granularity="head", **kwargs)
            subs = lens.attribute_map(ids, granularity="sublayer", **kwargs)
            names = heads.layer_names
            assert names[0] == "input" and names[-1] == "1.mlp"
            assert sum(n.startswith("0.attn.h") for n in names) == n_heads
            attn, mlp = _blocks_of(heads, 2)
            assert (attn - subs.attributions[..., 0::2]).abs().max() <= FP32_TOL
            assert (mlp - subs.attributions[..., 1::2]).abs().max() <= FP32_TOL
            assert heads.attributions[..., 0].abs().max() == 0  # baseline h_0
            if method == "prediction_aware":
                assert heads.delta.abs().max() <= FP32_TOL
                assert (attn + mlp - blocks.attributions).abs().max() <= FP32_TOL
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=extra,
        granularity="head",
        n_steps=4,
        return_convergence_delta=True,
    )
    heads = lens.attribute_map(
        ids, additional_forward_args=extra, granularity="head", n_steps=4
    )
    assert len(attrs) == len(heads.layer_names) and delta.abs().max() <= FP32_TOL
    per_column = torch.stack([a.sum(-1) for a in attrs], -1)
    assert (per_column - heads.attributions).abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch, overrides", PARALLEL)
def test_parallel_heads_and_mlp_add_up_to_blocks(arch, overrides):
    # A parallel block's one segment h_in -> h_out: its heads, bias and MLP
    # columns split exactly the block's credit, whatever the rule.
    model = tiny_model(arch, **overrides)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    extra = (mask,)
    n_heads = model.config.num_attention_heads
    for method, steps in (
        ("prediction_aware", (1, 3, 16)),
        ("gausslegendre", (2, 9)),
        ("riemann_trapezoid", (5,)),
    ):
        for n_steps in steps:
            kwargs = dict(additional_forward_args=extra, method=method, n_steps=n_steps)
            heads = lens.attribute_map(ids, granularity="head", **kwargs)
            blocks = lens.attribute_map(ids, **kwargs)
            names = heads.layer_names
            assert names[0] == "input" and names[-1] == "1.mlp"
            assert sum(n.startswith("0.attn.h") for n in names) == n_heads
            attn, mlp = _blocks_of(heads, 2)
            assert (attn + mlp - blocks.attributions).abs().max() <= FP32_TOL
            assert heads.attributions[..., 0].abs().max() == 0
            assert attn.abs().max() > 1e-4 and mlp.abs().max() > 1e-4
            if method == "prediction_aware":
                assert heads.delta.abs().max() <= FP32_TOL
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=extra,
        granularity="head",
        n_steps=4,
        return_convergence_delta=True,
    )
    heads = lens.attribute_map(
        ids, additional_forward_args=extra, granularity="head", n_steps=4
    )
    assert len(attrs) == len(heads.layer_names) and delta.abs().max() <= FP32_TOL
    per_column = torch.stack([a.sum(-1) for a in attrs], -1)
    assert (per_column - heads.attributions).abs().max() <= FP32_TOL


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle"])
def test_captum_rule_per_dimension_is_component_times_gradient(method):
    model = tiny_model("gpt2")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (2, 5))
    attrs, delta = lens.attribute(
        ids,
        granularity="head",
        method=method,
        n_steps=6,
        return_convergence_delta=True,
    )
    subs = lens.attribute(ids, granularity="sublayer", method=method, n_steps=6)
    names = lens.segment_names("head")
    # The attention part per dimension: the sublayer's Δ_i Σ w ∂_i f, split.
    for j in range(2):
        cols = [i for i, n in enumerate(names) if n.startswith(f"{j}.attn.")]
        split = torch.stack([attrs[i] for i in cols]).sum(0)
        torch.testing.assert_close(split, subs[2 * j], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            attrs[names.index(f"{j}.mlp")], subs[2 * j + 1], atol=0, rtol=0
        )
    total = torch.stack([a.sum(-1) for a in attrs], -1).sum(-1)
    sub_total = torch.stack([a.sum(-1) for a in subs], -1).sum(-1)
    assert (total - sub_total).abs().max() <= FP32_TOL
    assert delta.abs().max() > 0  # a Captum rule reports its discretisation error


# The attention output projection of each architecture, written out here
# independently of the architecture table under test.
PROJECTIONS = {
    "llama": lambda block: block.self_attn.o_proj,
    "gpt2": lambda block: block.attn.c_proj,
    "opt": lambda block: block.self_attn.out_proj,
    "bloom": lambda block: block.self_attention.dense,
}


# Where the block adds the attention output: the post-attention norm's output
# (post-norm families) or the projection's own, written out independently of
# the architecture table.
POST_NORMS = {
    "gemma3_text": lambda block: block.post_attention_layernorm,
    "olmo2": lambda block: block.post_attention_layernorm,
}
# The norm's elementwise weight: Gemma's RMSNorm multiplies by 1 + weight.
GAMMAS = {
    "gemma3_text": lambda norm: 1.0 + norm.weight,
    "olmo2": lambda norm: norm.weight,
}
EPS = {
    "gemma3_text": lambda norm: norm.eps,
    "olmo2": lambda norm: norm.variance_epsilon,
}
PARALLEL_PARTS = {
    "gptj": lambda block: (block.attn.out_proj, block.mlp),
    "phi": lambda block: (block.self_attn.dense, block.mlp),
    "falcon": lambda block: (block.self_attention.dense, block.mlp),
}


def _outputs_of(model, lens, ids, modules):
    """The outputs of ``modules`` (per block, a list) in the head trace."""
    seen = {}

    def keep(key, output):
        seen.setdefault(key, output.detach().clone())

    handles = [
        m.register_forward_hook(lambda m, a, o, key=(j, i): keep(key, o))
        for j, group in enumerate(modules)
        for i, m in enumerate(group)
    ]
    try:
        with torch.no_grad():
            path = lens.trace_path(ids, granularity="head")
    finally:
        for h in handles:
            h.remove()
    return path, seen


@pytest.mark.parametrize("arch", sorted(POST_NORMS))
def test_post_norm_heads_reproduce_the_normalised_attention_output(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (2, 5))
    blocks = model_parts(model).blocks
    inputs = {}

    def keep(j, z):
        inputs.setdefault(j, z.detach().clone())

    pre = [
        b.self_attn.o_proj.register_forward_pre_hook(lambda m, a, j=j: keep(j, a[0]))
        for j, b in enumerate(blocks)
    ]
    try:
        path, seen = _outputs_of(
            model, lens, ids, [[POST_NORMS[arch](b)] for b in blocks]
        )
    finally:
        for h in pre:
            h.remove()
    n_heads = model.config.num_attention_heads
    for j, block in enumerate(blocks):
        u = path.components[:, :, j]
        torch.testing.assert_close(u.sum(2), seen[j, 0], atol=1e-6, rtol=1e-6)
        # Each head's output through o_proj, times the norm's weight and the one
        # factor 1 / rms(o) of its position, o the projection's whole output.
        weight = block.self_attn.o_proj.weight
        z = inputs[j].view(2, 5, n_heads, -1)
        o_h = torch.einsum("bthe,dhe->bthd", z, weight.view(len(weight), n_heads, -1))
        norm = POST_NORMS[arch](block)
        rms = (o_h.sum(2).square().mean(-1, keepdim=True) + EPS[arch](norm)).sqrt()
        expected = GAMMAS[arch](norm) * o_h / rms.unsqueeze(2)
        torch.testing.assert_close(u, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(PARALLEL_PARTS))
def test_parallel_components_reproduce_attention_and_mlp(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (2, 5))
    blocks = model_parts(model).blocks
    path, seen = _outputs_of(
        model, lens, ids, [PARALLEL_PARTS[arch](b) for b in blocks]
    )
    for j in range(2):
        u = path.components[:, :, j]
        attn = u[:, :, :-1].sum(2)
        torch.testing.assert_close(attn, seen[j, 0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(u[:, :, -1], seen[j, 1], atol=0, rtol=0)


@pytest.mark.parametrize("arch", sorted(PROJECTIONS))
def test_head_outputs_reproduce_the_attention_output(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (2, 5))
    seen = {}
    projections = [PROJECTIONS[arch](block) for block in model_parts(model).blocks]
    handles = [
        m.register_forward_hook(lambda m, a, o, j=j: seen.setdefault(j, o.detach()))
        for j, m in enumerate(projections)
    ]
    try:
        with torch.no_grad():
            path = lens.trace_path(ids, granularity="head")
    finally:
        for h in handles:
            h.remove()
    for j in range(2):
        summed = path.components[:, :, j].sum(2)
        torch.testing.assert_close(summed, seen[j].float(), atol=1e-6, rtol=1e-6)
    # Without a bias column the heads alone make the output (Llama has none).
    assert path.components.shape[3] == model.config.num_attention_heads + (
        arch != "llama"
    )


def _gauss_legendre_reference(readout, start, end, components, target, order=48):
    """``∫_0^1 ∇f(start + α (end - start)) · u_c dα`` by Gauss–Legendre quadrature,
    with gradients from autograd."""
    nodes, weights = np.polynomial.legendre.leggauss(order)
    alphas = torch.tensor((nodes + 1) / 2, dtype=torch.float32)
    weights = torch.tensor(weights / 2, dtype=torch.float32)
    points = start + alphas[:, None] * (end - start)
    points.requires_grad_(True)
    prob = readout(points).float().softmax(-1)[:, target]
    (grads,) = torch.autograd.grad(prob.sum(), points)
    return (weights[:, None] * grads).sum(0) @ components.T


def test_prediction_aware_heads_converge_to_the_integrals():
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (1, 6))
    with torch.no_grad():
        path = lens.trace_path(ids, granularity="head")
    readout, target = lens.readout, int(path.targets[0, -1])
    start, end = path.points[0, -1, 3], path.points[0, -1, 4]  # block 1's attention
    u = path.components[0, -1, 1]
    reference = _gauss_legendre_reference(readout, start, end, u, target)
    with torch.no_grad():
        ends_values = readout(torch.stack([start, end])).float().softmax(-1)[:, target]
    errors = []
    for n_steps in (2, 8, 32, 128):
        segment = Segments(
            torch.stack([start, end])[None],
            u[None],
            TokenScore.build(torch.tensor([target])),
            ends_values[None],
        )
        credits, _ = prediction_aware_components(readout, segment, n_steps, 4096)
        assert abs(credits.sum() - (ends_values[1] - ends_values[0])) <= FP32_TOL
        errors.append((credits[0] - reference).abs().max().item())
    assert reference.abs().max() > 1e-3  # the test has something to measure
    assert errors[-1] <= 1e-5
    assert all(b < a for a, b in zip(errors, errors[1:])), errors


def test_cancelling_contributions_do_not_blow_up():
    """Two components that cancel to first order: the step changes are second
    order, the proportional split would divide by ~0; the shares stay bounded."""
    readout = Readout(head=torch.nn.Linear(4, 3, bias=False))
    with torch.no_grad():
        readout.head.weight.copy_(
            torch.tensor([[2.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
        )
    start = torch.zeros(4)
    u = torch.stack(
        [
            torch.tensor([3.0, 0, 0, 0]),
            torch.tensor([-3.0, 0, 0, 0]),
            torch.tensor([0.0, 1e-3, 0, 0]),
        ]
    )
    end = start + u.sum(0)
    ends = torch.stack([start, end])[None]
    with torch.no_grad():
        values = readout(ends[0]).softmax(-1)[:, 0]
    segment = Segments(ends, u[None], TokenScore.build(torch.tensor([0])), values[None])
    credits, _ = prediction_aware_components(readout, segment, 8, 64)
    assert torch.isfinite(credits).all()
    assert abs(credits.sum() - (values[1] - values[0])) <= FP32_TOL
    # ∇f · u: ±3 ∂f/∂x_0, each well inside the size of its own first-order term.
    (grad,) = torch.autograd.grad(
        readout(start.requires_grad_(True)).softmax(-1)[0], start
    )
    first = (u @ grad).abs()
    assert (credits[0].abs() <= first + 1e-3).all()
    # A step whose gradient vanishes altogether splits by ‖u_c‖².
    flat = Readout(head=torch.nn.Linear(4, 3, bias=False))
    with torch.no_grad():
        flat.head.weight.zero_()
    segment = replace(segment, end_values=torch.tensor([[0.1, 0.4]]))
    credits, _ = prediction_aware_components(flat, segment, 4, 64)
    share = u.square().sum(-1) / u.square().sum()
    torch.testing.assert_close(credits[0], 0.3 * share)


# Per architecture, written out here: the attention output projection, the
# final norm's weight, and config overrides (the tiny Gemma's logit softcap of
# 2 holds every logit within ±2: no head could lift one token far).
PLANTED = {
    "llama": (
        lambda block: block.self_attn.o_proj,
        lambda model: model.model.norm.weight,
        {},
    ),
    "gemma3_text": (  # post-norm
        lambda block: block.self_attn.o_proj,
        lambda model: 1.0 + model.model.norm.weight,
        {"final_logit_softcapping": None},
    ),
    "gptj": (  # parallel
        lambda block: block.attn.out_proj,
        lambda model: model.transformer.ln_f.weight,
        {},
    ),
}


@pytest.mark.parametrize("arch", sorted(PLANTED))
def test_planted_head_gets_the_largest_credit(arch):
    """Block 1's head 2 alone writes the target's unembedding direction (read
    through the final norm's weight); every other head writes noise."""
    projection_of, final_gamma, overrides = PLANTED[arch]
    model = tiny_model(arch, **overrides)
    target, planted = 5, 2
    block = model_parts(model).blocks[1]
    o_proj = projection_of(block)
    head_dim = o_proj.in_features // model.config.num_attention_heads
    cols = slice(planted * head_dim, (planted + 1) * head_dim)
    ids = torch.randint(1, VOCAB, (1, 6))
    seen = {}

    def keep(module, args):
        seen.setdefault("z", args[0].detach().clone())

    handle = o_proj.register_forward_pre_hook(keep)
    with torch.no_grad():
        model(ids)
    handle.remove()
    z = seen["z"][0, -1, cols]
    with torch.no_grad():
        direction = model.lm_head.weight[target] * final_gamma(model)
        direction = direction - direction.mean()  # what a LayerNorm keeps
        o_proj.weight.mul_(0.05)
        o_proj.weight[:, cols] = 4.0 * torch.outer(direction, z) / z.square().sum()
    lens = LayerIGLens.from_model(model)
    result = lens.attribute_map(ids, target=target, positions=-1, granularity="head")
    names = result.layer_names
    heads = [i for i, n in enumerate(names) if ".attn.h" in n]
    best = max(heads, key=lambda i: result.attributions[0, 0, i].item())
    assert names[best] == f"1.attn.h{planted}"
    others = [abs(result.attributions[0, 0, i].item()) for i in heads if i != best]
    assert result.attributions[0, 0, best] > 3 * max(others)


@pytest.mark.parametrize("arch", sorted(NO_SPLIT))
def test_no_split_is_refused_and_leaves_no_hook(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="granularity.*'head'"):
        lens.attribute_map(torch.randint(0, VOCAB, (1, 4)), granularity="head")
    with pytest.raises(ValueError, match="granularity"):
        lens.segment_names("head")
    assert hook_snapshot(model) == hooks


def test_skipped_blocks_are_refused_and_leave_no_hook():
    model = tiny_model("llama", num_hidden_layers=3)
    lens = LayerIGLens.from_model(model, layers=[0])  # blocks 0 and 2
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="consecutive"):
        lens.attribute_map(torch.randint(1, VOCAB, (1, 4)), granularity="head")
    assert hook_snapshot(model) == hooks
    # Refused from the structure alone, before any forward.
    with pytest.raises(ValueError, match=r"consecutive blocks, got blocks \[0, 2\]"):
        lens.segment_names("head")
    # From block 1 on, blocks below are the "input" column.
    lens = LayerIGLens.from_model(model, layers=[1])
    ids = torch.randint(1, VOCAB, (1, 4))
    heads = lens.attribute_map(ids, granularity="head")
    blocks = lens.attribute_map(ids)
    first = heads.layer_names.index("1.mlp")
    torch.testing.assert_close(
        heads.attributions[..., : first + 1].sum(-1),
        blocks.attributions[..., 0],
        atol=FP32_TOL,
        rtol=0,
    )
    assert heads.attributions[..., 0].abs().max() > 0


def test_skipped_blocks_behind_a_plain_function_are_refused_when_captured():
    # A forward function that is not a module names no block list: the split
    # of the captured head outputs is what refuses the skipped block.
    model = tiny_model("llama", num_hidden_layers=3)
    lens = LayerIGLens.from_model(model, layers=[0])  # blocks 0 and 2
    hand_built = LayerIGLens(
        lambda ids: lens.forward_func(ids),
        lens.layers,
        readout=lens.readout,
        input_layer=lens.input_layer,
        layer_names=lens.layer_names,
        sublayers=lens.sublayers,
        block_parts=lens.block_parts,
    )
    assert hand_built.segment_names("head")[0] == "input"
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="sum of its heads' outputs"):
        hand_built.attribute_map(torch.randint(1, VOCAB, (1, 4)), granularity="head")
    assert hook_snapshot(model) == hooks


@pytest.mark.real_model
def test_real_model_heads_add_up(embedded_model):
    # smollm2 is sequential; gemma3 normalises its attention output (post-norm).
    _, model, tokenizer = embedded_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = LayerIGLens.from_model(model)
    n_blocks = len(lens.layers)
    kwargs = dict(positions=[-3, -2, -1], n_steps=4)
    heads = lens.attribute_map(ids, granularity="head", **kwargs)
    subs = lens.attribute_map(ids, granularity="sublayer", **kwargs)
    blocks = lens.attribute_map(ids, **kwargs)
    attn, mlp = _blocks_of(heads, n_blocks)
    assert heads.attributions.shape[-1] == 1 + n_blocks * (
        model.config.num_attention_heads + 1
    )
    assert (attn - subs.attributions[..., 0::2]).abs().max() <= FP32_TOL
    assert (attn + mlp - blocks.attributions).abs().max() <= FP32_TOL
    assert heads.delta.abs().max() <= FP32_TOL


@pytest.mark.real_model
def test_real_model_prediction_aware_heads_match_the_integrals(default_model):
    model, tokenizer = default_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = LayerIGLens.from_model(model)
    kwargs = dict(positions=[-2, -1], granularity="head")
    ours = lens.attribute_map(ids, n_steps=128, **kwargs)
    reference = lens.attribute_map(ids, method="gausslegendre", n_steps=64, **kwargs)
    moved = (ours.model_prob - ours.base_prob).abs() > 0.05
    assert moved.any()
    heads = [i for i, n in enumerate(ours.layer_names) if ".attn." in n]
    error = (ours.attributions - reference.attributions)[..., heads][moved]
    assert error.abs().max() <= 1e-3


def test_float64_model_heads_add_up_with_prediction_aware():
    # The head split's components are float32; a float64 model's gradients
    # met them in one einsum and failed ("expected scalar type Float").
    model = tiny_model("llama").double()
    lens = LayerIGLens.from_model(model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    result = lens.attribute_map(ids, granularity="head")
    attrs, delta = lens.attribute(
        ids, granularity="head", n_steps=8, return_convergence_delta=True
    )
    assert result.delta.abs().max() <= 1e-6 and delta.abs().max() <= 1e-6
    assert attrs[0].dtype == torch.float64


@pytest.mark.parametrize("granularity", ["head", "source"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_split_on_the_cpu_reads_float32(
    monkeypatch, granularity, dtype
):
    # A backward through a float16 head is tens of times slower on the CPU
    # than in float32: every gradient of the split is taken in float32, and
    # the model's own weights stay as they were.
    model = tiny_model("llama").to(dtype)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    read = []
    original = Readout.score

    def spy(self, hidden, score, layer=None):
        read.append((hidden.dtype, self.head(hidden).dtype))
        return original(self, hidden, score, layer)

    monkeypatch.setattr(Readout, "score", spy)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = LayerIGLens.from_model(model).attribute_map(
        ids, granularity=granularity, n_steps=4
    )
    assert read and set(read) == {(torch.float32, torch.float32)}
    assert model.lm_head.weight.dtype == dtype
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert found.delta.abs().max() < 1e-5


def test_a_readout_that_cannot_be_copied_is_warned_of_in_one_line(monkeypatch):
    from captum_iglens.attr.granularities import components

    def refuse(readout):
        raise TypeError("cannot pickle '_thread.lock' object")

    monkeypatch.setattr(components, "float32_copy", refuse)
    model = tiny_model("llama").half()
    with pytest.warns(UserWarning) as caught:
        LayerIGLens.from_model(model).attribute_map(
            torch.tensor([[3, 5, 7, 9]]), granularity="head", n_steps=2
        )
    (message,) = [str(w.message) for w in caught if "float32" in str(w.message)]
    assert "\n" not in message and "'head'" in message and "float16" in message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_float32_readout_never_copies_the_half_unembedding_whole(
    monkeypatch, dtype, bias
):
    # A float32 copy of a 128k x 4096 bfloat16 head is 2 GiB: the split's
    # float32 readout reads the model's own head weight a slice at a time, in
    # the forward and in the backward, and gives float32 values and gradients.
    from captum_iglens.attr._utils import float32

    torch.manual_seed(0)
    d, vocab = 8, 50
    head = torch.nn.Linear(d, vocab, bias=bias).to(dtype)
    norm = torch.nn.LayerNorm(d).to(dtype)
    readout = Readout(head, norm)
    before = {k: v.clone() for k, v in readout.state_dict().items()}
    monkeypatch.setattr(float32, "WEIGHT_BYTES", 7 * 4 * d)  # seven rows of W
    sizes = []
    parts = float32.float32_parts

    def spy(weight, dim, device):
        for part, copy in parts(weight, dim, device):
            sizes.append(copy.numel())
            yield part, copy

    monkeypatch.setattr(float32, "float32_parts", spy)
    wide = float32.float32_copy(readout)
    assert wide.head.weight.data_ptr() == head.weight.data_ptr()
    reference = Readout(
        torch.nn.Linear(d, vocab, bias=bias).float(), torch.nn.LayerNorm(d)
    )
    reference.load_state_dict({k: v.float() for k, v in before.items()})
    h = torch.randn(3, 2, d, dtype=torch.float32, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_(True)
    logits, expected = wide(h), reference(h_ref)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected)
    weights = torch.randn(vocab)
    (grad,) = torch.autograd.grad((logits * weights).sum(), h)
    (grad_ref,) = torch.autograd.grad((expected * weights).sum(), h_ref)
    torch.testing.assert_close(grad, grad_ref)
    assert sizes and max(sizes) <= 7 * d and sum(sizes) == 2 * vocab * d
    after = readout.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert readout.head is head and head.weight.dtype == dtype
