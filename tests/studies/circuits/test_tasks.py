"""The task format: lines refused by number, lengths checked per tokenizer,
and the shipped generators."""

import json

import pytest

from captum_iglens.studies.circuits.generators import (
    GENERATORS,
    generate,
    single_token_names,
)
from captum_iglens.studies.circuits import tasks
from captum_iglens.studies.circuits.tasks import Pair, encode_pairs, read_task
from tests.tiny_models import tiny_tokenizer

GOOD = {"clean": "t5 t6 t7", "counterfactual": "t5 t8 t7", "answer": "t9", "foil": "t4"}


def _write(tmp_path, lines):
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_task_keeps_line_numbers_and_skips_blank_lines(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), "", json.dumps(dict(GOOD, answer="t7"))])
    pairs = read_task(path)
    assert [p.line for p in pairs] == [1, 3]
    assert pairs[1].answer == "t7"


@pytest.mark.parametrize(
    "bad, expected",
    [
        ("{not json", "task.jsonl:2: not a JSON file"),
        (json.dumps(["a"]), "task.jsonl:2: expected a JSON object"),
        (
            json.dumps({k: v for k, v in GOOD.items() if k != "foil"}),
            "missing ['foil']",
        ),
        (json.dumps(dict(GOOD, extra=1)), "unknown fields ['extra']"),
        (json.dumps(dict(GOOD, clean="")), "'clean' must be a non-empty string"),
        (json.dumps(dict(GOOD, foil="t9")), "'answer' and 'foil' are the same"),
    ],
)
def test_read_task_refuses_a_bad_line_by_number(tmp_path, bad, expected):
    path = _write(tmp_path, [json.dumps(GOOD), bad, json.dumps(GOOD)])
    with pytest.raises(ValueError, match="task.jsonl:2") as error:
        read_task(path)
    assert expected in str(error.value)


def test_read_task_refuses_an_empty_or_missing_file(tmp_path):
    with pytest.raises(ValueError, match="holds no pair"):
        read_task(_write(tmp_path, [""]))
    with pytest.raises(FileNotFoundError, match="--task"):
        read_task(tmp_path / "none.jsonl")


def test_read_task_refuses_a_file_not_in_utf8_by_line_and_byte(tmp_path):
    path = tmp_path / "task.jsonl"
    lines = [json.dumps(GOOD), json.dumps(dict(GOOD, clean="t5 \u00fc t7"))]
    text = "\n".join(lines).replace("\\u00fc", "\u00fc")
    byte = len(lines[0]) + 1 + lines[1].index("\\u00fc")
    for encoding, expected in (
        ("latin-1", f"task.jsonl:2: not UTF-8 (byte {byte} of the file is 0xfc)"),
        ("utf-16", "task.jsonl:1: not UTF-8 (byte 0 of the file is 0xff)"),
    ):
        path.write_bytes(text.encode(encoding))
        with pytest.raises(ValueError, match="^--task: ") as error:
            read_task(path)
        assert expected in str(error.value)
        assert str(error.value).endswith("save the file as UTF-8")


def test_read_task_refuses_a_folder_duplicates_and_a_huge_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="is a folder; expected a JSON Lines file"):
        read_task(tmp_path)
    other = json.dumps(dict(GOOD, foil="t6"))
    path = _write(tmp_path, [json.dumps(GOOD), other, "", json.dumps(GOOD)])
    with pytest.raises(ValueError, match="lines 1 and 4 are the same pair; remove"):
        read_task(path)
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps(dict(GOOD, clean="t5" * 60))])
    monkeypatch.setattr(tasks, "MAX_LINE_BYTES", 100)
    with pytest.raises(ValueError, match="task.jsonl:2: a line longer than 100 bytes"):
        read_task(path)


def test_encode_pairs_refuses_prompts_longer_than_the_context():
    pair = Pair(**dict(GOOD, clean="t5 " * 9, counterfactual="t6 " * 9), line=3)
    with pytest.raises(ValueError, match="line 3: the prompts have 10 tokens, more"):
        encode_pairs([pair], tiny_tokenizer(), context=8)
    assert len(encode_pairs([pair], tiny_tokenizer(), context=10)) == 1


def test_encode_pairs_refuses_unequal_lengths_by_line():
    tokenizer = tiny_tokenizer()
    pairs = [Pair(**GOOD, line=4), Pair(**dict(GOOD, counterfactual="t5 t8"), line=7)]
    with pytest.raises(
        ValueError,
        match="line 7: the clean prompt has 4 tokens and the counterfactual 3",
    ):
        encode_pairs(pairs, tokenizer)
    encoded = encode_pairs(pairs[:1], tokenizer)[0]
    assert encoded.clean == (1, 5, 6, 7)  # BOS, then the words' ids
    assert (encoded.answer, encoded.foil) == (9, 4)


def test_encode_pairs_refuses_answer_and_foil_with_one_first_token():
    pair = Pair(**dict(GOOD, answer="t9 t5", foil="t9 t6"), line=2)
    with pytest.raises(ValueError, match="line 2: the answer .t9 t5. and the foil"):
        encode_pairs([pair], tiny_tokenizer())


@pytest.mark.real_model
def test_generators_on_smollm2(default_model):
    _, tokenizer = default_model
    names = single_token_names(tokenizer)
    assert len(names) >= 20
    assert all(
        len(tokenizer.encode(" " + n, add_special_tokens=False)) == 1 for n in names
    )
    for task in GENERATORS:
        first = generate(task, tokenizer, n=120, seed=3)
        again = generate(task, tokenizer, n=120, seed=3)
        assert [p.to_dict() for p in first.pairs] == [p.to_dict() for p in again.pairs]
        # every distinct pair generated is kept or counted as dropped
        assert len(first.pairs) + sum(first.dropped.values()) == 120
        assert len(first.pairs) > 0
        for pair in first.pairs:
            clean = tokenizer(pair.clean)["input_ids"]
            other = tokenizer(pair.counterfactual)["input_ids"]
            assert len(clean) == len(other) and clean != other
    ioi = generate("ioi", tokenizer, n=50).pairs
    for pair in ioi:  # the answer is the name said once in the clean prompt
        assert pair.clean.count(pair.answer.strip()) == 1
        assert pair.clean.count(pair.foil.strip()) == 2
        assert pair.counterfactual.count(pair.foil.strip()) == 1
