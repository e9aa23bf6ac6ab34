"""The answer attributed is the model's own: generation is checked against the
model's teacher-forced logits, and regenerated without the KV cache where the
cached generation is wrong (as after booting a TransformerLens 4 bridge around
a Hugging Face model). On real weights: the embedded smollm2 inside a bridge
and inside nnsight answers exactly as the plain model does."""

import warnings

import pytest
import torch

from captum_iglens import attribute_text
from captum_iglens.hf.text import encode_prompt, generate, not_greedy
from tests.tiny_models import tiny_model, tiny_tokenizer

PROMPT = "The capital of France is"


def _broken_cache(model, always=False):
    """``model.generate`` whose cached generation puts token 7 everywhere."""
    real = model.generate

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        if always or kwargs.get("use_cache", True):
            out = out.clone()
            out[:, args[0].shape[1] :] = 7
        return out

    model.generate = broken
    return model


def _prompts(tokenizer):
    return [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10])]


def test_a_wrong_cached_generation_is_regenerated_without_the_cache():
    tokenizer = tiny_tokenizer()
    plain = generate(
        tiny_model("llama"), tokenizer, _prompts(tokenizer), max_new_tokens=4
    )
    model = _broken_cache(tiny_model("llama"))
    ids = [torch.cat([p, torch.full((4,), 7)]) for p in _prompts(tokenizer)]
    assert any(not torch.equal(a, b[-4:]) for a, b in zip(plain, ids))
    fixed = generate(model, tokenizer, _prompts(tokenizer), max_new_tokens=4)
    assert all(torch.equal(a, b) for a, b in zip(plain, fixed))


def test_a_generation_that_is_never_greedy_is_refused():
    tokenizer = tiny_tokenizer()
    model = _broken_cache(tiny_model("llama"), always=True)
    with pytest.raises(ValueError, match="not the greedy choice"):
        generate(model, tokenizer, _prompts(tokenizer), max_new_tokens=4)


def test_not_greedy_points_at_the_first_wrong_token():
    model = tiny_model("llama")
    ids, mask = torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6]])).logits[0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    assert not_greedy(model, ids, mask, [torch.tensor([best])]) is None
    assert not_greedy(model, ids, mask, [torch.tensor([worst])]) == (0, 0)


@pytest.fixture(scope="module")
def smollm2_answer():
    """A fresh copy of smollm2 (booting a bridge changes the model) and the
    plain model's answer, generated before any wrapper touches it."""
    from captum_iglens.hf.models import load_embedded

    model, tokenizer = load_embedded("smollm2", progress=False)
    ids = encode_prompt(tokenizer, PROMPT, chat=False)
    (answer,) = generate(model, tokenizer, [ids], max_new_tokens=4)
    return model, tokenizer, answer


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_in_a_bridge_and_in_nnsight_answers_as_the_plain_model(
    smollm2_answer,
):
    pytest.importorskip("transformer_lens")
    pytest.importorskip("nnsight")
    from nnsight import LanguageModel
    from transformer_lens.model_bridge import TransformerBridge

    model, tokenizer, answer = smollm2_answer
    assert tokenizer.decode(answer) == " Paris.\n\n"  # what the model says
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(
            "smollm2", hf_model=model, tokenizer=tokenizer
        )
        lm = LanguageModel(model, tokenizer=tokenizer)
    for wrapper in (bridge, lm):
        result = attribute_text(
            wrapper, tokenizer, PROMPT, chat=False, max_new_tokens=4
        )
        assert result.targets[0].tolist() == answer.tolist(), type(wrapper)
        assert result.delta.abs().max() <= 1e-6
