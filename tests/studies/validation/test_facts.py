"""The shipped facts and the answer check."""

import matplotlib
import pytest

from captum_iglens.studies.validation import (
    Fact,
    load_facts,
)

matplotlib.use("Agg")

FP32_TOL = 1e-6


def test_shipped_prompt_set():
    facts = load_facts()
    assert len(facts) >= 150
    assert len({f.id for f in facts}) == len(facts)
    assert len({f.relation for f in facts}) >= 6
    for fact in facts:
        assert fact.prompt == fact.prompt.strip() and fact.answer
        assert not fact.prompt.endswith(" " + fact.answer)


def test_answer_check():
    fact = Fact("x", "capital", "The capital of Argentina is", "Buenos Aires", ("BA",))
    assert fact.is_answered_by(" Buenos Aires.\n\nIt is")
    assert fact.is_answered_by(' "buenos aires", a city')
    assert fact.is_answered_by(" BA")
    assert not fact.is_answered_by(" Buenos")
    assert not fact.is_answered_by(" Santiago")
    assert Fact("y", "", "text").is_answered_by("anything") is None


def test_load_facts_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "A"}\n\n{"answer": "b"}\n')
    with pytest.raises(ValueError, match=":3: expected an object"):
        load_facts(path)
    path.write_text('{"prompt": "A", "answer": "b", "aliases": ["c"]}\n')
    assert load_facts(path) == [Fact("1", "", "A", "b", ("c",))]


def test_ids_equal_as_text_are_duplicates(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "A"}\n{"id": "1", "prompt": "B"}\n')
    with pytest.raises(ValueError, match=r"\[1\]: duplicate id '1'.*first at \[0\]"):
        load_facts(path)
