r"""
The run loop of a prompt set: the prompts not done yet, in padded batches, one
JSON line per prompt appended as each batch finishes, split across processes
with ``torch.distributed`` (e.g. under ``torchrun``) and merged at the end.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from tqdm import tqdm

from captum_iglens._utils.output_paths import check_folder
from captum_iglens._utils.serialization import remove_partials
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.distributed import (
    barrier,
    from_rank_zero,
    in_group,
    rank_and_world,
)
from captum_iglens.studies.batch.lock import BatchLock
from captum_iglens.studies.batch.padded import attribute_batch
from captum_iglens.studies.batch.records import (
    RESULTS,
    check_texts,
    done_records,
    drop_incomplete_line,
    merge_results,
)
from captum_iglens.readout.layer_readout import LensType, readout_record
from captum_iglens.studies.batch.resume import BATCH_SIZE, claim_run
from captum_iglens.studies.prompts import check_prompts, prompt_key


def run_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Dict[str, Any]],
    out_dir: Union[str, Path],
    *,
    settings: Optional[Settings] = None,
    batch_size: int = 8,
    progress: bool = True,
    lens: LensType = None,
    **options: Any,
) -> Path:
    r"""
    Attributes every prompt's answer across layers and writes one JSON line per
    prompt to ``out_dir/results.jsonl``, as each batch finishes.

    Resumable: prompts whose ids already have a record in ``out_dir`` (in
    ``results.jsonl`` or a per-process file) are not redone, and an incomplete
    last line left by an interruption is dropped. The batches are formed by
    index from the first prompt (prompts ``0..batch_size-1``, then the next
    ``batch_size``, ...), so a resume pads every prompt as the first run did
    and writes byte for byte the same ``results.jsonl``; a batch interrupted
    part-way is attributed again whole. The settings, the batch size and the
    model's identity (its name and a checksum of its weights) are recorded in
    ``out_dir/run.json``; resuming under other settings, another batch size or
    another model raises ``ValueError`` before any work, so one folder never
    mixes runs.

    When ``torch.distributed`` is initialised (see
    :func:`~captum_iglens.studies.batch.init_distributed`), each
    process takes every ``world_size``-th batch and writes
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
        lens (str, Path, Translators or LayerwiseReadout, optional): The
                    readout per layer, as :meth:`LayerIGLens.from_model` takes
                    it; its kind and checksum are recorded in ``run.json`` and a
                    rerun under another readout is refused. Default: None (the
                    logit readout)
        **options (Any): Fields of :class:`Settings` that override ``settings``.

    Returns:
        *Path*: ``out_dir/results.jsonl``. Each line holds ``id``, ``prompt``,
        ``answer`` and the fields of :meth:`IGLensResult.to_dict` for that prompt
        alone (``B = 1``, ``P`` its attributed tokens): ``tokens``,
        ``layer_names``, ``attributions``, ``lens``, ``base_prob``,
        ``model_prob``, ``delta``, ``targets``, ``positions`` (in the unpadded
        sequence), ...; read them with
        :func:`~captum_iglens.studies.batch.read_results` and
        :func:`~captum_iglens.studies.batch.to_result`. An empty answer (the model
        stopped at once) gets a record with no positions.
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
    run = {
        **provenance(model, settings),
        BATCH_SIZE: batch_size,
        "readout": readout_record(attributor.readout),
    }
    lock = BatchLock(out)

    def claim() -> None:
        lock.acquire()
        remove_partials(out)  # a record whose write was killed
        claim_run(out, run, model)

    try:
        from_rank_zero(claim)  # every process stops on its error, not only rank 0
    except ValueError:
        lock.release()
        raise
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
    ig_lens: LayerIGLens,
    prompts: Sequence[Dict[str, Any]],
    out: Path,
    settings: Settings,
    batch_size: int,
    progress: bool,
) -> None:
    """The prompts not done yet, attributed and merged (every process)."""
    rank, world = rank_and_world()
    distributed = in_group()
    own = out / (f"results.rank{rank}.jsonl" if distributed else RESULTS)
    drop_incomplete_line(own)
    done = done_records(out)
    check_texts(out, prompts, done)
    barrier()  # every process has read the same finished set before any writes
    batches = [
        batch
        for batch in _batches(prompts, batch_size)[rank::world]
        if any(prompt_key(p["id"]) not in done for p in batch)
    ]
    bar = tqdm(
        total=sum(prompt_key(p["id"]) not in done for b in batches for p in b),
        desc="attributing",
        unit="prompt",
        disable=not progress or rank != 0,
    )
    with open(own, "a", encoding="utf-8") as handle:
        for batch in batches:
            for record in attribute_batch(model, tokenizer, ig_lens, batch, settings):
                if prompt_key(record["id"]) in done:
                    continue  # written before an interruption: kept as it is
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                bar.update(1)
    bar.close()

    barrier()
    if rank == 0:
        merge_results(out, prompts)
    barrier()


def _batches(
    prompts: Sequence[Dict[str, Any]], batch_size: int
) -> List[Sequence[Dict[str, Any]]]:
    """The padded batches of ``prompts``, formed by index from the first prompt
    whatever is done already: a resume re-forms the batches of the first run,
    so a batch cut short is attributed with the same padding again (its done
    prompts' records are not rewritten) and every map comes out the same to the
    last bit."""
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
