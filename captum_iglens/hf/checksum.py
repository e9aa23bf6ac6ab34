r"""
The one checksum of a model's weights: the name of its fitted-lens cache folder
(:mod:`~captum_iglens.lens_fit.cache`), recorded in the lenses fitted on it and
in a batch folder's ``run.json`` (:mod:`~captum_iglens.studies.batch`).
"""

import hashlib

import torch
from torch.nn import Module


@torch.no_grad()
def weights_checksum(model: Module) -> str:
    r"""
    The sha256 of a model's parameters and buffers (names, dtypes, shapes and
    bytes, in name order of its ``state_dict``): the same weights give the same
    checksum whatever folder or file they were loaded from.

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
