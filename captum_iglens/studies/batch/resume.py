r"""
The ``run.json`` of a batch folder, which makes a rerun resume only the same
run: the settings, the readout (kind and checksum) and the model's weights
(:func:`~captum_iglens.hf.checksum.weights_checksum`) it was written with. The
model's name or path is kept for the reader, not compared: a folder given
relatively is the same model.
"""

import hashlib
from dataclasses import fields
import json
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch.nn import Module

from captum_iglens._utils.serialization import plain, write_atomic
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.checksum import weights_checksum
from captum_iglens.readout.layer_readout import (
    LensType,
    readout_record,
    resolve_readout,
)
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.batch.records import check_texts, done_records, result_files

#: The settings and model identity of the run that writes ``out_dir``.
RUN = "run.json"
#: The key of ``run.json`` that holds the weights' checksum.
WEIGHTS = "weights_checksum"
#: The key under which a ``run.json`` written by version 0.1.0 holds the older
#: checksum of the weights (``_weights_sha256_0_1``), still read.
WEIGHTS_0_1 = "weights_sha256"
#: The key of ``run.json`` that holds the prompts per padded batch (a
#: ``run.json`` written before it was recorded has none, and is not checked).
BATCH_SIZE = "batch_size"
#: The key of ``run.json`` that records the dtype of the model's weights.
DTYPE = "model_dtype"
#: The readout a ``run.json`` without one was written under.
_LOGIT_READOUT = readout_record(None)


def check_resume(
    out_dir: Union[str, Path],
    prompts: Sequence[Dict[str, Any]],
    settings: Settings,
    batch_size: Optional[int] = None,
) -> None:
    r"""
    The checks of a rerun in ``out_dir`` that need no model, for a caller that
    loads the model afterwards (the CLI): the settings and the batch size
    recorded in ``run.json`` and the texts of the prompts already done.
    :func:`~captum_iglens.studies.batch.run_batch` makes them again, with the
    weights' checksum.

    Args:

        out_dir (str or Path): The output folder.
        prompts (list[dict]): The prompts of the rerun.
        settings (Settings): Its settings.
        batch_size (int, optional): Its prompts per padded batch. Default:
                    None (not checked)

    Raises:
        ValueError: If the folder was written with other settings or another
            batch size, holds results but no ``run.json``, or holds a prompt or
            given answer that differs under the same id (naming the ids).
    """
    out = Path(out_dir)
    if not out.is_dir():
        return
    if (out / RUN).exists():
        recorded = read_run(out)
        _compare(out, recorded, {"settings": settings.to_dict()}, "settings")
        if batch_size is not None:
            check_batch_size(out, recorded, batch_size)
    elif any(f.exists() for f in result_files(out)):
        raise ValueError(
            f"out_dir: {out} holds results but no {RUN}, so their settings are "
            "unknown; choose a new --out folder"
        )
    check_texts(out, prompts, done_records(out))


def check_model(
    out_dir: Union[str, Path],
    model: Any,
    lens: LensType = None,
) -> None:
    r"""
    Checks the model against the one recorded in ``out_dir/run.json`` (if any)
    by the checksum of its weights, and the readout (``lens``, as in
    :func:`~captum_iglens.studies.batch.run_batch`) by its kind and checksum,
    before any work.

    Raises:
        ValueError: If the weights or the readout differ, showing both in full.
    """
    out = Path(out_dir)
    if not (out / RUN).exists():
        return
    parts = model_parts(model)
    recorded = read_run(out)
    _check_weights(
        out, recorded, parts.model, provenance(parts.model, Settings())["model"]
    )
    readout = resolve_readout(parts.readout(), lens, parts.blocks)
    ours = {"readout": readout_record(readout)}
    _compare(out, recorded, ours, "readout")


def claim_run(
    out: Path,
    run: Dict[str, Any],
    model: Module,
    results: Optional[Sequence[Path]] = None,
    weights: Optional[str] = None,
) -> None:
    r"""
    Records ``run`` with the dtype and the checksum of ``model``'s weights in
    ``out/run.json``, or checks a rerun against the record there: every key
    of ``run`` but those of :data:`UNCOMPARED`, then the weights.

    Args:

        out (Path): The folder.
        run (dict): What identifies the run: for a batch its settings, batch
                    size, readout and model name
                    (:func:`~captum_iglens.settings.provenance`); any plain
                    values.
        model (Module): The model, whose weights are recorded.
        results (list[Path], optional): The files that hold results, which
                    a folder without ``run.json`` must not. Default: None (a
                    batch's results files)
        weights (str, optional): ``model``'s
                    :func:`~captum_iglens.hf.checksum.weights_checksum`, where
                    the caller has it. Default: None (computed here)

    Raises:
        ValueError: If a key or the weights differ from the record, showing
            both, or ``results`` exist without a record.
    """
    path = out / RUN
    if not path.exists():
        found = result_files(out) if results is None else results
        if any(f.exists() for f in found):
            raise ValueError(
                f"out_dir: {out} holds results but no {RUN}, so their settings are "
                "unknown; choose a new --out folder"
            )
        checksum = weights_checksum(model) if weights is None else weights
        record = {**run, DTYPE: _dtype(model), WEIGHTS: checksum}
        write_atomic(path, json.dumps(plain(record), indent=1))
        return
    check_run(out, run, model, weights)


def check_run(
    out: Path, run: Dict[str, Any], model: Module, weights: Optional[str] = None
) -> None:
    r"""
    Checks a rerun against ``out/run.json``, as :func:`claim_run` does, without
    writing: every key of ``run`` but those of :data:`UNCOMPARED`
    (:func:`compare_run`), then the dtype and checksum of ``model``'s weights.
    Nothing is checked where the folder holds no ``run.json``.

    Args:

        out (Path): The folder.
        run (dict): What identifies the rerun, as in :func:`claim_run`; its
                    ``"model"`` is the model's name, shown when the weights
                    differ.
        model (Module): The model, whose weights are checked.
        weights (str, optional): ``model``'s
                    :func:`~captum_iglens.hf.checksum.weights_checksum`, where
                    the caller has it. Default: None (computed here)

    Raises:
        ValueError: If a key or the weights differ from the record.
    """
    if not (out / RUN).exists():
        return
    recorded = read_run(out)
    ours = json.loads(json.dumps(plain(run)))
    compare_run(out, recorded, ours)
    _check_weights(out, recorded, model, ours["model"], weights)


#: The keys of a run record a rerun need not match: the model's name (a
#: folder given relatively is the same model; its weights' checksum is
#: compared) and the package versions.
UNCOMPARED = ("model", "versions")


def compare_run(out: Path, recorded: Dict[str, Any], ours: Dict[str, Any]) -> None:
    r"""
    Refuses a rerun whose record ``ours`` differs from the ``recorded`` one of
    ``out`` in a key but those of :data:`UNCOMPARED` (the batch size with its
    own message, :func:`check_batch_size`), in the order of ``ours``.

    Args:

        out (Path): The folder, for messages.
        recorded (dict): Its ``run.json`` (:func:`read_run`).
        ours (dict): The rerun's record, as plain JSON values.

    Raises:
        ValueError: Showing the first key's differing values in full.
    """
    for key in ours:
        if key == BATCH_SIZE:
            check_batch_size(out, recorded, ours[key])
        elif key not in UNCOMPARED:
            _compare(out, recorded, ours, key)


def check_batch_size(out: Path, recorded: Dict[str, Any], batch_size: int) -> None:
    """Refuses to resume under another batch size than the recorded one (the
    batches would be padded otherwise, and the maps differ in their last
    digits); a ``run.json`` that records none is not checked."""
    old = recorded.get(BATCH_SIZE, batch_size)
    if old != batch_size:
        raise ValueError(
            f"out_dir: {out} was written with batch size {old!r} ({batch_size!r} "
            "now); a resume re-forms the same padded batches only under the same "
            f"size. Rerun with --batch-size {old!r} (batch_size={old!r}) or choose "
            "a new --out folder"
        )


def read_run(out: Path) -> Dict[str, Any]:
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


def _check_weights(
    out: Path,
    recorded: Dict[str, Any],
    model: Module,
    name: str,
    weights: Optional[str] = None,
) -> None:
    """Refuses to resume when ``model``'s weights are not the recorded ones, by
    the checksum ``run.json`` holds (the older form for a folder written by
    version 0.1.0); ``name`` is the model's name now, shown beside the one then;
    ``weights`` is the model's checksum where the caller has it."""
    ours_dtype = _dtype(model)
    if recorded.get(DTYPE, ours_dtype) != ours_dtype:
        raise ValueError(
            f"out_dir: {out} was written with the model in {recorded[DTYPE]}, this "
            f"run has it in {ours_dtype} (the dtype differs, so do the weights' "
            f"checksums); rerun with dtype {recorded[DTYPE]} (--dtype "
            f"{recorded[DTYPE]}) or choose a new --out folder"
        )
    old = WEIGHTS_0_1 in recorded and WEIGHTS not in recorded
    key = WEIGHTS_0_1 if old else WEIGHTS
    if old:
        ours = {key: _weights_sha256_0_1(model)}
    else:
        ours = {key: weights_checksum(model) if weights is None else weights}
    names = f"; model {recorded.get('model')!r} then, {name!r} now"
    _compare(out, recorded, ours, key, names)


def _dtype(model: Module) -> str:
    """The dtype of ``model``'s first parameter, e.g. ``"float32"``."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


@torch.no_grad()
def _weights_sha256_0_1(model: Module) -> str:
    """The checksum of the weights that version 0.1.0 recorded as
    ``weights_sha256``: the parameters, then the buffers (non-persistent ones
    included), in module order. Kept only to resume the folders it wrote."""
    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{data.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _compare(
    out: Path, recorded: Dict[str, Any], ours: Dict[str, Any], key: str, more: str = ""
) -> None:
    """Refuses to resume when ``key`` of ``run.json`` differs from this run's."""
    if recorded.get(key) != ours[key]:
        absent = _SETTINGS_DEFAULTS if key == "settings" else {}
        changed = _differences(recorded.get(key), ours[key], absent)
        raise ValueError(
            f"out_dir: {out} was written with other {key.replace('_', ' ')} "
            f"({changed}{more}); resuming would "
            "mix results. Rerun with the recorded settings and model or choose a "
            "new --out folder"
        )


#: What a settings field absent from a record stands for: its default
#: (:meth:`Settings.to_dict` writes some fields only where they differ).
_SETTINGS_DEFAULTS = {f.name: f.default for f in fields(Settings)}


def _differences(old: Any, new: Any, absent: Dict[str, Any]) -> str:
    """Every differing value, in full; a key absent from a dict reads as its
    value in ``absent``."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return ", ".join(
            f"{k}: {old.get(k, absent.get(k))!r} then, "
            f"{new.get(k, absent.get(k))!r} now"
            for k in keys
        )
    return f"{old!r} then, {new!r} now"
