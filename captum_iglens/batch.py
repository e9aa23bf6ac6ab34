r"""
IG-Lens maps of a prompt set: padded batches, incremental JSON Lines output,
resumption after an interruption, and splitting across processes with
``torch.distributed`` (e.g. under ``torchrun``).

Each prompt's answer (generated greedily unless given) is attributed by teacher
forcing, as :func:`captum_iglens.hf.attribute_text` does. Prompts are attributed
in left-padded batches: with left padding every sequence ends in the last column,
so the positions that predict each prompt's answer are a suffix of the columns,
and one shared set of positions, the longest answer's, covers every prompt of the
batch. Each prompt keeps its own answer rows; the rows of a shorter answer's
extra positions (prompt or padding) are computed and dropped.
"""

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

from captum_iglens.hf import encode_prompt, generate_answer, left_pad
from captum_iglens.layer_ig_lens import LayerIGLens
from captum_iglens.result import IGLensResult

#: The merged output of :func:`run_batch`, in ``out_dir``.
RESULTS = "results.jsonl"

PromptId = Union[str, int]


def read_prompts(path: Union[str, Path]) -> List[Dict[str, Any]]:
    r"""
    Reads a prompt set: one JSON object per line, ``{"id": ..., "prompt": ...}``
    with an optional ``"answer"``. Blank lines are skipped.

    Args:

        path (str or Path): The JSON Lines file.

    Returns:
        *list[dict]*: the prompts, in file order, checked as by :func:`run_batch`.
    """
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                prompts.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not a JSON object ({err.msg})"
                ) from None
    _check_prompts(prompts)
    return prompts


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
    :func:`read_results`.
    """
    return IGLensResult.from_dict(
        {k: v for k, v in record.items() if k not in ("id", "prompt", "answer")}
    )


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
    batch_size: int = 8,
    layers: Optional[Sequence[int]] = None,
    max_new_tokens: int = 32,
    chat: bool = True,
    progress: bool = True,
) -> Path:
    r"""
    Attributes every prompt's answer across layers and writes one JSON line per
    prompt to ``out_dir/results.jsonl``, as each batch finishes.

    Resumable: prompts whose ids already have a record in ``out_dir`` (in
    ``results.jsonl`` or a per-process file) are not redone, and an incomplete
    last line left by an interruption is dropped.

    When ``torch.distributed`` is initialised (see :func:`init_distributed`), each
    process takes every ``world_size``-th remaining prompt and writes
    ``results.rank<r>.jsonl``; after a barrier, rank 0 merges every file into
    ``results.jsonl``, in input order, and removes the per-process files. Every
    process returns after the merge.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture, on
                    the device to use.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompts (list[dict]): ``{"id": str or int, "prompt": str}``, ids unique,
                    with an optional ``"answer"`` (text) to attribute instead of
                    a generated one.
        out_dir (str or Path): The output folder, created if needed.
        batch_size (int, optional): Prompts per padded attribution batch.
                    Default: 8.
        layers (list[int], optional): Block indices on the path; the last block
                    is always included. Default: all blocks.
        max_new_tokens (int, optional): Generation length limit. Default: 32.
        chat (bool, optional): Apply the chat template. Default: True.
        progress (bool, optional): A progress bar on stderr (rank 0 only).
                    Default: True.

    Returns:
        *Path*: ``out_dir/results.jsonl``. Each line holds ``id``, ``prompt``,
        ``answer`` and the fields of :meth:`IGLensResult.to_dict` for that prompt
        alone (``B = 1``, ``P`` its answer tokens): ``tokens``, ``layer_names``,
        ``attributions``, ``lens``, ``base_prob``, ``model_prob``, ``delta``,
        ``targets``, ``positions`` (in the unpadded sequence), ...; read them
        with :func:`read_results` and :func:`to_result`. An empty answer (the
        model stopped at once) gets a record with no positions.
    """
    _check_prompts(prompts)
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    own = out / (f"results.rank{rank}.jsonl" if distributed else RESULTS)

    _drop_incomplete_line(own)
    done = {
        _key(record["id"])
        for path in _result_files(out)
        for record in read_results(path)
    }
    if distributed:
        dist.barrier()  # every process has read the same finished set before any writes
    todo = [p for p in prompts if _key(p["id"]) not in done][rank::world]

    lens = LayerIGLens.from_model(model, layers)
    bar = tqdm(
        total=len(todo),
        desc="attributing",
        unit="prompt",
        disable=not progress or rank != 0,
    )
    with open(own, "a", encoding="utf-8") as handle:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            for record in _attribute_batch(
                model, tokenizer, lens, batch, max_new_tokens, chat
            ):
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
    return out / RESULTS


# ------------------------------------------------------------------ internals


def _check_prompts(prompts: Sequence[Dict[str, Any]]) -> None:
    seen: Set[str] = set()
    for index, item in enumerate(prompts):
        where = f"prompts[{index}]"
        if not isinstance(item, dict):
            raise TypeError(
                f"{where}: expected a dict with 'id' and 'prompt', got {item!r}"
            )
        if isinstance(item.get("id"), bool) or not isinstance(
            item.get("id"), (str, int)
        ):
            raise ValueError(
                f"{where}: expected an 'id' (str or int), got {item.get('id')!r}"
            )
        if not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise ValueError(f"{where}: expected a non-empty 'prompt' string")
        if "answer" in item and not isinstance(item["answer"], str):
            raise ValueError(f"{where}: 'answer' must be a string")
        key = _key(item["id"])
        if key in seen:
            raise ValueError(f"{where}: duplicate id {item['id']!r}")
        seen.add(key)


def _key(prompt_id: PromptId) -> str:
    """Ids compared as JSON, so that 1 and "1" stay distinct."""
    return json.dumps(prompt_id)


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
                yield json.loads(line), offset


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
            records.setdefault(_key(record["id"]), record)
    order = {_key(p["id"]): i for i, p in enumerate(prompts)}
    ranked = sorted(records, key=lambda key: order.get(key, len(order)))
    partial = out / (RESULTS + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        for key in ranked:
            handle.write(json.dumps(records[key]) + "\n")
    os.replace(partial, out / RESULTS)
    for path in files[1:]:
        path.unlink()


def _answer_ids(
    model: Any,
    tokenizer: Any,
    prompt_ids: Tensor,
    item: Dict[str, Any],
    max_new_tokens: int,
) -> Tensor:
    if "answer" in item:
        return tokenizer(
            item["answer"], add_special_tokens=False, return_tensors="pt"
        ).input_ids[0]
    return generate_answer(model, tokenizer, prompt_ids, max_new_tokens=max_new_tokens)


def _attribute_batch(
    model: Any,
    tokenizer: Any,
    lens: LayerIGLens,
    batch: Sequence[Dict[str, Any]],
    max_new_tokens: int,
    chat: bool,
) -> List[Dict[str, Any]]:
    """One record per prompt of ``batch``, in order; one padded attribution pass."""
    prompt_ids = [
        encode_prompt(tokenizer, item["prompt"], chat=chat)[0] for item in batch
    ]
    answers = [
        _answer_ids(model, tokenizer, ids[None], item, max_new_tokens)
        for ids, item in zip(prompt_ids, batch)
    ]
    sequences = [torch.cat([p, a.to(p)]) for p, a in zip(prompt_ids, answers)]
    to_attribute = [i for i, a in enumerate(answers) if len(a) > 0]
    results: Dict[int, IGLensResult] = {}
    if to_attribute:
        attributed = _attribute_padded(
            lens,
            [sequences[i] for i in to_attribute],
            [len(answers[i]) for i in to_attribute],
            _pad_id(tokenizer),
        )
        results = dict(zip(to_attribute, attributed))
    records = []
    for i, item in enumerate(batch):
        result = results[i] if i in results else _empty_result(lens)
        result.tokens = [[tokenizer.decode([t]) for t in result.targets[0].tolist()]]
        result.metadata = {"chat": chat}
        records.append(
            {
                "id": item["id"],
                "prompt": item["prompt"],
                "answer": tokenizer.decode(answers[i]),
                **result.to_dict(),
            }
        )
    return records


def _attribute_padded(
    lens: LayerIGLens, sequences: List[Tensor], answer_lengths: List[int], pad_id: int
) -> List[IGLensResult]:
    """Each sequence's map of its last ``answer_lengths[i]`` tokens; one batch."""
    ids, mask = left_pad(sequences, pad_id)
    width = ids.shape[1]
    longest = max(answer_lengths)
    positions = torch.arange(width - 1 - longest, width - 1)
    device = next(lens.readout.parameters()).device
    batch = lens.attribute_map(
        ids.to(device),
        target=ids[:, positions + 1].to(device),
        additional_forward_args=(mask.to(device),),
        positions=positions,
    ).to("cpu")
    results = []
    for row, (sequence, n) in enumerate(zip(sequences, answer_lengths)):
        keep = slice(longest - n, longest)
        results.append(
            IGLensResult(
                attributions=batch.attributions[row : row + 1, keep],
                lens=batch.lens[row : row + 1, keep],
                base_prob=batch.base_prob[row : row + 1, keep],
                model_prob=batch.model_prob[row : row + 1, keep],
                delta=batch.delta[row : row + 1, keep],
                targets=batch.targets[row : row + 1, keep],
                positions=positions[keep] - (width - len(sequence)),
                mask=batch.mask[row : row + 1, keep],
                layer_names=batch.layer_names,
                method=batch.method,
                n_steps=batch.n_steps,
            )
        )
    return results


def _empty_result(lens: LayerIGLens) -> IGLensResult:
    """The result of an empty answer: no attributed positions."""
    k = len(lens.layer_names)
    return IGLensResult(
        attributions=torch.zeros(1, 0, k),
        lens=torch.zeros(1, 0, k),
        base_prob=torch.zeros(1, 0),
        model_prob=torch.zeros(1, 0),
        delta=torch.zeros(1, 0),
        targets=torch.zeros(1, 0, dtype=torch.long),
        positions=torch.zeros(0, dtype=torch.long),
        mask=torch.zeros(1, 0, dtype=torch.bool),
        layer_names=list(lens.layer_names),
        method="prediction_aware",
        n_steps=50,
    )


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0
