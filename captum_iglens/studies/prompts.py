r"""
The one reader of prompt files: JSON Lines, one object per line with a
``"prompt"`` string, an optional unique ``"id"`` (str or int; the line number
otherwise), an optional ``"answer"`` string, and any further fields a study uses
(e.g. ``"relation"``, ``"aliases"``). Blank lines are skipped.

Lines end at ``\n`` only: U+2028, U+0085 and the other characters
``str.splitlines`` also breaks at are valid inside a JSON string, and
``json.dumps(ensure_ascii=False)`` writes them raw.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Set, Union

PromptId = Union[str, int]


def prompt_key(prompt_id: PromptId) -> str:
    """Ids compared as JSON, so that 1 and "1" stay distinct."""
    return json.dumps(prompt_id)


def read_prompts(path: Union[str, Path]) -> List[Dict[str, Any]]:
    r"""
    Reads a prompt set.

    Args:

        path (str or Path): The JSON Lines file.

    Returns:
        *list[dict]*: the prompts, in file order, each with an ``"id"``, checked
        as by :func:`check_prompts`. Errors name the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts: no such file {path}")
    prompts, seen = [], set()  # type: List[Dict[str, Any]], Set[str]
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        line = utf8_line(raw, f"{path}:{number}")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}:{number}: not a JSON object ({err.msg})"
            ) from None
        if isinstance(record, dict):
            record.setdefault("id", number)
        _check_prompt(record, f"{path}:{number}", seen)
        prompts.append(record)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def utf8_line(raw: bytes, where: str) -> str:
    r"""
    One line of a text file, decoded.

    Args:

        raw (bytes): The line's bytes.
        where (str): The file and line, for the message (``"path:3"``).

    Returns:
        *str*: the text.

    Raises:
        ValueError: If the line is not valid UTF-8, naming ``where`` and the byte.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column "
            f"{err.start + 1})"
        ) from None


def check_prompts(prompts: Sequence[Dict[str, Any]]) -> None:
    r"""
    Checks a prompt set: dicts with a unique ``"id"`` (str or int), a non-empty
    ``"prompt"`` string and, if present, an ``"answer"`` string. Raises
    ``ValueError`` or ``TypeError`` naming the entry.
    """
    if isinstance(prompts, (str, dict)) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts: expected a list of dicts, got {type(prompts).__name__}"
        )
    seen: Set[str] = set()
    for index, item in enumerate(prompts):
        _check_prompt(item, f"prompts[{index}]", seen)


def _check_prompt(item: Any, entry: str, seen: Set[str]) -> None:
    if not isinstance(item, dict) or not (
        isinstance(item.get("prompt"), str) and item["prompt"].strip()
    ):
        raise ValueError(
            f"{entry}: expected an object with a non-empty 'prompt' string, got "
            f"{item!r:.80}"
        )
    if isinstance(item.get("id"), bool) or not isinstance(item.get("id"), (str, int)):
        raise ValueError(
            f"{entry}: expected an 'id' (str or int), got {item.get('id')!r}"
        )
    if "answer" in item and not isinstance(item["answer"], str):
        raise ValueError(f"{entry}: 'answer' must be a string")
    key = prompt_key(item["id"])
    if key in seen:
        raise ValueError(f"{entry}: duplicate id {item['id']!r}")
    seen.add(key)
