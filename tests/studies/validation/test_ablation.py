"""Causal ablation of blocks, and planted mechanisms that IG-Lens and ablation find."""

import matplotlib
import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.studies.validation import stats
from captum_iglens.hf import model_parts
from captum_iglens.studies.validation.ablation import ablate, mean_updates
from tests.helpers import (
    assert_state_unchanged,
    hook_snapshot,
    left_padded,
    state_snapshot,
)
from tests.tiny_models import VOCAB, tiny_model

matplotlib.use("Agg")

FP32_TOL = 1e-6


# --------------------------------------------------------------------- ablation


def _forward_probs(model, ids, mask, positions, targets):
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids
        ).logits
    probs = logits[:, positions].float().softmax(-1)
    return probs.gather(-1, targets[..., None])[..., 0]


def _one_at_a_time(model, ids, mask, positions, targets, mode, means=None):
    """The reference: one forward per ablated block (and position), own hook."""
    blocks = model_parts(model).blocks
    out = torch.zeros(*targets.shape, len(blocks))
    first = torch.arange(ids.shape[1])[None] == mask.argmax(-1)[:, None]
    for j, block in enumerate(blocks):
        where = (
            list(enumerate(positions)) if mode == "zero-at-position" else [(None, None)]
        )
        for index, position in where:

            def hook(module, args, kwargs, output, j=j, position=position):
                before = args[0] if args else kwargs["hidden_states"]
                if mode == "mean":
                    return before + torch.where(
                        first[..., None], means[j, 0], means[j, 1]
                    )
                if position is None:
                    return before
                edited = output.clone()
                edited[:, position] = before[:, position]
                return edited

            handle = block.register_forward_hook(hook, with_kwargs=True)
            try:
                probs = _forward_probs(model, ids, mask, positions, targets)
            finally:
                handle.remove()
            if index is None:
                out[..., j] = probs
            else:
                out[:, index, j] = probs[:, index]
    return out


@pytest.fixture(scope="module")
def padded():
    torch.manual_seed(0)
    return left_padded([7, 5], VOCAB)


@pytest.mark.parametrize("mode", ["skip", "mean", "zero-at-position"])
def test_batched_ablation_equals_one_at_a_time(llama4, padded, mode):
    ids, mask = padded
    positions = [4, 6]
    targets = torch.tensor([[3, 9], [17, 4]])
    means = None
    if mode == "mean":
        torch.manual_seed(1)
        means = mean_updates(
            llama4, [torch.randint(1, VOCAB, (n,)) for n in (4, 6, 3)], batch_size=2
        )
    reference = _one_at_a_time(llama4, ids, mask, positions, targets, mode, means)
    clean = _forward_probs(llama4, ids, mask, positions, targets)
    for max_batch in (6, 256):  # uneven chunks of 3 copies; everything at once
        result = ablate(
            llama4,
            ids,
            mask,
            positions=positions,
            targets=targets,
            mode=mode,
            means=means,
            max_batch=max_batch,
        )
        assert result.ablated.shape == (2, 2, 4)
        assert (result.ablated - reference).abs().max() <= FP32_TOL
        assert (result.clean - clean).abs().max() <= FP32_TOL
        assert torch.equal(result.drop, result.clean[..., None] - result.ablated)
    assert (
        reference - clean[..., None]
    ).abs().max() > 1e-3  # the ablations do something


def test_mean_updates_by_hand(llama4):
    torch.manual_seed(2)
    sequences = [torch.randint(1, VOCAB, (n,)) for n in (3, 5)]
    updates = {j: [] for j in range(4)}
    handles = [
        block.register_forward_hook(
            lambda m, a, k, o, j=j: updates[j].append((o - a[0])[0]), with_kwargs=True
        )
        for j, block in enumerate(model_parts(llama4).blocks)
    ]
    try:
        for seq in sequences:
            _forward_probs(
                llama4,
                seq[None],
                torch.ones(1, len(seq), dtype=torch.long),
                [0],
                seq[None, :1],
            )
    finally:
        for handle in handles:
            handle.remove()
    means = mean_updates(llama4, sequences, batch_size=2)
    assert means.shape == (4, 2, 32)
    for j in range(4):
        first = torch.stack([u[0] for u in updates[j]]).mean(0)
        others = torch.cat([u[1:] for u in updates[j]]).mean(0)
        assert (means[j, 0] - first).abs().max() <= 1e-5
        assert (means[j, 1] - others).abs().max() <= 1e-5


def test_ablation_owns_and_removes_its_hooks(llama4, padded):
    ids, mask = padded
    before, state = hook_snapshot(llama4), state_snapshot(llama4)
    ablate(
        llama4, ids, mask, positions=[-1], targets=torch.tensor([[1], [2]]), layers=[1]
    )
    mean_updates(llama4, [ids[0]])
    assert hook_snapshot(llama4) == before
    # A failure inside the forward still removes them.
    boom = model_parts(llama4).blocks[3].register_forward_hook(lambda *a: 1 / 0)
    try:
        with pytest.raises(ZeroDivisionError):
            ablate(llama4, ids, mask, positions=[-1], targets=torch.tensor([[1], [2]]))
    finally:
        boom.remove()
    assert hook_snapshot(llama4) == before
    assert_state_unchanged(llama4, state)


def test_ablation_errors(llama4, padded):
    ids, mask = padded
    targets = torch.tensor([[1], [2]])
    with pytest.raises(ValueError, match="mode"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, mode="zero")
    with pytest.raises(ValueError, match="means"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, mode="mean")
    with pytest.raises(ValueError, match="layers"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, layers=[9])


# ------------------------------------------------------------ planted mechanisms

TARGET = 7


def _quiet(model):
    """Every block near identity: attention and MLP outputs scaled by 1e-3."""
    with torch.no_grad():
        for block in model_parts(model).blocks:
            block.self_attn.o_proj.weight.mul_(1e-3)
            block.mlp.down_proj.weight.mul_(1e-3)


def _readout_direction(model):
    """A unit vector of the residual stream that raises the target's logit."""
    with torch.no_grad():
        head = model.lm_head.weight
        u = model.model.norm.weight * (head[TARGET] - head.mean(0))
    return u / u.norm()


def _mlp_activation(model, block, ids, position):
    captured = {}
    handle = block.mlp.down_proj.register_forward_pre_hook(
        lambda m, a: captured.setdefault("a", a[0][0].detach().clone())
    )
    try:
        _forward_probs(model, ids, torch.ones_like(ids), [0], ids[:, :1])
    finally:
        handle.remove()
    return captured["a"]


def _write(block, direction, reading, gain, scale):
    """Set the block's MLP to write ``gain · direction · (reading · a) / scale``."""
    with torch.no_grad():
        block.mlp.down_proj.weight.copy_(gain * torch.outer(direction, reading) / scale)


def _attribute(model, ids, position):
    """IG-Lens credits, skip-ablation drops and the model's probability of TARGET."""
    targets = torch.tensor([[TARGET]])
    lens = LayerIGLens.from_model(model).attribute_map(
        ids, target=targets, positions=[position]
    )
    drops = ablate(model, ids, positions=[position], targets=targets).drop[0, 0]
    return lens.attributions[0, 0], drops, lens.model_prob[0, 0].item()


def test_planted_block_is_found_by_ablation_and_ig_lens():
    model = tiny_model("llama", num_hidden_layers=4)
    _quiet(model)
    ids, planted = torch.tensor([[5, 9, 17, 3]]), 2
    block = model_parts(model).blocks[planted]
    a = _mlp_activation(model, block, ids, 3)[3]
    _write(block, _readout_direction(model), a, 8.0, a @ a)
    credits, drops, prob = _attribute(model, ids, 3)
    assert prob > 0.5
    assert int(credits.argmax()) == planted and int(drops.argmax()) == planted
    assert credits[planted] > 10 * credits.abs()[[0, 1, 3]].max()
    found = stats.agreement(credits.numpy(), drops.numpy())
    assert found["top1"] == 1.0 and found["peak_distance"] == 0.0
    assert found["onset_distance"] == 0.0
    targets = torch.tensor([[TARGET]])
    for mode in ("zero-at-position", "mean"):
        means = mean_updates(model, [ids[0], ids[0, :2]]) if mode == "mean" else None
        other = ablate(
            model, ids, positions=[3], targets=targets, mode=mode, means=means
        )
        assert int(other.drop[0, 0].argmax()) == planted, mode


def test_block_read_only_through_later_attention_makes_them_disagree():
    # Block 1 writes a direction w at position 0 only; blocks 2 and 3 each read it
    # there through uniform attention and write half of the target's direction at
    # position 1. Removing block 1 removes both halves (the largest drop), but the
    # readout at position 1 never sees block 1's update: IG-Lens credits 2 and 3.
    model = tiny_model("llama", num_hidden_layers=4)
    _quiet(model)
    ids, writer = torch.tensor([[5, 9]]), 1
    blocks = model_parts(model).blocks
    u = _readout_direction(model)
    embed = model.model.embed_tokens.weight[ids[0]].detach()
    basis, _ = torch.linalg.qr(torch.stack([u, embed[0], embed[1], torch.randn(32)], 1))
    w = basis[:, 3]  # orthogonal to u and to both embeddings
    a = _mlp_activation(model, blocks[writer], ids, 0)
    v = a[0] - (a[0] @ a[1]) / (a[1] @ a[1]) * a[1]  # reads position 0, not position 1
    _write(blocks[writer], w, v, 10.0, v @ a[0])
    with torch.no_grad():
        for reader in blocks[2:]:
            attention = reader.self_attn
            attention.q_proj.weight.zero_()  # uniform attention over the prefix
            attention.v_proj.weight.zero_()
            attention.v_proj.weight[0] = w
            attention.o_proj.weight.zero_()
            attention.o_proj.weight[:, 0] = 1.4 * u
    credits, drops, prob = _attribute(model, ids, 1)
    assert prob > 0.5
    assert int(drops.argmax()) == writer
    assert int(credits.argmax()) in (2, 3)
    assert credits[writer].abs() < 1e-3 < drops[writer]
    found = stats.agreement(credits.numpy(), drops.numpy())
    assert found["top1"] == 0.0 and found["peak_distance"] >= 1.0
