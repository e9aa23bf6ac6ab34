"""Per-head DLA beside per-head IG-Lens credits, and their rank agreement."""

import pytest
import torch

from captum_iglens.hf import model_parts
from captum_iglens.studies.comparison import (
    compare,
    format_head_agreement,
    head_rank_agreement,
)
from captum_iglens.studies.comparison.heads import spearman
from tests.helpers import left_padded
from tests.tiny_models import VOCAB, tiny_model

POSITIONS = [-2, -1]


@pytest.fixture(scope="module")
def run():
    model = tiny_model("llama")
    torch.manual_seed(0)
    ids, mask = left_padded([6, 4], VOCAB)
    result = compare(
        model,
        ids,
        mask,
        positions=POSITIONS,
        methods=("ig_lens", "dla"),
        granularity="head",
    )
    return model, ids, mask, result


def test_per_head_dla_matches_a_reference(run):
    """Each head's output, by hand: z_h from the test's own hook on o_proj, through
    W_O's head columns, the final norm's weight / rms(h_final) and the target's
    unembedding row."""
    model, ids, mask, result = run
    entry = result.methods["dla"]
    names = entry.layer_names
    assert names == result.methods["ig_lens"].layer_names
    assert (entry.layer_sum - entry.expected).abs().max() <= 1e-5
    seen = {}
    blocks = model_parts(model).blocks
    handles = [
        b.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, j=j: seen.setdefault(j, a[0].detach())
        )
        for j, b in enumerate(blocks)
    ]
    captured = {}
    handles.append(
        blocks[-1].register_forward_hook(lambda m, a, o: captured.setdefault("h", o))
    )
    try:
        with torch.no_grad():
            model(ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    norm, head = model.model.norm, model.lm_head.weight
    h_final = captured["h"][:, POSITIONS]
    rms = (h_final.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()
    reading = head[result.targets] * norm.weight / rms  # (B, P, d)
    n_heads = model.config.num_attention_heads
    for j, block in enumerate(blocks):
        weight = block.self_attn.o_proj.weight
        width = weight.shape[1] // n_heads
        for h in range(n_heads):
            cols = slice(h * width, (h + 1) * width)
            u = seen[j][:, POSITIONS, cols] @ weight[:, cols].T
            expected = (u * reading).sum(-1) * mask[:, POSITIONS]
            got = entry.scores[..., names.index(f"{j}.attn.h{h}")]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rank_agreement_and_table(run):
    *_, result = run
    rho = head_rank_agreement(result)
    assert rho.shape == result.mask.shape
    assert torch.isnan(rho[~result.mask]).all()
    assert ((rho[result.mask] >= -1) & (rho[result.mask] <= 1)).all()
    text = format_head_agreement(result, top=3)
    assert "Spearman" in text and text.count("attn.h") == 3 * int(result.mask[0].sum())


def test_spearman_reference():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.1, 0.4, 0.2, 0.3]])
    b = torch.tensor([[10.0, 20.0, 30.0, 40.0], [4.0, 1.0, 3.0, 2.0]])
    # By hand: identical ranks -> 1; ranks (4,1,3,2) vs (1,4,2,3) -> 1 - 6·Σd²/(n³-n).
    expected = torch.tensor([1.0, 1 - 6 * (9 + 9 + 1 + 1) / 60])
    torch.testing.assert_close(spearman(a, b), expected)
    with pytest.raises(ValueError, match="first/second"):
        spearman(a, b[:, :3])


def test_block_comparison_has_no_head_agreement():
    model = tiny_model("llama")
    ids = torch.randint(1, VOCAB, (1, 5))
    result = compare(model, ids, positions=[-1], methods=("ig_lens", "dla"))
    with pytest.raises(ValueError, match="granularity='head'"):
        head_rank_agreement(result)
