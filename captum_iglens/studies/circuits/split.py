r"""
The training pairs (``--train N``), on which every method finds its circuits
(MIB's train split), apart from the scored ones they are evaluated on: the
scored (test) pairs are the first ``--pairs`` filtered pairs, as without
``--train``, and the ``N`` training pairs are drawn by seed from the rest,
leaving out every pair that shares a prompt (clean or counterfactual,
compared as token ids) with a scored pair. The split is recorded by the
pairs' indices in the filtered list and the sha256 of their token ids
(:class:`Split`), and :func:`check_disjoint` refuses any overlap.
"""

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Sequence, Set, Tuple

from captum_iglens._utils.schema import Integer, ListOf, Record, Text
from captum_iglens.studies.circuits.tasks import Encoded


def pairs_sha256(pairs: Sequence[Encoded]) -> str:
    """The sha256 of the pairs' token ids, answers and foils, in order."""
    text = json.dumps([[p.clean, p.counterfactual, p.answer, p.foil] for p in pairs])
    return hashlib.sha256(text.encode()).hexdigest()


def _prompts(pair: Encoded) -> Set[Tuple[int, ...]]:
    return {pair.clean, pair.counterfactual}


def check_disjoint(test: Sequence[Encoded], train: Sequence[Encoded]) -> None:
    r"""
    Refuses training pairs that share a prompt with a scored pair.

    Args:
        test (list[Encoded]): The scored pairs.
        train (list[Encoded]): The training pairs.

    Raises:
        ValueError: Naming the first training pair that shares a prompt (by
            token ids) with a scored pair, and the prompt.
    """
    seen: Dict[Tuple[int, ...], int] = {}
    for i, pair in enumerate(test):
        for prompt in _prompts(pair):
            seen.setdefault(prompt, i)
    for j, pair in enumerate(train):
        for prompt, text in (
            (pair.clean, pair.pair.clean),
            (pair.counterfactual, pair.pair.counterfactual),
        ):
            if prompt in seen:
                raise ValueError(
                    f"train: training pair {j} shares the prompt {text!r} with "
                    f"scored pair {seen[prompt]}; training and scored pairs must "
                    "be disjoint"
                )


@dataclass(frozen=True)
class Split:
    r"""
    Which filtered pairs are scored and which the methods learn from.

    Attributes:

        test (tuple[int, ...]): The scored pairs' indices in the filtered
                    pairs (the first ``--pairs``).
        train (tuple[int, ...]): The training pairs' indices, ascending.
        test_sha256 (str): :func:`pairs_sha256` of the scored pairs.
        train_sha256 (str): Of the training pairs.
        seed (int): The seed they were drawn by.
        shared (int): Pairs left out of the draw for sharing a prompt with a
                    scored pair.
    """

    test: Tuple[int, ...]
    train: Tuple[int, ...]
    test_sha256: str
    train_sha256: str
    seed: int
    shared: int

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["test"], data["train"] = list(self.test), list(self.train)
        return data


#: A :class:`Split` as saved (:meth:`Split.to_dict`), checked where a result
#: that holds one loads (:mod:`captum_iglens._utils.schema`).
SPLIT = Record(
    test=ListOf(Integer()),
    train=ListOf(Integer(), nonempty=True),
    test_sha256=Text(nonempty=True),
    train_sha256=Text(nonempty=True),
    seed=Integer(low=-(2**63)),
    shared=Integer(),
)


class TooFewPairs(ValueError):
    r"""Fewer pairs than ``--train`` are left apart from the scored ones."""


def draw_split(
    kept: Sequence[Encoded], n_test: int, n_train: int, seed: int
) -> Tuple[Split, List[Encoded], List[Encoded]]:
    r"""
    The scored pairs (the first ``n_test`` of ``kept``) and ``n_train``
    training pairs drawn by ``seed`` from the rest, none sharing a prompt
    with a scored pair.

    Args:

        kept (list[Encoded]): The filtered pairs.
        n_test (int): How many are scored.
        n_train (int): How many train, at least 1.
        seed (int): The seed of the draw.

    Returns:
        3-element tuple of the **split**, the **test** pairs and the
        **train** pairs (in the filtered order).

    Raises:
        TooFewPairs: If fewer than ``n_train`` pairs are left, saying how
            many (and how many were left out for sharing a prompt).
    """
    test = list(kept[:n_test])
    prompts = set().union(*map(_prompts, test)) if test else set()
    rest = range(len(test), len(kept))
    free = [i for i in rest if not _prompts(kept[i]) & prompts]
    shared = len(rest) - len(free)
    if len(free) < n_train:
        also = f", {shared} more share a prompt with one" if shared else ""
        raise TooFewPairs(
            f"{len(free)} of the {len(kept)} kept pairs are left to train on "
            f"apart from the {len(test)} scored{also}; expected {n_train}"
        )
    chosen = sorted(random.Random(f"train:{seed}").sample(free, n_train))
    train = [kept[i] for i in chosen]
    check_disjoint(test, train)
    split = Split(
        test=tuple(range(len(test))),
        train=tuple(chosen),
        test_sha256=pairs_sha256(test),
        train_sha256=pairs_sha256(train),
        seed=seed,
        shared=shared,
    )
    return split, test, train
