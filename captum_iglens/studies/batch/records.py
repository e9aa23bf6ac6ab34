r"""
The results files of a batch folder: one JSON line per prompt, appended as each
batch finishes (``results.jsonl``, or ``results.rank<r>.jsonl`` per process
under ``torch.distributed``), read back, checked against the prompts of a rerun
and merged.
"""

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple, Union

from captum_iglens._utils.serialization import parse_json, write_atomic
from captum_iglens.result import IGLensResult
from captum_iglens.studies.prompts import prompt_key

#: The merged output of :func:`~captum_iglens.studies.batch.run_batch`, in
#: ``out_dir``.
RESULTS = "results.jsonl"
#: The key of a record's metadata that holds the answer given with the prompt
#: (None when the answer was generated), compared on resume.
GIVEN = "given_answer"


def read_results(path: Union[str, Path]) -> List[Dict[str, Any]]:
    r"""
    Reads the records of a results file written by
    :func:`~captum_iglens.studies.batch.run_batch`. A last line that is
    incomplete (the run was interrupted while writing it) is ignored.

    Args:

        path (str or Path): A ``results*.jsonl`` file; a missing file has no
                    records.

    Returns:
        *list[dict]*: one record per prompt: ``id``, ``prompt``, ``answer`` and
        the fields of :meth:`IGLensResult.to_dict` of a one-sequence result.
    """
    return [record for record, _ in _complete_lines(Path(path))]


def to_result(record: Dict[str, Any]) -> IGLensResult:
    r"""
    The :class:`~captum_iglens.IGLensResult` (``B = 1``) of one record of
    :func:`read_results`; an inconsistent record raises ``ValueError``.
    """
    return IGLensResult.from_dict(
        {k: v for k, v in record.items() if k not in ("id", "prompt", "answer")}
    )


def result_files(out: Path) -> List[Path]:
    """``results.jsonl`` and the per-process files of ``out``, by rank."""
    ranks = sorted(
        out.glob("results.rank*.jsonl"), key=lambda p: int(p.name.split(".")[1][4:])
    )
    return [out / RESULTS, *ranks]


def done_records(out: Path) -> Dict[str, Dict[str, Any]]:
    """The first record of each id in the result files of ``out``."""
    done: Dict[str, Dict[str, Any]] = {}
    for path in result_files(out):
        for record in read_results(path):
            done.setdefault(prompt_key(record["id"]), record)
    return done


def check_texts(
    out: Path, prompts: Sequence[Dict[str, Any]], done: Dict[str, Dict[str, Any]]
) -> None:
    """Refuses to resume when the prompt or the given answer of a done id changed:
    its old map would be kept under the new text."""
    changed = []
    for item in prompts:
        record = done.get(prompt_key(item["id"]))
        if record is None:
            continue
        given = (record.get("metadata") or {}).get(GIVEN, item.get("answer"))
        if record.get("prompt") != item["prompt"] or given != item.get("answer"):
            changed.append(item["id"])
    if changed:
        shown = ", ".join(repr(i) for i in changed[:10])
        more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        raise ValueError(
            f"prompts: the prompt or answer text of ids {shown}{more} differs from "
            f"the one attributed in {out}; resuming would keep their old maps. "
            "Restore the texts, give them new ids, or choose a new --out folder"
        )


def drop_incomplete_line(path: Path) -> None:
    """Truncates a results file after its last complete line."""
    if not path.exists():
        return
    end = 0
    for _, end in _complete_lines(path):
        pass
    if end != path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(end)


def merge_results(out: Path, prompts: Sequence[Dict[str, Any]]) -> None:
    """Every record of ``out``, once per id, into ``results.jsonl`` in input order.

    Records of ids that are not among ``prompts`` (from an earlier prompt set)
    are kept, after the others.
    """
    files = result_files(out)
    records: Dict[str, Dict[str, Any]] = {}
    for path in files:
        for record in read_results(path):
            records.setdefault(prompt_key(record["id"]), record)
    order = {prompt_key(p["id"]): i for i, p in enumerate(prompts)}
    ranked = sorted(records, key=lambda key: order.get(key, len(order)))
    write_atomic(out / RESULTS, "".join(json.dumps(records[k]) + "\n" for k in ranked))
    for path in files[1:]:
        path.unlink()


def _complete_lines(path: Path) -> Iterator[Tuple[Dict[str, Any], int]]:
    """Each complete record of a results file, with the byte offset after its line."""
    if not path.exists():
        return
    offset = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                return  # interrupted while writing this line
            offset += len(line)
            if line.strip():
                yield parse_json(line.decode("utf-8"), path), offset
