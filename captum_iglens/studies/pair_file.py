r"""
The pair file of ``graph --pairs``: JSON Lines, one object a line,

    {"id": "fr", "prompt": "The capital of France is",
     "counterfactual": "The capital of Italy is", "target": " Paris", "foil": " Rome"}

with a non-empty ``"prompt"`` and, each optional, a ``"counterfactual"`` prompt
or a ``"corrupt_subject"`` (the text whose tokens are noised, as ``graph
--corrupt-subject``), a ``"target"`` and a ``"foil"`` (a token's text or id),
and an ``"id"`` (str or int; the line number otherwise) that names the row's
graph file. A row's fields take the place of the command's: its counterfactual
or subject replaces the command's start, its target and foil the command's.
Blank lines are skipped; the whole file is checked, without torch, before the
model loads, and every refusal names the file and line.
"""

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from captum_iglens.graph.target import check_foil
from captum_iglens.studies.prompts import PromptId, utf8_line

#: The fields a row of a pair file may hold.
PAIR_FIELDS = ("id", "prompt", "counterfactual", "corrupt_subject", "target", "foil")
#: The longest id, in characters: it names a file.
MAX_ID = 100

Token = Union[None, str, int]


@dataclass(frozen=True)
class GraphPair:
    r"""
    One row of a pair file: the prompt of one graph and what replaces the
    command's options for it.

    Attributes:

        id (str or int): The row's id; its graph is ``<id>.json``.
        prompt (str): The prompt.
        counterfactual (str, optional): The path's start, a prompt of the same
                    token length. Default: None (the command's start)
        corrupt_subject (str, optional): The path's start instead: the prompt
                    with this text's tokens noised. Default: None
        target (str or int, optional): The target token. Default: None (the
                    command's, or the model's prediction)
        foil (str or int, optional): The foil token. Default: None (the
                    command's, or the counterfactual's prediction)
        where (str): Where the row came from, for messages (``"p.jsonl:3"``
                    or ``"pairs[2]"``); not part of the row. Default: ``""``
    """

    id: PromptId
    prompt: str
    counterfactual: Optional[str] = None
    corrupt_subject: Optional[str] = None
    target: Token = None
    foil: Token = None
    where: str = ""

    @property
    def name(self) -> str:
        r"""The stem of the row's graph file: its id as text."""
        return str(self.id)

    def row(self) -> Dict[str, Any]:
        r"""The row's fields (not ``where``), the absent ones as None."""
        return {k: v for k, v in asdict(self).items() if k != "where"}

    @classmethod
    def from_dict(
        cls, data: Any, where: str, default_id: Optional[PromptId] = None
    ) -> "GraphPair":
        r"""
        A row from its JSON object, checked; a ``null`` field is absent. The
        prompt and counterfactual are stripped of surrounding white space (as
        ``graph``'s arguments are).

        Args:

            data (Any): The object.
            where (str): Where it came from, for messages.
            default_id (str or int, optional): The id of a row that gives none
                        (or ``null``): its line number or index. Default: None
                        (an id is needed)

        Returns:
            *GraphPair*.

        Raises:
            ValueError: Naming ``where`` and the field, for anything but an
                object of :data:`PAIR_FIELDS` with a non-empty ``prompt``, at
                most one of ``counterfactual`` and ``corrupt_subject`` (found
                in the prompt), an id that can name a file, and a token's text
                or id as ``target`` and ``foil``.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {data!r:.80}")
        unknown = sorted(set(data) - set(PAIR_FIELDS))
        if unknown:
            raise ValueError(
                f"{where}: unknown fields {unknown}; a row holds {list(PAIR_FIELDS)}"
            )
        given = {k: v for k, v in data.items() if v is not None}
        if default_id is not None:
            given.setdefault("id", default_id)
        if "prompt" not in given:
            raise ValueError(f"{where}: missing field 'prompt'")
        for name in ("prompt", "counterfactual", "corrupt_subject"):
            value = given.get(name, "text")
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: {name}: expected a non-empty string")
        for name in ("prompt", "counterfactual"):
            if name in given:
                given[name] = given[name].strip()
        for name in ("target", "foil"):
            _check_token(given.get(name), f"{where}: {name}")
        _check_id(given.get("id"), where)
        if "counterfactual" in given and "corrupt_subject" in given:
            raise ValueError(
                f"{where}: give either counterfactual or corrupt_subject, not both"
            )
        return cls(**given, where=where)


def read_pairs(path: Union[str, Path]) -> List[GraphPair]:
    r"""
    Reads a pair file: every line checked (:meth:`GraphPair.from_dict`; a row
    without an id, or with a ``null`` one, has its line number), and the ids
    unique as file names (:func:`check_pairs`).

    Args:

        path (str or Path): The JSON Lines file.

    Returns:
        *list[GraphPair]*: the rows, in file order, each ``where`` the file
        and line.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If ``path`` is a folder.
        ValueError: Naming the file and line of the first bad row (not UTF-8,
            not JSON, a bad field, a duplicate id), or a file with no row.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; expected a JSON Lines file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    pairs = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        where = f"{path}:{number}"
        line = utf8_line(raw, where)
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not a JSON object ({err.msg})") from None
        pairs.append(GraphPair.from_dict(data, where, default_id=number))
    if not pairs:
        raise ValueError(f"{path}: no rows")
    check_pairs(pairs)
    return pairs


def check_pairs(pairs: Sequence[GraphPair]) -> None:
    r"""
    Refuses two rows whose graphs would be one file: equal ids, or ids equal
    as text (``3`` and ``"3"``) or but for case (``"A"`` and ``"a"``, one file
    on some file systems).

    Args:

        pairs (Sequence[GraphPair]): The rows.

    Raises:
        ValueError: Naming both rows.
    """
    seen: Dict[str, GraphPair] = {}
    for pair in pairs:
        other = seen.setdefault(pair.name.casefold(), pair)
        if other is not pair:
            raise ValueError(
                f"{pair.where}: duplicate id {pair.id!r}: {other.where} has "
                f"{other.id!r}, and each names the graph file {pair.name}.json "
                "(ids are compared as text, ignoring case)"
            )


def as_pairs(pairs: Sequence[Any]) -> List[GraphPair]:
    r"""
    Rows given in Python: :class:`GraphPair` objects (each keeping its
    ``where``), or dicts of :data:`PAIR_FIELDS` (an absent or ``null``
    ``"id"`` is the index), checked as a file's.

    Args:

        pairs (Sequence[GraphPair or dict]): The rows, at least one.

    Returns:
        *list[GraphPair]*: the rows, checked, in order, each ``where``
        ``pairs[i]`` unless a :class:`GraphPair` had its own.

    Raises:
        TypeError: If ``pairs`` is not a sequence.
        ValueError: Naming ``pairs[i]``, as :func:`read_pairs` does.
    """
    if isinstance(pairs, (str, dict)) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs: expected a list of dicts, got {type(pairs).__name__}")
    if not pairs:
        raise ValueError("pairs: expected at least one row")
    rows = []
    for index, pair in enumerate(pairs):
        where = f"pairs[{index}]"
        data = pair
        if isinstance(pair, GraphPair):
            data, where = pair.row(), pair.where or where
        rows.append(GraphPair.from_dict(data, where, default_id=index))
    check_pairs(rows)
    return rows


def pair_arguments(
    pair: GraphPair, options: Mapping[str, Any], kind_name: str = "target_kind"
) -> Dict[str, Any]:
    r"""
    The arguments of :meth:`~captum_iglens.attr.flow.ProbabilityFlow.plan` for
    one row: ``options`` with the row's fields in their place, checked where
    that needs no model (the subject found in the prompt, the foil rule).

    Args:

        pair (GraphPair): The row.
        options (Mapping[str, Any]): The arguments of every row, without
                    ``inputs``.
        kind_name (str, optional): The caller's name of ``target_kind`` for
                    the foil rule's message (the command line's option).
                    Default: ``"target_kind"``

    Returns:
        *dict*: ``inputs`` the row's prompt, and ``options`` with the row's
        ``counterfactual`` or ``corrupt_subject`` (which replaces the other),
        ``target`` and ``foil`` where it gives them.

    Raises:
        ValueError: Naming the row and the field.
    """
    arguments = {**options, "inputs": pair.prompt}
    if pair.counterfactual is not None:
        arguments.update(counterfactual=pair.counterfactual, corrupt_subject=None)
    if pair.corrupt_subject is not None:
        arguments.update(corrupt_subject=pair.corrupt_subject, counterfactual=None)
    for name in ("target", "foil"):
        if getattr(pair, name) is not None:
            arguments[name] = getattr(pair, name)
    subject = arguments.get("corrupt_subject")
    if subject is not None and subject not in pair.prompt:
        raise ValueError(
            f"{pair.where}: corrupt_subject: {subject!r} is not in the prompt "
            f"{pair.prompt!r}"
        )
    try:
        check_foil(
            arguments.get("target_kind", "prob"),
            arguments.get("foil") is not None,
            arguments.get("counterfactual") is not None,
            names={
                "kind": kind_name,
                "foil": "foil",
                "counterfactual": "counterfactual",
            },
        )
    except ValueError as error:
        raise ValueError(f"{pair.where}: {error}") from None
    return arguments


def pairs_checksum(pairs: Sequence[GraphPair]) -> str:
    r"""
    The sha256 of the rows' fields (not where they came from): what a folder
    of their graphs records, so that a rerun on other rows is refused.

    Args:

        pairs (Sequence[GraphPair]): The rows.

    Returns:
        *str*: 64 hexadecimal digits.
    """
    text = json.dumps([pair.row() for pair in pairs], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_token(token: Any, where: str) -> None:
    if isinstance(token, bool) or not isinstance(token, (type(None), str, int)):
        raise ValueError(f"{where}: expected a token's text or id, got {token!r:.80}")
    if token == "":
        raise ValueError(f"{where}: expected a token's text, got ''")


def _check_id(pair_id: Any, where: str) -> None:
    if isinstance(pair_id, bool) or not isinstance(pair_id, (str, int)):
        raise ValueError(f"{where}: id: expected a str or int, got {pair_id!r:.80}")
    name = str(pair_id)
    if (
        not name
        or name.startswith(".")
        or len(name) > MAX_ID
        or not all(c.isalnum() or c in "._-" for c in name)
    ):
        raise ValueError(
            f"{where}: id: {pair_id!r} cannot name the row's graph file; use "
            f"letters, digits, '.', '_' and '-', not first '.', at most {MAX_ID}"
        )
