"""Text in and out: encoding, one pad/stop policy, batched greedy generation,
teacher forcing."""

import pytest
import torch

from captum_iglens.hf import (
    encode_answer,
    encode_prompt,
    generate,
    left_pad,
    pad_token_id,
    stop_token_ids,
    teacher_forcing,
)
from tests.helpers import word_tokenizer
from tests.tiny_models import VOCAB


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(VOCAB)


class Bare:
    """A tokenizer with only Captum's TokenizerLike attributes."""

    eos_token_id = None


def test_pad_and_stop_policy(tokenizer):
    assert pad_token_id(tokenizer) == 0
    assert stop_token_ids(tokenizer) == [2]
    assert pad_token_id(Bare()) == 0 and stop_token_ids(Bare()) == []
    no_pad = Bare()
    no_pad.eos_token_id = 9
    assert pad_token_id(no_pad) == 9 and stop_token_ids(no_pad) == [9]


def test_left_pad():
    ids, mask = left_pad([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="sequences"):
        left_pad([], 0)


def test_batched_generation_equals_one_at_a_time(llama, tokenizer):
    prompts = [
        encode_prompt(tokenizer, text)[0] for text in ("w5 w6 w7 w8", "w9", "w10 w11")
    ]
    together = generate(llama, tokenizer, prompts, max_new_tokens=5)
    for prompt, answer in zip(prompts, together):
        (alone,) = generate(llama, tokenizer, [prompt], max_new_tokens=5)
        assert torch.equal(answer, alone)
        assert 2 not in answer.tolist()  # cut at the stop token
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(llama, tokenizer, prompts, max_new_tokens=0)


def test_teacher_forcing_spans(tokenizer):
    prompt = encode_prompt(tokenizer, "w5 w6 w7")
    answer = encode_answer(tokenizer, "w8 w9")
    ids, pos, targets = teacher_forcing(prompt, answer, "answer")
    assert ids.tolist() == [[5, 6, 7, 8, 9]]
    assert pos.tolist() == [2, 3] and targets.tolist() == [[8, 9]]
    assert teacher_forcing(prompt, answer, "prompt")[1].tolist() == [0, 1]
    assert teacher_forcing(prompt, answer, "all")[1].tolist() == [0, 1, 2, 3]
    assert teacher_forcing(prompt, answer[:0], "answer")[1].numel() == 0
    with pytest.raises(ValueError, match="positions"):
        teacher_forcing(prompt, answer, "middle")
    with pytest.raises(ValueError, match="prompt"):
        encode_prompt(tokenizer, "  ")


def test_partial_multibyte_tokens_show_their_bytes():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from captum_iglens._utils.tokens import decode_tokens

    # Byte-level BPE without merges: every UTF-8 byte is its own token.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer, tok.decoder = byte_level, decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    text = "a是🙂"
    ids = tokenizer.encode(text)
    assert len(ids) == 1 + 3 + 4
    expected = ["a"] + [f"\\x{b:02x}" for b in text[1:].encode("utf-8")]
    assert decode_tokens(tokenizer, ids) == expected

    class ByteFallback:  # a SentencePiece-style tokenizer with <0x..> pieces
        def decode(self, ids):
            return "\ufffd"

        def convert_ids_to_tokens(self, i):
            return f"<0x{i:02X}>"

    assert decode_tokens(ByteFallback(), [0xE6, 0x41]) == ["\\xe6", "A"]
    # What each layer predicts (the viewer's top-1 cells) reads the same way.
    from captum_iglens.hf.text import decoded_top_tokens

    top = torch.tensor(ids).reshape(1, 1, 1, -1)
    assert decoded_top_tokens(tokenizer, top) == [[[expected]]]


def test_generation_stops_at_the_context_length(llama, tokenizer):
    prompt = encode_prompt(tokenizer, "w5 w6 w7", chat=False)[0]
    context = llama.config.max_position_embeddings
    # Never stopping: the stop tokens are not stop tokens for this call.
    never = dict(eos_token_id=None)
    with pytest.warns(UserWarning, match=f"capped at {context - len(prompt)}"):
        (answer,) = generate(
            llama, tokenizer, [prompt], max_new_tokens=10**6, gen_args=never
        )
    assert len(prompt) + len(answer) <= context
    with pytest.raises(ValueError, match="no room"):
        generate(llama, tokenizer, [torch.ones(context, dtype=torch.long)])


def test_no_chat_template_is_said(tokenizer):
    assert not getattr(tokenizer, "chat_template", None)
    with pytest.warns(UserWarning, match="raw prompt"):
        encode_prompt(tokenizer, "w5", chat=True)


def test_a_sequence_longer_than_the_context_is_said(llama, tokenizer):
    # Issue 48: a prompt longer than max_position_embeddings ran without a word.
    import warnings

    from captum_iglens.hf.text import answered_prompt

    context = llama.config.max_position_embeddings
    words = " ".join(f"w{5 + i % 20}" for i in range(context))
    with pytest.warns(UserWarning, match=f"more than the {context} positions"):
        answered_prompt(llama, tokenizer, words, answer="w5", chat=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        answered_prompt(llama, tokenizer, "w5 w6", answer="w7", chat=False)
