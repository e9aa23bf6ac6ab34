"""Expert resolution: each mixture-of-experts block's MLP credit split across
its routed experts (and shared experts)."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.hf import model_parts
from tests.helpers import hook_snapshot, left_padded
from tests.tiny_models import VOCAB, tiny_model

FP32_TOL = 1e-6
# Every block a mixture of experts called as experts(x, index, weights);
# Qwen2-MoE adds a shared expert. Written out here, independently of the table.
MOE = ["mixtral", "qwen3_moe", "olmoe", "phimoe", "qwen2_moe"]
# Dense MLPs, a dense block among MoE ones (DeepSeek-V3, GLM-4-MoE: block 0),
# other routers and hybrids: refused.
REFUSED = ["llama", "gpt2", "deepseek_v3", "glm4_moe", "jamba", "gptj"]


def _mlp_columns(names, block):
    return [i for i, n in enumerate(names) if n.startswith(f"{block}.mlp.")]


@pytest.mark.parametrize("arch", MOE)
def test_experts_add_up_to_the_mlp_credit(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    extra = (mask,)
    n_experts = 4
    for method, n_steps in (("prediction_aware", 3), ("gausslegendre", 4)):
        kwargs = dict(additional_forward_args=extra, method=method, n_steps=n_steps)
        experts = lens.attribute_map(ids, granularity="expert", **kwargs)
        subs = lens.attribute_map(ids, granularity="sublayer", **kwargs)
        names = experts.layer_names
        for j in range(2):
            columns = _mlp_columns(names, j)
            shared = arch == "qwen2_moe"
            assert len(columns) == n_experts + shared
            assert (f"{j}.mlp.shared" in names) == shared
            mlp = experts.attributions[..., columns].sum(-1)
            assert (mlp - subs.attributions[..., 2 * j + 1]).abs().max() <= FP32_TOL
            attn = experts.attributions[..., names.index(f"{j}.attn")]
            assert (attn - subs.attributions[..., 2 * j]).abs().max() <= FP32_TOL
        assert experts.attributions.abs().max() > 1e-4
        if method == "prediction_aware":
            assert experts.delta.abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch", REFUSED)
def test_no_expert_split_is_refused_and_leaves_no_hook(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    hooks = hook_snapshot(model)
    with pytest.raises(ValueError, match="granularity"):
        lens.attribute_map(torch.randint(1, VOCAB, (1, 4)), granularity="expert")
    assert hook_snapshot(model) == hooks


def test_planted_expert_tops_the_experts():
    """In block 1 of the tiny Mixtral, one expert the router chose for the last
    token writes the target's unembedding direction; the others are scaled
    down. It gets the largest credit among the experts."""
    model = tiny_model("mixtral")
    target = 5
    block = model_parts(model).blocks[1]
    experts = block.mlp.experts
    ids = torch.randint(1, VOCAB, (1, 6))
    seen = {}

    def keep(module, args):
        seen.setdefault("args", [a.detach().clone() for a in args])

    handle = experts.register_forward_pre_hook(keep)
    with torch.no_grad():
        model(ids)
    handle.remove()
    x, index, weights = seen["args"]
    planted, g = int(index[-1, 0]), float(weights[-1, 0])
    with torch.no_grad():  # Mixtral's expert: down (act(gate) * up)
        gate, up = torch.nn.functional.linear(
            x[-1], experts.gate_up_proj[planted]
        ).chunk(2, dim=-1)
        h = experts.act_fn(gate) * up
        direction = model.lm_head.weight[target] * model.model.norm.weight
        experts.down_proj.mul_(0.05)
        experts.down_proj[planted] = (
            10.0 * torch.outer(direction, h) / (g * h.square().sum())
        )
    lens = LayerIGLens.from_model(model)
    result = lens.attribute_map(ids, target=target, positions=-1, granularity="expert")
    names = result.layer_names
    columns = _mlp_columns(names, 1)
    credits = result.attributions[0, 0, columns]
    best = int(credits.abs().argmax())
    assert names[columns[best]] == f"1.mlp.e{planted}"
    others = credits.abs().clone()
    others[best] = 0
    assert credits[best] > 3 * others.max() and credits[best] > 0.05


def test_cli_prints_each_answer_tokens_top_experts(tmp_path, capsys):
    from captum_iglens import IGLensResult
    from captum_iglens.cli import main
    from tests.helpers import word_tokenizer

    folder = tmp_path / "model"
    tiny_model("mixtral").save_pretrained(folder)
    word_tokenizer(128).save_pretrained(folder)
    out = str(tmp_path / "r.json")
    args = ["w5 w6", "--model", str(folder), "--no-chat", "--max-new-tokens", "2"]
    assert main([*args, "--granularity", "expert", "--json", out]) == 0
    printed = capsys.readouterr().out
    result = IGLensResult.load(out)
    names = result.layer_names
    columns = [i for i, n in enumerate(names) if ".mlp.e" in n]
    lines = [line for line in printed.splitlines() if ": experts " in line]
    rows = result.mask[0].nonzero()[:, 0].tolist()
    assert len(lines) == len(rows) == 2
    for line, p in zip(lines, rows):
        best = max(columns, key=lambda i: abs(float(result.attributions[0, p, i])))
        assert line.split("experts ")[1].startswith(f"{names[best]} ")
