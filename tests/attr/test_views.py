"""What each layer believes (top-k, entropy, KL, rank), contrastive and token-set
targets, and competitor maps, against references computed here from captured
states and the model's own norm and head."""

import re

import pytest
import torch

from captum_iglens import LayerIGLens, competitor_maps
from captum_iglens.hf import model_parts
from captum_iglens.readout.scores import top_tokens
from tests.helpers import block_states, hook_snapshot, left_padded
from tests.tiny_models import VOCAB, tiny_model

ARCHS = ["llama", "gpt2", "gemma2", "opt-project-out", "opt-no-final-norm", "cohere"]
TOP = 4


def _reference_logits(model, states):
    """Logits of every captured state, read out by the model's own modules."""
    parts = model_parts(model)
    norm, head, post = parts.norm, parts.head, parts.post
    out = []
    with torch.no_grad():
        for h in states:
            x = h if norm is None else norm(h)
            z = head(x)
            out.append((z if post is None else post(z)).double())
    return out


def _reference_views(log_p, final_log_p, target):
    probs = log_p.exp()
    top_p, top_ids = probs.topk(TOP, dim=-1)
    entropy = -(probs * log_p).sum(-1)
    kl = (final_log_p.exp() * (final_log_p - log_p)).sum(-1)
    rank = 1 + (log_p > log_p.gather(-1, target[..., None])).sum(-1)
    return top_ids, top_p, entropy, kl, rank


@pytest.mark.parametrize("arch", ARCHS)
def test_views_equal_reference_every_layer(arch):
    model = tiny_model(arch)
    ids, mask = left_padded([6, 4], VOCAB)
    result = LayerIGLens.from_model(model).attribute_map(
        ids, additional_forward_args=(mask,), top_k=TOP
    )
    states, model_logits = block_states(model, ids, mask)
    final = torch.log_softmax(model_logits.double(), -1)
    layers = _reference_logits(model, states[1:-1])  # h_1 .. h_{n-1}
    logs = [torch.log_softmax(z, -1) for z in layers] + [final]  # top: the model's
    target = result.targets
    real = result.mask
    for j, log_p in enumerate(logs):
        top_ids, top_p, entropy, kl, rank = _reference_views(log_p, final, target)
        assert torch.equal(result.top_ids[:, :, j][real], top_ids[real]), j
        assert torch.allclose(
            result.top_probs[:, :, j][real].double(), top_p[real], atol=1e-6
        )
        assert torch.allclose(
            result.entropy[:, :, j][real].double(), entropy[real], atol=1e-5
        )
        assert torch.allclose(result.kl[:, :, j][real].double(), kl[real], atol=1e-5)
        assert torch.equal(result.rank[:, :, j][real], rank[real]), j
    # At the top, the views are the model's own output distribution.
    assert torch.equal(result.kl[:, :, -1], torch.zeros_like(result.kl[:, :, -1]))
    assert (result.rank[:, :, -1][real] == 1).all()  # greedy targets


def test_views_leave_credits_unchanged_and_survive_small_chunks(llama):
    ids, mask = left_padded([7, 5], VOCAB)
    plain = LayerIGLens.from_model(llama).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    tight = LayerIGLens.from_model(llama, max_chunk_bytes=VOCAB * 8 * 3)
    with_views = tight.attribute_map(ids, additional_forward_args=(mask,), top_k=3)
    wide = LayerIGLens.from_model(llama).attribute_map(
        ids, additional_forward_args=(mask,), top_k=3
    )
    assert torch.equal(plain.attributions, wide.attributions)
    assert torch.allclose(plain.attributions, with_views.attributions, atol=1e-6)
    assert plain.top_ids is None
    for name in ("top_ids", "rank"):
        assert torch.equal(getattr(with_views, name), getattr(wide, name))
    for name in ("top_probs", "entropy", "kl"):
        assert torch.allclose(getattr(with_views, name), getattr(wide, name))


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
@pytest.mark.parametrize("n_steps", [1, 3, 20])
def test_contrastive_and_token_set_completeness(arch, n_steps):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    _, logits = block_states(model, ids, mask)
    probs = torch.softmax(logits.double(), -1)
    greedy = probs.gather(-1, logits.argmax(-1, keepdim=True))[..., 0]
    cases = [
        (dict(foil=7), greedy - probs[..., 7]),
        (dict(target_tokens={5, 9, 11}), probs[..., [5, 9, 11]].sum(-1)),
        (
            dict(target_tokens=[5, 9], foil={7, 8}),
            probs[..., [5, 9]].sum(-1) - probs[..., [7, 8]].sum(-1),
        ),
    ]
    for kwargs, expected in cases:
        result = lens.attribute_map(
            ids, additional_forward_args=(mask,), n_steps=n_steps, **kwargs
        )
        real = result.mask
        assert torch.allclose(
            result.model_prob[real].double(), expected[real], atol=1e-6
        ), kwargs
        assert result.delta[real].abs().max() <= 1e-6, kwargs
        attrs, delta = lens.attribute(
            ids,
            additional_forward_args=(mask,),
            n_steps=n_steps,
            return_convergence_delta=True,
            **kwargs,
        )
        assert delta[real].abs().max() <= 1e-6, kwargs
        summed = torch.stack([a.sum(-1) for a in attrs], -1)
        assert torch.allclose(summed, result.attributions, atol=1e-6), kwargs


def test_foil_equal_to_target_gives_zero_credits(lens):
    ids = torch.randint(3, VOCAB, (2, 5))
    target = torch.randint(3, VOCAB, (2, 5))
    result = lens.attribute_map(ids, target=target, foil=target, top_k=2)
    assert torch.equal(result.attributions, torch.zeros_like(result.attributions))
    assert torch.equal(result.model_prob, torch.zeros_like(result.model_prob))
    attrs = lens.attribute(ids, target=target, foil=target, n_steps=4)
    assert all(torch.equal(a, torch.zeros_like(a)) for a in attrs)


def test_contrastive_result_keeps_what_was_attributed(lens, tmp_path):
    ids = torch.randint(3, VOCAB, (1, 5))
    result = lens.attribute_map(ids, target_tokens={4, 6}, foil=9, top_k=2)
    assert result.target_sets[0, 0].tolist() == [4, 6]
    assert result.foils[..., 0].eq(9).all()
    result.save(tmp_path / "r.json")
    loaded = type(result).load(tmp_path / "r.json")
    assert torch.equal(loaded.foils, result.foils)
    assert torch.equal(loaded.target_sets, result.target_sets)
    assert torch.equal(loaded.top_ids, result.top_ids)


def test_rank_of_a_token_set_is_its_best_member(lens):
    ids = torch.randint(3, VOCAB, (1, 4))
    single = lens.attribute_map(ids, target=5, top_k=1)
    other = lens.attribute_map(ids, target=6, top_k=1)
    both = lens.attribute_map(ids, target_tokens={5, 6}, top_k=1)
    assert torch.equal(both.rank, torch.minimum(single.rank, other.rank))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(foil=VOCAB), "foil: token ids must lie in"),
        (dict(foil=-1), "foil: token ids must lie in"),
        (dict(foil=1.5), "foil: expected"),
        (dict(foil=torch.zeros(3, dtype=torch.long)), "foil: expected a token id"),
        (dict(foil=set()), "foil: expected at least one"),
        (dict(target_tokens=set()), "target_tokens: expected at least one"),
        (dict(target_tokens={VOCAB + 3}), "target_tokens: token ids must lie"),
        (dict(target_tokens=[4, 4]), "target_tokens: expected distinct"),
        (dict(target_tokens="w4"), "target_tokens: expected a set"),
        (
            dict(target_tokens=torch.zeros(2, 9, 2, dtype=torch.long)),
            "target_tokens: expected a set of ids or a (2, 5, S)",
        ),
        (
            dict(target_tokens=torch.full((2, 5, 2), -1, dtype=torch.long)),
            "target_tokens: expected at least one token id per position",
        ),
        (dict(top_k=-1), "top_k: expected an int >= 0"),
        (dict(top_k=VOCAB + 1), "top_k: expected at most"),
    ],
)
def test_bad_inputs_raise_and_leave_no_hook(llama, lens, kwargs, message):
    ids = torch.randint(3, VOCAB, (2, 5))
    before = hook_snapshot(llama)
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        lens.attribute_map(ids, **kwargs)
    if "top_k" not in kwargs:
        with pytest.raises((ValueError, TypeError), match=re.escape(message)):
            lens.attribute(ids, n_steps=2, **kwargs)
    assert hook_snapshot(llama) == before


def test_competitor_maps_follow_the_model_top_tokens(llama, lens):
    ids, mask = left_padded([6, 3], VOCAB)
    maps = competitor_maps(lens, ids, n=3, additional_forward_args=(mask,))
    _, logits = block_states(llama, ids, mask)
    expected = logits.topk(3, dim=-1).indices
    for i, found in enumerate(maps):
        real = found.mask
        assert torch.equal(found.targets[real], expected[..., i][real])
        assert found.delta[real].abs().max() <= 1e-6
        assert found.metadata["competitor"] == i
    with pytest.raises(ValueError, match="target: competitor_maps chooses"):
        competitor_maps(lens, ids, target=3)
    with pytest.raises(ValueError, match="n: expected an int >= 1"):
        competitor_maps(lens, ids, n=0)


@pytest.mark.real_model
def test_real_model_views_and_contrastive_completeness(default_model):
    model, tokenizer = default_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    mask = torch.ones_like(ids)
    lens = LayerIGLens.from_model(model)
    positions = [-3, -2, -1]
    result = lens.attribute_map(ids, positions=positions, top_k=TOP)
    states, model_logits = block_states(model, ids, mask)
    pos = torch.tensor(positions) % ids.shape[1]
    final = torch.log_softmax(model_logits.double()[:, pos], -1)
    layers = _reference_logits(model, [h[:, pos] for h in states[1:-1]])
    logs = [torch.log_softmax(z, -1) for z in layers] + [final]
    for j, log_p in enumerate(logs):
        top_ids, top_p, entropy, kl, rank = _reference_views(
            log_p, final, result.targets
        )
        assert torch.equal(result.top_ids[:, :, j], top_ids), j
        assert torch.allclose(result.top_probs[:, :, j].double(), top_p, atol=1e-5)
        # float32 sums over 49152 terms: relative error ~1e-5
        for name, want in (("entropy", entropy), ("kl", kl)):
            found = getattr(result, name)[:, :, j].double()
            assert torch.allclose(found, want, rtol=1e-4, atol=1e-4), (name, j)
        assert torch.equal(result.rank[:, :, j], rank), j
    paris = [
        tokenizer(t, add_special_tokens=False).input_ids[0] for t in (" Paris", "Paris")
    ]
    lyon = tokenizer(" Lyon", add_special_tokens=False).input_ids[0]
    for kwargs in (dict(foil=lyon), dict(target_tokens=set(paris), foil={lyon})):
        found = lens.attribute_map(ids, positions=[-1], **kwargs)
        assert found.delta.abs().max() <= 1e-6, kwargs
        for n_steps in (1, 4):
            _, delta = lens.attribute(
                ids,
                positions=[-1],
                n_steps=n_steps,
                return_convergence_delta=True,
                **kwargs,
            )
            assert delta.abs().max() <= 1e-6, (kwargs, n_steps)


@pytest.mark.parametrize("vocab", [49152, 49152 + 37, 1000])
@pytest.mark.parametrize("k", [1, 10, 40])
def test_top_tokens_are_torch_topk(vocab, k):
    """The block-maxima search finds torch.topk's entries: the same values in
    the same order, at columns that hold them (tied entries in any order), and
    the same columns where no two entries tie; also with columns after the last
    whole block and a vocabulary searched whole."""
    generator = torch.Generator().manual_seed(vocab + k)
    log_probs = torch.randn(6, vocab, generator=generator).mul(3).log_softmax(-1)
    log_probs[0, -5:] = torch.arange(5.0) + 5  # the largest, past the last block
    log_probs[1] = log_probs[1].round(decimals=1)  # many ties
    log_probs[2, :300] = -float("inf")
    values, ids = top_tokens(log_probs, k)
    expected_values, expected_ids = log_probs.topk(k, dim=-1)
    assert torch.equal(values, expected_values)
    assert torch.equal(log_probs.gather(1, ids), values)
    assert all(len(set(row.tolist())) == k for row in ids)
    untied = [0, 2, 3, 4, 5]
    assert torch.equal(ids[untied], expected_ids[untied])


def test_kl_at_a_128k_vocabulary_keeps_float32_sums_accurate():
    # Each row's cross term is its own product and sum against its position's
    # final distribution (a blocked matrix product over all positions was off
    # by 1.3e-5 nats here, and did G times the work).
    from captum_iglens.readout.scores import FinalDistribution

    torch.manual_seed(0)
    vocab, positions, per = 128256, 4, 17
    final = torch.log_softmax(torch.randn(positions, vocab) * 4, -1)
    noise = torch.randn(positions * per, vocab) * 4
    rows = torch.log_softmax(noise + final.repeat_interleave(per, 0) * 0.5, -1)
    index = torch.arange(positions).repeat_interleave(per)
    found = FinalDistribution.of(final, index).kl(rows)
    q = final.double().exp()[index]
    want = (q * (final.double()[index] - rows.double())).sum(-1)
    assert (found.double() - want).abs().max() < 5e-6
    shuffled = torch.randperm(len(index))  # rows in any order of positions
    again = FinalDistribution.of(final, index[shuffled]).kl(rows[shuffled])
    torch.testing.assert_close(again, found[shuffled], rtol=1e-6, atol=0)
