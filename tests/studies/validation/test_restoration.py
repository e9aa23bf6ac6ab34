"""Restoration at the attributed position, checked against one forward per
(corruption, block) with the test's own hooks."""

import pytest
import torch

from captum_iglens.attr.subject_noise import embedding_std
from captum_iglens.studies.validation.restoration import restore
from tests.helpers import (
    assert_state_unchanged,
    hook_snapshot,
    left_padded,
    state_snapshot,
)
from tests.tiny_models import VOCAB, tiny_model

FP32_TOL = 1e-6


def _probs(model, ids, mask, targets, noise=None, restore_at=None, clean=None):
    """p(target) at the last position, one plain forward with the test's hooks:
    ``noise`` added to the embeddings, block ``restore_at``'s output at the last
    position replaced by ``clean``."""
    handles = []
    if noise is not None:
        handles.append(
            model.get_input_embeddings().register_forward_hook(
                lambda m, a, o: o + noise
            )
        )
    if restore_at is not None:

        def put_back(module, args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            hidden[:, -1] = clean
            return hidden if not isinstance(output, tuple) else (hidden, *output[1:])

        handles.append(model.model.layers[restore_at].register_forward_hook(put_back))
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    try:
        with torch.no_grad():
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=position_ids
            ).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits[:, -1].softmax(-1).gather(-1, targets[:, None])[:, 0]


def _clean_last_states(model, ids, mask):
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            output_hidden_states=True,
        )
    # hidden_states[L + 1] is block L's output, except the last, which HF gives
    # after the final norm; take that one from a hook instead.
    states = [h[:, -1] for h in out.hidden_states[1:-1]]
    captured = []
    handle = model.model.layers[-1].register_forward_hook(
        lambda m, a, o: captured.append(
            (o[0] if isinstance(o, tuple) else o)[:, -1].clone()
        )
    )
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=position_ids)
    finally:
        handle.remove()
    return states + captured


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model4(request):
    return tiny_model(request.param, num_hidden_layers=4)


@pytest.fixture(scope="module")
def padded():
    torch.manual_seed(0)
    return left_padded([7, 5], VOCAB)


def _subject(mask):
    subject = torch.zeros_like(mask, dtype=torch.bool)
    subject[0, 2:4] = True  # inside the real tokens of both rows (left padding 2)
    subject[1, 3:5] = True
    return subject


def test_noise_restoration_equals_hand_computation(model4, padded):
    ids, mask = padded
    targets = torch.tensor([5, 11])
    subject, std, seeds = _subject(mask), 0.7, (3, 4)
    width = model4.get_input_embeddings().weight.shape[1]
    clean_states = _clean_last_states(model4, ids, mask)
    corrupt, restored = [], []
    for seed in seeds:
        noise = torch.zeros(*ids.shape, width)
        for b, n in enumerate(mask.sum(-1).tolist()):  # per row, its real tokens
            generator = torch.Generator().manual_seed(seed)
            noise[b, -n:] = torch.randn(n, width, generator=generator)
        noise = noise * std * subject[..., None]
        corrupt.append(_probs(model4, ids, mask, targets, noise))
        restored.append(
            torch.stack(
                [
                    _probs(model4, ids, mask, targets, noise, j, clean_states[j])
                    for j in range(4)
                ],
                -1,
            )
        )
    corrupt, restored = torch.stack(corrupt).mean(0), torch.stack(restored).mean(0)
    clean = _probs(model4, ids, mask, targets)
    hooks, state = hook_snapshot(model4), state_snapshot(model4)
    for max_batch in (4, 256):  # chunks of two copies; everything at once
        result = restore(
            model4,
            ids,
            mask,
            targets=targets,
            subject_mask=subject,
            noise_std=std,
            seeds=seeds,
            max_batch=max_batch,
        )
        assert (result.clean - clean).abs().max() <= FP32_TOL
        assert (result.corrupt - corrupt).abs().max() <= FP32_TOL
        assert (result.restored - restored).abs().max() <= FP32_TOL
    assert hook_snapshot(model4) == hooks
    assert_state_unchanged(model4, state)
    assert (corrupt - clean).abs().max() > 1e-3  # the noise does something
    # Restoring the last block's output at the last position gives back the clean
    # probability exactly: recovery 1.
    assert (result.restored[:, -1] - result.clean).abs().max() <= FP32_TOL
    assert (result.recovery[:, -1] - 1).abs().max() <= 1e-4


def test_counterfactual_restoration_equals_hand_computation(model4, padded):
    ids, mask = padded
    targets = torch.tensor([5, 11])
    other = ids.clone()
    other[_subject(mask)] = torch.tensor([40, 41, 42, 43])
    clean_states = _clean_last_states(model4, ids, mask)
    result = restore(model4, ids, mask, targets=targets, corrupted_ids=other)
    corrupt = _probs(model4, other, mask, targets)
    assert (result.corrupt - corrupt).abs().max() <= FP32_TOL
    for j in range(4):
        expected = _probs(model4, other, mask, targets, None, j, clean_states[j])
        assert (result.restored[:, j] - expected).abs().max() <= FP32_TOL
    assert (result.restored[:, -1] - result.clean).abs().max() <= FP32_TOL
    assert (result.restored[:, 0] - result.corrupt).abs().max() > 1e-4


def test_layers_subset_restores_chosen_blocks(model4, padded):
    ids, mask = padded
    targets = torch.tensor([5, 11])
    other = ids.flip(-1) * mask
    full = restore(model4, ids, mask, targets=targets, corrupted_ids=other)
    part = restore(model4, ids, mask, targets=targets, corrupted_ids=other, layers=[1])
    assert part.restored.shape == (2, 2)
    assert (part.restored - full.restored[:, [1, 3]]).abs().max() <= FP32_TOL


def test_embedding_std_by_hand(model4):
    embed = model4.get_input_embeddings()
    scale = float(getattr(embed, "embed_scale", 1.0))  # Gemma scales by sqrt(d)
    expected = (embed.weight.detach().double() * scale).std()
    assert abs(embedding_std(model4, chunk=50) - float(expected)) <= 1e-9 * expected


def test_restore_refuses_both_or_no_corruption(model4, padded):
    ids, mask = padded
    targets = torch.tensor([5, 11])
    with pytest.raises(ValueError, match="corruption"):
        restore(model4, ids, mask, targets=targets)
    with pytest.raises(ValueError, match="corruption"):
        restore(
            model4,
            ids,
            mask,
            targets=targets,
            subject_mask=_subject(mask),
            noise_std=1.0,
            corrupted_ids=ids,
        )
    with pytest.raises(ValueError, match="corrupted_ids"):
        restore(model4, ids, mask, targets=targets, corrupted_ids=ids[:, 1:])


def test_restore_refuses_noise_at_the_restored_position(model4, padded):
    ids, mask = padded
    subject = torch.zeros_like(mask, dtype=torch.bool)
    subject[:, -1] = True
    with pytest.raises(ValueError, match="subject_mask"):
        restore(
            model4,
            ids,
            mask,
            targets=torch.tensor([5, 11]),
            subject_mask=subject,
            noise_std=1.0,
        )
