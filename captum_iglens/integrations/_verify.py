r"""The check that a wrapper computes the same logits as the model it wraps."""

from typing import Callable

import torch
from torch import nn, Tensor

from captum_iglens.hf.probe import tolerance, verification_ids


def check_same_logits(
    wrapper_name: str, wrapper_logits: Callable[[Tensor], Tensor], model: nn.Module
) -> None:
    r"""Checks that a wrapper's logits equal those of the model it wraps.

    Args:
        wrapper_name (str): For the message, e.g. ``"TransformerBridge"``.
        wrapper_logits (Callable): Maps ids ``(1, T)`` to the wrapper's logits
                    ``(1, T, V)``.
        model (nn.Module): The wrapped Hugging Face model.

    Raises:
        ValueError: If they differ by more than ``1e-4`` (fp32; ``3e-2``
            otherwise) relative to ``1 + max |logits|``.
    """
    ids = verification_ids(model)
    with torch.no_grad():
        theirs = wrapper_logits(ids).float()
        ours = model(input_ids=ids).logits.float().to(theirs.device)
    scale = 1.0 + ours.abs().max().item()
    error = float("inf")
    if theirs.shape == ours.shape:
        error = (theirs - ours).abs().max().item() / scale
    if not error <= tolerance(next(model.parameters()).dtype):
        raise ValueError(
            f"model: the {wrapper_name}'s logits differ from those of the "
            f"{type(model).__name__} it wraps (relative difference {error:.3g}); "
            "IG-Lens reads the wrapped model out and would not explain the "
            "wrapper's output. Undo the wrapper's weight processing (e.g. "
            "TransformerLens' compatibility mode) or pass the model itself"
        )
