"""The one reader of prompt files: lines end at ``\\n`` only, and each error
names the file and line."""

import json

import pytest

from captum_iglens.lens_fit.corpus import read_corpus
from captum_iglens.studies.prompts import read_prompts
from captum_iglens.studies.validation import load_facts


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_raw_line_separator_inside_a_json_string_is_kept(tmp_path, separator):
    # json.dumps(ensure_ascii=False) writes these raw; str.splitlines breaks at them.
    text = f"first{separator}second"
    path = tmp_path / "p.jsonl"
    lines = [{"id": 1, "prompt": text, "answer": text}, {"id": 2, "prompt": "b"}]
    path.write_text(
        "\n".join(json.dumps(p, ensure_ascii=False) for p in lines), encoding="utf-8"
    )
    prompts = read_prompts(path)
    assert [p["prompt"] for p in prompts] == [text, "b"]
    assert prompts[0]["answer"] == text
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": text}, ensure_ascii=False), encoding="utf-8")
    assert read_corpus(corpus) == [text]


def test_invalid_utf8_names_the_file_line_and_byte(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b\xe9"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: not valid UTF-8 \(byte 0xe9"):
        read_prompts(path)


def test_a_fact_with_an_empty_answer_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "a", "answer": " "}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p.jsonl\[0\]: 'answer' is empty"):
        load_facts(path)
