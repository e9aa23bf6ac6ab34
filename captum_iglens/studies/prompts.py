r"""
The one reader of prompt files: JSON Lines, one object per line with a
``"prompt"`` string, an optional unique ``"id"`` (str or int; the line number
otherwise), an optional ``"answer"`` string, and any further fields a study uses
(e.g. ``"relation"``, ``"aliases"``). Blank lines are skipped.
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
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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
