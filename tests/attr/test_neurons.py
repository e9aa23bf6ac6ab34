"""Neuron resolution: each block's MLP credit split across its neurons."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.granularities.neurons import top_neurons
from captum_iglens.hf import model_parts
from tests.helpers import hook_snapshot, left_padded
from tests.tiny_models import ARCHITECTURES, VOCAB, tiny_model

FP32_TOL = 1e-6
# Sequential blocks with a plain MLP (post-norm ones: through the post-MLP
# RMSNorm's factor). Written out here, independently of the table.
DENSE = [
    ("llama", {}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("gemma", {}),
    ("phi3", {}),
    ("smollm3", {}),
    ("granite", {"residual_multiplier": 0.5}),
    ("gpt2", {}),
    ("opt", {}),
    ("opt-project-out", {}),
    ("olmo", {}),
    ("bloom", {}),
    ("stablelm", {}),
    ("gpt_neox", {"use_parallel_residual": False}),
    ("falcon", {"parallel_attn": False, "new_decoder_architecture": False}),
    ("gemma2", {}),
    ("gemma3_text", {}),
    ("olmo2", {}),
    ("olmo3", {}),
]
# Mixtures of experts, parallel blocks, hybrids and Gemma 4 (which rescales the
# whole stream after its MLP): refused.
REFUSED = sorted(set(ARCHITECTURES) - {arch for arch, _ in DENSE})


def _mlp_columns(result, block):
    return [
        i for i, n in enumerate(result.layer_names) if n.startswith(f"{block}.mlp.")
    ]


@pytest.mark.parametrize("arch, overrides", DENSE)
def test_neurons_add_up_to_the_mlp_credit(arch, overrides):
    model = tiny_model(arch, **overrides)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    extra = (mask,)
    for method, n_steps in (("prediction_aware", 3), ("gausslegendre", 4)):
        kwargs = dict(additional_forward_args=extra, method=method, n_steps=n_steps)
        neurons = lens.attribute_map(ids, granularity="neuron", **kwargs)
        subs = lens.attribute_map(ids, granularity="sublayer", **kwargs)
        names = neurons.layer_names
        for j in range(2):
            columns = _mlp_columns(neurons, j)
            assert len(columns) >= 32  # every neuron (intermediate sizes 64, ...)
            mlp = neurons.attributions[..., columns].sum(-1)
            assert (mlp - subs.attributions[..., 2 * j + 1]).abs().max() <= FP32_TOL
            attn = neurons.attributions[..., names.index(f"{j}.attn")]
            assert (attn - subs.attributions[..., 2 * j]).abs().max() <= FP32_TOL
        assert neurons.attributions.abs().max() > 1e-4
        if method == "prediction_aware":
            assert neurons.delta.abs().max() <= FP32_TOL


def test_every_neuron_is_a_column_and_per_dimension_agrees():
    model = tiny_model("llama")
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(1, VOCAB, (2, 5))
    names = lens.segment_names("neuron")
    n_neurons = model.config.intermediate_size
    assert names[:2] == ["0.attn", "0.mlp.n0"]
    assert names[-1] == f"1.mlp.n{n_neurons - 1}"
    assert len(names) == 2 * (1 + n_neurons)
    attrs, delta = lens.attribute(
        ids, granularity="neuron", n_steps=4, return_convergence_delta=True
    )
    result = lens.attribute_map(ids, granularity="neuron", n_steps=4)
    assert delta.abs().max() <= FP32_TOL and len(attrs) == len(names)
    per_column = torch.stack([a.sum(-1) for a in attrs], -1)
    assert (per_column - result.attributions).abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch", REFUSED)
def test_no_neuron_split_is_refused_and_leaves_no_hook(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="granularity"):
        lens.attribute_map(torch.randint(1, VOCAB, (1, 4)), granularity="neuron")
    assert hook_snapshot(model) == hooks


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_planted_neuron_tops_the_neuron_list(arch):
    """Block 1's neuron 17 writes the target's unembedding direction (through
    the final norm's weight); every other neuron's output is scaled down."""
    gemma = arch.startswith("gemma")
    model = tiny_model(arch, **({"final_logit_softcapping": None} if gemma else {}))
    target, planted = 5, 17
    block = model_parts(model).blocks[1]
    down = block.mlp.down_proj
    ids = torch.randint(1, VOCAB, (1, 6))
    seen = {}

    def keep(module, args):
        seen.setdefault("a", args[0].detach().clone())

    handle = down.register_forward_pre_hook(keep)
    with torch.no_grad():
        model(ids)
    handle.remove()
    a = seen["a"][0, -1, planted].item()
    gamma = model.model.norm.weight + (1.0 if gemma else 0.0)
    with torch.no_grad():
        direction = model.lm_head.weight[target] * gamma
        down.weight.mul_(0.05)
        down.weight[:, planted] = 10.0 * direction / a
    lens = LayerIGLens.from_model(model)
    result = lens.attribute_map(ids, target=target, positions=-1, granularity="neuron")
    top = top_neurons(result.attributions[0, 0], result.layer_names, 3)
    assert top["1"][0][0] == planted
    credits = [abs(c) for i, c in top["1"][1:-1]]
    assert top["1"][0][1] > 3 * max(credits)
    assert top["1"][0][1] > 0.1


def test_top_neurons_keep_the_strongest_and_add_up():
    names = ["0.attn", "0.mlp.n0", "0.mlp.n1", "0.mlp.n2", "0.mlp.bias", "1.attn"]
    names += ["1.mlp.n0", "1.mlp.n1"]
    credits = torch.tensor([9.0, 0.1, -0.5, 0.2, 0.05, 7.0, 0.3, -0.01])
    top = top_neurons(credits, names, 2)
    assert top["0"][:2] == [(1, -0.5), (2, pytest.approx(0.2))]
    assert top["0"][2] == (-1, pytest.approx(0.1 + 0.05))
    assert top["1"][:2] == [(0, pytest.approx(0.3)), (1, pytest.approx(-0.01))]
    assert top["1"][2] == (-1, pytest.approx(0.0, abs=1e-7))
    with pytest.raises(ValueError, match="k: expected a positive int"):
        top_neurons(credits, names, 0)


@pytest.mark.real_model
def test_real_model_neurons_add_up(embedded_model):
    _, model, tokenizer = embedded_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = LayerIGLens.from_model(model)
    kwargs = dict(positions=[-2, -1], n_steps=4)
    neurons = lens.attribute_map(ids, granularity="neuron", **kwargs)
    subs = lens.attribute_map(ids, granularity="sublayer", **kwargs)
    assert neurons.delta.abs().max() <= FP32_TOL
    for j in range(len(lens.layers)):
        mlp = neurons.attributions[..., _mlp_columns(neurons, j)].sum(-1)
        assert (mlp - subs.attributions[..., 2 * j + 1]).abs().max() <= FP32_TOL


@pytest.mark.parametrize(
    "granularity, kind", [("neuron", "neurons"), ("head", "heads")]
)
def test_cli_prints_each_answer_tokens_top_parts(tmp_path, capsys, granularity, kind):
    from captum_iglens import IGLensResult
    from captum_iglens.cli import main
    from tests.helpers import word_tokenizer

    folder = tmp_path / "model"
    tiny_model("llama").save_pretrained(folder)
    word_tokenizer(128).save_pretrained(folder)
    out = str(tmp_path / "r.json")
    args = ["w5 w6", "--model", str(folder), "--no-chat", "--max-new-tokens", "2"]
    assert main([*args, "--granularity", granularity, "--json", out]) == 0
    printed = capsys.readouterr().out
    assert f"top {kind} (by |credit|, 5 each):" in printed
    result = IGLensResult.load(out)
    names = result.layer_names
    pattern = ".mlp.n" if kind == "neurons" else ".attn.h"
    columns = [i for i, n in enumerate(names) if pattern in n]
    lines = [line for line in printed.splitlines() if f": {kind} " in line]
    rows = result.mask[0].nonzero()[:, 0].tolist()
    assert len(lines) == len(rows) == 2
    for line, p in zip(lines, rows):
        best = max(columns, key=lambda i: abs(float(result.attributions[0, p, i])))
        assert line.split(f"{kind} ")[1].startswith(f"{names[best]} ")
