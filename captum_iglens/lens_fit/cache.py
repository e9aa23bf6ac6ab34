r"""
Where fitted lenses are kept: one folder per model, named by a checksum of the
model's weights, under the model cache's root
(:func:`~captum_iglens.hf.models.cache_root`, ``lenses/<checksum>/``), like the
embedded models' verified cache.
"""

import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
from torch.nn import Module


@torch.no_grad()
def model_checksum(model: Module) -> str:
    r"""
    The sha256 of a model's parameters and buffers (names, dtypes, shapes and
    bytes, in name order): the same weights give the same checksum whatever
    folder or file they were loaded from.

    Args:

        model (Module): The model.

    Returns:
        *str*: 64 hex digits.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(
            value.view(torch.uint8).numpy().tobytes() if value.numel() else b""
        )
    return digest.hexdigest()


def lens_cache_folder(checksum: str, cache_dir: Optional[Any] = None) -> Path:
    r"""
    The folder of the cached fitted lens of the model with ``checksum``.

    Args:

        checksum (str): From :func:`model_checksum`.
        cache_dir (str or Path, optional): The cache root, as in
                    :func:`~captum_iglens.hf.models.load_embedded`. Default: None
                    (``$CAPTUM_IGLENS_CACHE``, else the user cache).

    Returns:
        *Path* ``<root>/lenses/<first 16 hex digits>`` (it may not exist yet).
    """
    from captum_iglens.hf.models import cache_root

    return cache_root(cache_dir) / "lenses" / checksum[:16]
