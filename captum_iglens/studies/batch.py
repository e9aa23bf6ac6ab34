r"""
IG-Lens maps of a prompt set: padded batches, incremental JSON Lines output,
resumption after an interruption, and splitting across processes with
``torch.distributed`` (e.g. under ``torchrun``).

Each prompt's answer (generated greedily unless given) is attributed by teacher
forcing, as :func:`captum_iglens.attribute_text` does. Prompts are attributed
in left-padded batches: with left padding every sequence ends in the last column,
so the positions that predict each prompt's answer are a suffix of the columns,
and one shared set of positions, the longest answer's, covers every prompt of the
batch. Each prompt keeps its own answer rows; the rows of a shorter answer's
extra positions (prompt or padding) are computed and dropped.
"""

import hashlib
import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

from captum_iglens._utils.serialization import (
    check_folder,
    check_writable,
    parse_json,
    plain,
    write_atomic,
)
from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.text import (
    decoded_top_tokens,
    encode_answer,
    encode_prompt,
    generate,
    left_pad,
    pad_token_id,
    positions_span,
)
from captum_iglens.readout.layer_readout import (
    readout_record,
    resolve_readout,
)
from captum_iglens.readout.translators import Translators
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.prompts import check_prompts, prompt_key

#: The merged output of :func:`run_batch`, in ``out_dir``.
RESULTS = "results.jsonl"
#: The settings and model identity of the run that writes ``out_dir``.
RUN = "run.json"
#: The lock file of a folder being written (see :class:`BatchLock`).
LOCK = ".batch.lock"
#: The key of a record's metadata that holds the answer given with the prompt
#: (None when the answer was generated), compared on resume.
GIVEN = "given_answer"
#: The readout a ``run.json`` without one was written under.
_LOGIT_READOUT = {"kind": "logit", "checksum": None}
# A lock file this young with no holder yet is being written.
_LOCK_WRITE_S = 10.0


def read_results(path: Union[str, Path]) -> List[Dict[str, Any]]:
    r"""
    Reads the records of a results file written by :func:`run_batch`. A last line
    that is incomplete (the run was interrupted while writing it) is ignored.

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


def write_html(
    out_dir: Union[str, Path], path: Optional[Union[str, Path]] = None
) -> Path:
    r"""
    Writes the interactive viewer of a folder written by :func:`run_batch`: the
    mean credit per layer, the distribution of onsets and every prompt's map, in
    one self-contained HTML file.

    Args:

        out_dir (str or Path): The output folder (``results.jsonl``, ``run.json``).
        path (str or Path, optional): The page. Default: ``out_dir/index.html``.

    Returns:
        *Path*: the page written.
    """
    from captum_iglens.viewer import batch_payload, render_page

    out = Path(out_dir)
    if not (out / RESULTS).is_file():
        raise ValueError(f"out_dir: {out} holds no {RESULTS}")
    run = _read_run(out) if (out / RUN).is_file() else {}
    records = read_results(out / RESULTS)
    items = [dict(record, result=to_result(record)) for record in records]
    page = Path(path) if path is not None else out / "index.html"
    check_writable(page, "path")
    write_atomic(page, render_page(batch_payload(items, run)))
    return page


def init_distributed() -> torch.device:
    r"""
    Joins the process group that ``torchrun`` describes in the environment
    (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
    with the NCCL backend when CUDA is available and Gloo otherwise. Does nothing
    outside ``torchrun`` or when the group is already initialised.

    Returns:
        *torch.device*: the device this process should put the model on:
        ``cuda:LOCAL_RANK`` with CUDA, else the CPU.
    """
    cuda = torch.cuda.is_available()
    device = torch.device(
        f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    )
    if cuda:
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return device


def run_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Dict[str, Any]],
    out_dir: Union[str, Path],
    *,
    settings: Optional[Settings] = None,
    batch_size: int = 8,
    progress: bool = True,
    lens: Union[None, str, Path, Translators] = None,
    **options: Any,
) -> Path:
    r"""
    Attributes every prompt's answer across layers and writes one JSON line per
    prompt to ``out_dir/results.jsonl``, as each batch finishes.

    Resumable: prompts whose ids already have a record in ``out_dir`` (in
    ``results.jsonl`` or a per-process file) are not redone, and an incomplete
    last line left by an interruption is dropped. The settings and the model's
    identity (its name and a checksum of its weights) are recorded in
    ``out_dir/run.json``; resuming under other settings or another model raises
    ``ValueError`` before any work, so one folder never mixes runs.

    When ``torch.distributed`` is initialised (see :func:`init_distributed`), each
    process takes every ``world_size``-th remaining prompt and writes
    ``results.rank<r>.jsonl``; after a barrier, rank 0 merges every file into
    ``results.jsonl``, in input order, and removes the per-process files. Every
    process returns after the merge.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture, on
                    the device to use; a wrapper of one
                    (TransformerLens bridge, nnsight model,
                    ``nn.DataParallel``), or its
                    :func:`~captum_iglens.hf.model_parts`.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompts (list[dict]): ``{"id": str or int, "prompt": str}``, ids unique,
                    with an optional ``"answer"`` (text) to attribute instead of
                    a generated one (see :func:`~captum_iglens.studies.read_prompts`).
        out_dir (str or Path): The output folder, created if missing (its
                    parent must exist).
        settings (Settings, optional): Layers, positions, baselines, estimator,
                    granularity, chat template, generation length, ...
                    Default: ``Settings()``.
        batch_size (int, optional): Prompts per padded attribution batch.
                    Default: 8.
        progress (bool, optional): A progress bar on stderr (rank 0 only).
                    Default: True.
        lens (str, Path or Translators, optional): A learned readout per layer,
                    as in :meth:`LayerIGLens.from_model`; its kind and checksum
                    are recorded in ``run.json`` and a rerun under another
                    readout is refused. Default: None (the logit readout)
        **options (Any): Fields of :class:`Settings` that override ``settings``.

    Returns:
        *Path*: ``out_dir/results.jsonl``. Each line holds ``id``, ``prompt``,
        ``answer`` and the fields of :meth:`IGLensResult.to_dict` for that prompt
        alone (``B = 1``, ``P`` its attributed tokens): ``tokens``,
        ``layer_names``, ``attributions``, ``lens``, ``base_prob``,
        ``model_prob``, ``delta``, ``targets``, ``positions`` (in the unpadded
        sequence), ...; read them with :func:`read_results` and
        :func:`to_result`. An empty answer (the model stopped at once) gets a
        record with no positions.
    """
    settings = Settings.resolve(settings, options)
    check_prompts(prompts)
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    attributor = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes, lens=lens
    )
    attributor.segment_names(settings.granularity)  # fails now, not after generation
    out = check_folder(out_dir, "out_dir")
    out.mkdir(exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    run = {**provenance(model, settings), "weights_sha256": weights_checksum(model)}
    run["readout"] = readout_record(attributor.readout)
    lock = BatchLock(out)

    def claim() -> None:
        lock.acquire()
        _claim(out, run)

    error = _on_rank_zero(rank, claim)
    if distributed:
        error = _shared(error)  # every process stops, not only rank 0
    if error is not None:
        lock.release()
        raise ValueError(error)
    try:
        _run_prompts(
            model, tokenizer, attributor, prompts, out, settings, batch_size, progress
        )
    finally:
        lock.release()
    return out / RESULTS


def _run_prompts(
    model: Any,
    tokenizer: Any,
    lens: LayerIGLens,
    prompts: Sequence[Dict[str, Any]],
    out: Path,
    settings: Settings,
    batch_size: int,
    progress: bool,
) -> None:
    """The prompts not done yet, attributed and merged (every process)."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    own = out / (f"results.rank{rank}.jsonl" if distributed else RESULTS)
    _drop_incomplete_line(own)
    done = _done_records(out)
    _check_texts(out, prompts, done)
    if distributed:
        dist.barrier()  # every process has read the same finished set before any writes
    todo = [p for p in prompts if prompt_key(p["id"]) not in done][rank::world]

    bar = tqdm(
        total=len(todo),
        desc="attributing",
        unit="prompt",
        disable=not progress or rank != 0,
    )
    with open(own, "a", encoding="utf-8") as handle:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            for record in _attribute_batch(model, tokenizer, lens, batch, settings):
                handle.write(json.dumps(record) + "\n")
                handle.flush()
            bar.update(len(batch))
    bar.close()

    if distributed:
        dist.barrier()
    if rank == 0:
        _merge(out, prompts)
    if distributed:
        dist.barrier()


def check_resume(
    out_dir: Union[str, Path],
    prompts: Sequence[Dict[str, Any]],
    settings: Settings,
) -> None:
    r"""
    The checks of a rerun in ``out_dir`` that need no model, for a caller that
    loads the model afterwards (the CLI): the settings recorded in
    ``run.json`` and the texts of the prompts already done. :func:`run_batch`
    makes them again, with the weights' checksum.

    Raises:
        ValueError: If the folder was written with other settings, holds results
            but no ``run.json``, or holds a prompt or given answer that differs
            under the same id (naming the ids).
    """
    out = Path(out_dir)
    if not out.is_dir():
        return
    if (out / RUN).exists():
        _compare(out, _read_run(out), {"settings": settings.to_dict()}, "settings")
    elif any(f.exists() for f in _result_files(out)):
        raise ValueError(
            f"out_dir: {out} holds results but no {RUN}, so their settings are "
            "unknown; choose a new --out folder"
        )
    _check_texts(out, prompts, _done_records(out))


def check_model(
    out_dir: Union[str, Path],
    model: Any,
    lens: Union[None, str, Path, Translators] = None,
) -> None:
    r"""
    Checks the model against the one recorded in ``out_dir/run.json`` (if any)
    by the checksum of its weights, and the readout (``lens``, as in
    :func:`run_batch`) by its kind and checksum, before any work.

    Raises:
        ValueError: If the weights or the readout differ, showing both in full.
    """
    out = Path(out_dir)
    if not (out / RUN).exists():
        return
    parts = model_parts(model)
    recorded = _read_run(out)
    ours = {"model": provenance(parts.model, Settings())["model"]}
    ours["weights_sha256"] = weights_checksum(parts.model)
    names = f"; model {recorded.get('model')!r} then, {ours['model']!r} now"
    _compare(out, recorded, ours, "weights_sha256", names)
    ours["readout"] = readout_record(
        resolve_readout(parts.readout(), lens, parts.blocks)
    )
    _compare(out, recorded, ours, "readout")


class BatchLock:
    r"""
    The exclusive lock of a batch folder: the file ``.batch.lock`` in it,
    created only if absent, holding the host and pid of the process that runs
    the folder. A lock whose process is gone (same host) is stale and taken
    over; a process that holds the lock may take it again (it is then released
    by the first taker only).

    Args:

        out_dir (str or Path): The output folder (it must exist).
    """

    def __init__(self, out_dir: Union[str, Path]) -> None:
        self.path = Path(out_dir) / LOCK
        self.held = False

    def acquire(self) -> "BatchLock":
        r"""Takes the lock, or raises ``ValueError`` in one line naming the
        process that holds it."""
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(3):
            try:
                handle = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder == me:
                    return self
                if holder is not None and not _is_stale(holder):
                    raise ValueError(
                        f"out_dir: {self.path.parent} is being written by another "
                        f"batch run (pid {holder.get('pid')} on "
                        f"{holder.get('host')}); wait for it to finish, or delete "
                        f"{self.path} if that process is gone"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(json.dumps(me))
            self.held = True
            return self
        raise ValueError(f"out_dir: could not take the lock {self.path}; try again")

    def release(self) -> None:
        r"""Removes the lock file, if this object took it."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def _holder(self) -> Optional[Dict[str, Any]]:
        """The lock's holder; None for a file being written (young) or
        unreadable and old (stale)."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
                return holder
        except (OSError, ValueError):
            pass
        try:
            young = time.time() - self.path.stat().st_mtime < _LOCK_WRITE_S
        except OSError:
            return None
        if young:
            return {"host": "?", "pid": "? (starting)"}
        return None


def _is_stale(holder: Dict[str, Any]) -> bool:
    """Whether the lock's process is gone (only knowable on this host)."""
    if holder.get("host") != socket.gethostname() or not isinstance(
        holder.get("pid"), int
    ):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def weights_checksum(model: torch.nn.Module) -> str:
    r"""SHA-256 of the model's parameters and buffers, in order: the identity of
    the weights a run used, whatever file they came from."""
    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{data.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------ internals


def _claim(out: Path, run: Dict[str, Any]) -> None:
    """Records ``run`` in ``out/run.json``, or checks it against the one there:
    the settings, the readout (kind and checksum) and the weights' checksum (the
    model's name or path is kept for the reader, not compared: a folder given
    relatively is the same model)."""
    path = out / RUN
    if not path.exists():
        if any(f.exists() for f in _result_files(out)):
            raise ValueError(
                f"out_dir: {out} holds results but no {RUN}, so their settings are "
                "unknown; choose a new --out folder"
            )
        write_atomic(path, json.dumps(plain(run), indent=1))
        return
    recorded = _read_run(out)
    ours = json.loads(json.dumps(plain(run)))
    _compare(out, recorded, ours, "settings")
    _compare(out, recorded, ours, "readout")
    if recorded.get("weights_sha256") != ours["weights_sha256"]:
        names = f"model {recorded.get('model')!r} then, {ours['model']!r} now"
        _compare(out, recorded, ours, "weights_sha256", f"; {names}")


def _read_run(out: Path) -> Dict[str, Any]:
    """The ``run.json`` of ``out``, checked to be a JSON object; one written
    before readouts were recorded was written under the logit readout."""
    try:
        recorded = json.loads((out / RUN).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"out_dir: {out / RUN} is not valid JSON") from None
    if not isinstance(recorded, dict):
        raise ValueError(f"out_dir: {out / RUN} is not a JSON object")
    recorded.setdefault("readout", dict(_LOGIT_READOUT))
    return recorded


def _compare(
    out: Path, recorded: Dict[str, Any], ours: Dict[str, Any], key: str, more: str = ""
) -> None:
    """Refuses to resume when ``key`` of ``run.json`` differs from this run's."""
    if recorded.get(key) != ours[key]:
        raise ValueError(
            f"out_dir: {out} was written with other {key.replace('_', ' ')} "
            f"({_differences(recorded.get(key), ours[key])}{more}); resuming would "
            "mix results. Rerun with the recorded settings and model or choose a "
            "new --out folder"
        )


def _differences(old: Any, new: Any) -> str:
    """Every differing value, in full."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return ", ".join(f"{k}: {old.get(k)!r} then, {new.get(k)!r} now" for k in keys)
    return f"{old!r} then, {new!r} now"


def _done_records(out: Path) -> Dict[str, Dict[str, Any]]:
    """The first record of each id in the result files of ``out``."""
    done: Dict[str, Dict[str, Any]] = {}
    for path in _result_files(out):
        for record in read_results(path):
            done.setdefault(prompt_key(record["id"]), record)
    return done


def _check_texts(
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


def _on_rank_zero(rank: int, step: Callable[[], None]) -> Optional[str]:
    """Runs ``step`` on rank 0; the message of the ``ValueError`` it raised."""
    if rank != 0:
        return None
    try:
        step()
    except ValueError as error:
        return str(error)
    return None


def _shared(error: Optional[str]) -> Optional[str]:
    """Rank 0's ``error``, on every process."""
    box = [error]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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


def _drop_incomplete_line(path: Path) -> None:
    """Truncates a results file after its last complete line."""
    if not path.exists():
        return
    end = 0
    for _, end in _complete_lines(path):
        pass
    if end != path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(end)


def _result_files(out: Path) -> List[Path]:
    ranks = sorted(
        out.glob("results.rank*.jsonl"), key=lambda p: int(p.name.split(".")[1][4:])
    )
    return [out / RESULTS, *ranks]


def _merge(out: Path, prompts: Sequence[Dict[str, Any]]) -> None:
    """Every record of ``out``, once per id, into ``results.jsonl`` in input order.

    Records of ids that are not among ``prompts`` (from an earlier prompt set)
    are kept, after the others.
    """
    files = _result_files(out)
    records: Dict[str, Dict[str, Any]] = {}
    for path in files:
        for record in read_results(path):
            records.setdefault(prompt_key(record["id"]), record)
    order = {prompt_key(p["id"]): i for i, p in enumerate(prompts)}
    ranked = sorted(records, key=lambda key: order.get(key, len(order)))
    write_atomic(out / RESULTS, "".join(json.dumps(records[k]) + "\n" for k in ranked))
    for path in files[1:]:
        path.unlink()


def _attribute_batch(
    model: Any,
    tokenizer: Any,
    lens: LayerIGLens,
    batch: Sequence[Dict[str, Any]],
    settings: Settings,
) -> List[Dict[str, Any]]:
    """One record per prompt of ``batch``, in order; one padded attribution pass."""
    prompt_ids = [
        encode_prompt(tokenizer, item["prompt"], chat=settings.chat)[0]
        for item in batch
    ]
    answers: List[Optional[Tensor]] = [
        encode_answer(tokenizer, item["answer"]) if "answer" in item else None
        for item in batch
    ]
    missing = [i for i, a in enumerate(answers) if a is None]
    if missing:
        generated = generate(
            model,
            tokenizer,
            [prompt_ids[i] for i in missing],
            max_new_tokens=settings.max_new_tokens,
        )
        for i, answer in zip(missing, generated):
            answers[i] = answer
    given = [a for a in answers if a is not None]
    assert len(given) == len(answers)  # each given or generated above
    sequences = [torch.cat([p, a.to(p)]) for p, a in zip(prompt_ids, given)]
    spans = [
        positions_span(len(p), len(s), settings.positions)
        for p, s in zip(prompt_ids, sequences)
    ]
    results = _attribute_padded(
        lens, sequences, spans, pad_token_id(tokenizer), settings
    )
    records = []
    for item, answer, result in zip(batch, given, results):
        result.tokens = [decode_tokens(tokenizer, result.targets[0].tolist())]
        if result.top_ids is not None:
            result.top_tokens = decoded_top_tokens(tokenizer, result.top_ids)
        result.metadata = {
            "chat": settings.chat,
            "positions": settings.positions,
            GIVEN: item.get("answer"),
        }
        records.append(
            {
                "id": item["id"],
                "prompt": item["prompt"],
                "answer": tokenizer.decode(answer),
                **result.to_dict(),
            }
        )
    return records


def _attribute_padded(
    lens: LayerIGLens,
    sequences: List[Tensor],
    spans: List[Tuple[int, int]],
    pad_id: int,
    settings: Settings,
) -> List[IGLensResult]:
    """
    Each sequence's map of its positions ``[start, end)``, from one padded pass.

    With left padding, sequence ``i`` starts at column ``offset_i``; the pass
    attributes the union of every sequence's columns, and each sequence keeps
    its own. A sequence with nothing to attribute gets an empty map.
    """
    ids, mask = left_pad(sequences, pad_id)
    width = ids.shape[1]
    offsets = [width - len(s) for s in sequences]
    columns = [(o + a, o + b) for o, (a, b) in zip(offsets, spans)]
    filled = [(a, b) for a, b in columns if b > a]
    if not filled:
        names = lens.segment_names(settings.granularity)
        empty = IGLensResult.empty(names, settings.method, settings.n_steps)
        return [empty] * len(sequences)
    first, last = min(a for a, _ in filled), max(b for _, b in filled)
    positions = torch.arange(first, last)
    device = next(lens.readout.parameters()).device
    found = lens.attribute_map(
        ids.to(device),
        target=ids[:, positions + 1].to(device),
        additional_forward_args=(mask.to(device),),
        positions=positions,
        **settings.map_kwargs(),
    ).to("cpu")
    results = []
    for row, ((a, b), offset) in enumerate(zip(columns, offsets)):
        keep = torch.arange(a - first, b - first) if b > a else torch.arange(0)
        result = found.select(batch=[row], positions=keep)
        results.append(replace(result, positions=result.positions - offset))
    return results
