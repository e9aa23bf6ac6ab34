r"""
Fitted translators written as a tuned-lens checkpoint folder (``params.pt`` with
``"{i}.weight"``, the ``d × d`` delta from the identity, and ``"{i}.bias"`` for
``i = 0 … L−1``; ``config.json`` with ``d_model``, ``num_hidden_layers``,
``bias``, ``lens_type`` and ``base_model_name_or_path``), with the fit's own
report beside it. The folder is built under a temporary name next to its place
and renamed into it when complete.
"""

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Dict

import torch
from torch import Tensor

#: The ``lens_type`` of a fitted lens's ``config.json``.
LENS_TYPE = "linear_tuned_lens"


def lens_config(weight: Tensor, model_name: str, checksum: str) -> Dict[str, Any]:
    r"""The ``config.json`` of translators ``weight`` ``(L, d, d)`` fitted on the
    model ``model_name`` whose weights have ``checksum``."""
    return {
        "base_model_name_or_path": model_name,
        "d_model": int(weight.shape[-1]),
        "num_hidden_layers": int(weight.shape[0]),
        "bias": True,
        "lens_type": LENS_TYPE,
        "model_checksum": checksum,
    }


def params_dict(weight: Tensor, bias: Tensor) -> Dict[str, Tensor]:
    r"""``params.pt``'s tensors: ``"{i}.weight"`` ``(d, d)`` and ``"{i}.bias"``
    ``(d,)``, float32, contiguous."""
    out = {}
    for i in range(weight.shape[0]):
        out[f"{i}.weight"] = weight[i].float().contiguous().clone()
        out[f"{i}.bias"] = bias[i].float().contiguous().clone()
    return out


def write_folder(folder: Path, writers: Dict[str, Callable[[Path], None]]) -> None:
    r"""
    Builds ``folder`` atomically: each ``writers[name](path)`` writes the file
    ``name`` into a temporary sibling folder, which then replaces ``folder``.

    Args:

        folder (Path): The folder; its parent must exist.
        writers (dict[str, Callable[[Path], None]]): File name to writer.
    """
    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.partial-{secrets.token_hex(6)}"
    staging.mkdir()
    try:
        for name, write in writers.items():
            write(staging / name)
        if folder.exists():
            old = folder.parent / f".{folder.name}.old-{secrets.token_hex(6)}"
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_lens_folder(
    folder: Path,
    weight: Tensor,
    bias: Tensor,
    config: Dict[str, Any],
    extra: Dict[str, Callable[[Path], None]],
) -> None:
    r"""
    Writes fitted translators as a tuned-lens checkpoint folder, atomically.

    Args:

        folder (Path): The lens folder.
        weight (Tensor): ``(L, d, d)`` deltas.
        bias (Tensor): ``(L, d)``.
        config (dict): From :func:`lens_config`.
        extra (dict[str, Callable[[Path], None]]): Further files (the report).
    """
    writers: Dict[str, Callable[[Path], None]] = {
        "params.pt": lambda p: torch.save(params_dict(weight, bias), p),
        "config.json": lambda p: p.write_text(json.dumps(config, indent=1)),
        **extra,
    }
    write_folder(folder, writers)
