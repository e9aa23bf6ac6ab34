r"""
The task format of the circuit harness: JSON Lines of prompt pairs,

    {"clean": "...", "counterfactual": "...", "answer": " Mary", "foil": " John"}

one object a line. ``answer`` and ``foil`` are continuations of both prompts;
their first tokens are the ones the metric reads. A file is checked line by
line (a bad line is refused with its number), then against a model's
tokenizer (the clean and counterfactual prompts of a pair must have as many
tokens, and the answer's first token must differ from the foil's), all before
the model runs.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from captum_iglens._utils.serialization import parse_json

#: The fields of a task line, all strings.
FIELDS = ("clean", "counterfactual", "answer", "foil")


@dataclass(frozen=True)
class Pair:
    r"""
    One prompt pair of a task.

    Attributes:

        clean (str): The prompt whose answer the circuit must produce.
        counterfactual (str): The same prompt with the information changed
                    (another name, year, operand, subject); the patched runs
                    take every write outside the circuit from it.
        answer (str): The clean prompt's expected continuation.
        foil (str): The competing continuation (the counterfactual's answer,
                    or another wrong answer), read by the ``"prob_diff"`` and
                    ``"logit_diff"`` metrics.
        line (int): Where the pair came from: its line in the task file
                    (1-based), or its index for generated pairs. Default: 0
    """

    clean: str
    counterfactual: str
    answer: str
    foil: str
    line: int = 0

    def to_dict(self) -> Dict[str, str]:
        """The pair as a task line's object."""
        return {name: getattr(self, name) for name in FIELDS}


def parse_pair(data: Any, where: str, line: int = 0) -> Pair:
    r"""
    A pair from one parsed task line.

    Args:

        data (Any): The line's JSON value.
        where (str): Where it came from, for messages (``"tasks.jsonl:3"``).
        line (int): Its line number. Default: 0

    Returns:
        *Pair*.

    Raises:
        ValueError: If ``data`` is not an object with exactly the string
                    fields of :data:`FIELDS`, each non-empty, or the answer
                    equals the foil.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [name for name in FIELDS if name not in data]
    extra = sorted(set(data) - set(FIELDS))
    if missing or extra:
        problem = f"missing {missing}" if missing else f"unknown fields {extra}"
        raise ValueError(f"{where}: expected the fields {list(FIELDS)}; {problem}")
    for name in FIELDS:
        if not isinstance(data[name], str) or not data[name].strip():
            raise ValueError(f"{where}: {name!r} must be a non-empty string")
    if data["answer"] == data["foil"]:
        raise ValueError(f"{where}: 'answer' and 'foil' are the same text")
    return Pair(line=line, **{name: data[name] for name in FIELDS})


#: The longest task line read, in bytes: a longer one is refused by number
#: before it is read whole (prompt pairs are sentences, not documents).
MAX_LINE_BYTES = 1_000_000


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    r"""The file's lines with their numbers, read one at a time, each at most
    :data:`MAX_LINE_BYTES` long and decoded as UTF-8.

    Raises:
        ValueError: Naming the line (and the byte offset in the file) that is
            too long or not UTF-8.
    """
    offset = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(
            iter(lambda: lines.readline(MAX_LINE_BYTES + 1), b""), 1
        ):
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(
                    f"--task: {path}:{number}: a line longer than {MAX_LINE_BYTES:,} "
                    "bytes; expected one prompt pair a line"
                )
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"--task: {path}:{number}: not UTF-8 (byte {offset + error.start} "
                    f"of the file is {raw[error.start]:#04x}); save the file as UTF-8"
                ) from None
            offset += len(raw)


def read_task(path: Union[str, Path]) -> List[Pair]:
    r"""
    Reads a task file (JSON Lines of :data:`FIELDS`, UTF-8; blank lines
    skipped), one line at a time.

    Args:

        path (str or Path): The file.

    Returns:
        *list[Pair]*: its pairs, in order, each with its line number.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the path is a folder; naming the first bad line and
                    what was expected (a line longer than
                    :data:`MAX_LINE_BYTES`, not UTF-8, not a pair, or the
                    same pair as an earlier line: copies would make the
                    bootstrap's intervals narrower than the task's); or if
                    the file has no pair.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--task: {path} is a folder; expected a JSON Lines file")
    if not path.is_file():
        raise FileNotFoundError(f"--task: no such file: {path}")
    pairs: List[Pair] = []
    seen: Dict[Tuple[str, ...], int] = {}
    for number, text in _lines(path):
        if not text.strip():
            continue
        where = f"{path.name}:{number}"
        pair = parse_pair(parse_json(text, where), where, number)
        first = seen.setdefault(tuple(pair.to_dict().values()), number)
        if first != number:
            raise ValueError(
                f"--task: {path}: lines {first} and {number} are the same pair; "
                "remove the duplicates (copies overstate the bootstrap's confidence)"
            )
        pairs.append(pair)
    if not pairs:
        raise ValueError(f"--task: {path} holds no pair")
    return pairs


def first_token(tokenizer: Any, text: str) -> int:
    """The first token of ``text`` as a continuation (no special tokens)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError(f"{text!r} has no token")
    return int(ids[0])


@dataclass(frozen=True)
class Encoded:
    r"""
    A pair tokenized for one model.

    Attributes:

        pair (Pair): The pair.
        clean (tuple[int, ...]): The clean prompt's token ids, ``T`` of them.
        counterfactual (tuple[int, ...]): The counterfactual's, also ``T``.
        answer (int): The answer's first token.
        foil (int): The foil's first token.
    """

    pair: Pair
    clean: Tuple[int, ...]
    counterfactual: Tuple[int, ...]
    answer: int
    foil: int


def encode_pairs(
    pairs: Sequence[Pair], tokenizer: Any, context: Optional[int] = None
) -> List[Encoded]:
    r"""
    Tokenizes every pair for one model, checking them all before any forward.

    Args:

        pairs (list[Pair]): The task's pairs.
        tokenizer (Any): The model's tokenizer (called as ``tokenizer(text)``,
                    with its special tokens, as the model reads a prompt).
        context (int, optional): The most tokens the model reads (its
                    ``max_position_embeddings``). Default: None (no limit)

    Returns:
        *list[Encoded]*, in the order of ``pairs``.

    Raises:
        ValueError: For the first pair whose prompts differ in token count,
                    are longer than ``context``, or whose answer and foil
                    start with the same token, naming its line.
    """
    out = []
    for index, pair in enumerate(pairs):
        where = f"line {pair.line}" if pair.line else f"pair {index}"
        clean = tuple(int(i) for i in tokenizer(pair.clean)["input_ids"])
        other = tuple(int(i) for i in tokenizer(pair.counterfactual)["input_ids"])
        if len(clean) != len(other):
            raise ValueError(
                f"--task: {where}: the clean prompt has {len(clean)} tokens and the "
                f"counterfactual {len(other)}; expected equal lengths for this "
                "model's tokenizer"
            )
        if context is not None and len(clean) > context:
            raise ValueError(
                f"--task: {where}: the prompts have {len(clean)} tokens, more than "
                f"the model's context of {context}; shorten them"
            )
        answer = first_token(tokenizer, pair.answer)
        foil = first_token(tokenizer, pair.foil)
        if answer == foil:
            raise ValueError(
                f"--task: {where}: the answer {pair.answer!r} and the foil "
                f"{pair.foil!r} start with the same token for this tokenizer"
            )
        out.append(Encoded(pair, clean, other, answer, foil))
    return out
