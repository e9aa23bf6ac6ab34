r"""The prompts of the validation study: short factual completions whose next
word is the answer, e.g. ``"The capital of France is"`` → ``"Paris"``."""

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from captum_iglens.studies.prompts import read_prompts

_PUNCTUATION = ".,;:!?\"'()[]«»“”‘’"

#: Where the subject is in the shipped relations' prompts (the span that
#: restoration corrupts); a relation or prompt not matched has no subject.
SUBJECT_PATTERNS = {
    "capital": r"^The capital of (?P<subject>.+) is$",
    "currency": r"^The currency of (?P<subject>.+) is the$",
    "language": r"^The main language spoken in (?P<subject>.+) is$",
    "chemical_symbol": r"^The chemical symbol for (?P<subject>.+) is$",
    "author": r"^The (?:novel|play) (?P<subject>.+) was written by ",
    "planet": r"^The (?P<subject>\w+) planet from the Sun is$",
    "si_unit": r"^The SI unit of (?P<subject>.+) is the$",
    "continent": r"^(?P<subject>.+) is a country on the continent of$",
}


@dataclass(frozen=True)
class Fact:
    r"""
    One prompt of the validation set: a raw-text completion whose next word is the
    answer, e.g. ``"The capital of France is"`` → ``"Paris"``.

    Attributes:

        id (str): A unique name, e.g. ``"capital-01"``.
        relation (str): The kind of fact, e.g. ``"capital"``.
        prompt (str): The text to complete.
        answer (str, optional): The expected next word(s); None if unchecked.
        aliases (tuple[str, ...]): Other accepted spellings of the answer.
        subject (str, optional): The subject's text in the prompt (as in ROME's
                    known-facts file), used before :data:`SUBJECT_PATTERNS`;
                    None to use the patterns.
    """

    id: str
    relation: str
    prompt: str
    answer: Optional[str] = None
    aliases: Tuple[str, ...] = ()
    subject: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        """The fact as a JSON object (``aliases`` as a list; ``subject`` only
        when given)."""
        out: Dict[str, Any] = dict(
            id=self.id,
            relation=self.relation,
            prompt=self.prompt,
            answer=self.answer,
            aliases=list(self.aliases),
        )
        if self.subject is not None:
            out["subject"] = self.subject
        return out

    @classmethod
    def from_dict(cls, record: Dict[str, Any]) -> "Fact":
        """Inverse of :meth:`to_dict` (a missing ``answer`` is None); other keys
        of ``record`` are ignored."""
        return cls(
            id=record["id"],
            relation=record["relation"],
            prompt=record["prompt"],
            answer=record.get("answer"),
            aliases=tuple(record["aliases"]),
            subject=record.get("subject"),
        )

    def is_answered_by(self, text: str) -> Optional[bool]:
        r"""
        Whether a continuation starts with the answer (or an alias), word by word,
        case-insensitively, ignoring surrounding punctuation.

        Returns:
            *bool*, or None when the fact has no answer.
        """
        if self.answer is None:
            return None
        said = _words(text)
        expected = [_words(a) for a in (self.answer, *self.aliases)]
        return any(words and said[: len(words)] == words for words in expected)

    def subject_span(self) -> Optional[Tuple[int, int]]:
        r"""
        The characters of the prompt's subject, e.g. ``"France"`` in ``"The
        capital of France is"``: the last occurrence of ``subject`` when
        given (the one nearest the answer), else from :data:`SUBJECT_PATTERNS`.

        Returns:
            *tuple* ``(start, end)`` of character offsets, or None when the
            given subject is not in the prompt, or without one, when the
            relation has no pattern or the prompt does not match it.
        """
        if self.subject is not None:
            start = self.prompt.rfind(self.subject) if self.subject else -1
            return None if start < 0 else (start, start + len(self.subject))
        pattern = SUBJECT_PATTERNS.get(self.relation)
        found = re.search(pattern, self.prompt) if pattern else None
        return found.span("subject") if found else None


def _words(text: str) -> List[str]:
    return [w.strip(_PUNCTUATION).lower() for w in text.split()]


def load_facts(path: Optional[Union[str, Path]] = None) -> List[Fact]:
    r"""
    Reads a prompt set of facts (see :func:`~captum_iglens.studies.read_prompts`),
    with the optional fields ``relation`` (str), ``aliases`` (list of str) and
    ``subject`` (str, the subject's text in the prompt).

    Args:

        path (str or Path, optional): A ``.jsonl`` file. Default: the set shipped
                    with the package (``captum_iglens/data/facts.jsonl``).

    Returns:
        *list[Fact]*, in file order.
    """
    if path is None:
        with resources.as_file(
            resources.files("captum_iglens").joinpath("data/facts.jsonl")
        ) as shipped:
            return load_facts(shipped)
    facts: List[Fact] = []
    seen: Dict[str, int] = {}
    for index, record in enumerate(read_prompts(path)):
        fact_id = str(record["id"])
        if fact_id in seen:
            raise ValueError(
                f"{path}[{index}]: duplicate id {fact_id!r} (a fact's id is text, so "
                f'1 and "1" are the same id; first at [{seen[fact_id]}])'
            )
        seen[fact_id] = index
        aliases = record.get("aliases", [])
        if not isinstance(aliases, list) or not all(
            isinstance(a, str) for a in aliases
        ):
            raise ValueError(f"{path}[{index}]: 'aliases' must be a list of strings")
        if record.get("answer") is not None and not record["answer"].strip():
            raise ValueError(
                f"{path}[{index}]: 'answer' is empty; a fact's answer is the word "
                "that should follow (leave 'answer' out when it is not checked)"
            )
        subject = record.get("subject")
        if subject is not None and not isinstance(subject, str):
            raise ValueError(f"{path}[{index}]: 'subject' must be a string")
        facts.append(
            Fact(
                id=fact_id,
                relation=str(record.get("relation", "")),
                prompt=record["prompt"],
                answer=record.get("answer"),
                aliases=tuple(aliases),
                subject=subject,
            )
        )
    return facts
