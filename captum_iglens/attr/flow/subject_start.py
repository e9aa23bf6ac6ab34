r"""
The flow's path start by ROME's corruption of the prompt's subject
(``corrupt_subject=``): the restoration study's noise
(:mod:`captum_iglens.attr.subject_noise`) on the embeddings of the
subject's tokens, the rest of the prompt unchanged.
"""

from typing import Any, Dict, Tuple, cast

import torch
from torch import Tensor

from captum_iglens.attr.subject_noise import (
    embedding_std,
    noise_draw,
    subject_mask,
)
from captum_iglens.attr.flow.engine import first_block_inputs
from captum_iglens.hf.parts import ModelParts


def subject_positions(tokenizer: Any, prompt: Any, subject: Any, length: int) -> Tensor:
    r"""
    The prompt's tokens that overlap the last occurrence of ``subject`` (as the
    restoration study finds a fact's given subject).

    Args:
        tokenizer (PreTrainedTokenizerBase, optional): A fast tokenizer.
        prompt (str): The prompt's text.
        subject (str): The subject's text.
        length (int): The prompt's token count.

    Returns:
        *Tensor* ``(T,)`` bool, with at least one position.

    Raises:
        ValueError: Naming ``corrupt_subject``, if the prompt is not text, or
            the subject is empty or not in the prompt.
    """
    if not isinstance(subject, str) or not subject.strip():
        raise ValueError(
            f"corrupt_subject: expected the subject's text, got {subject!r}"
        )
    if not isinstance(prompt, str) or tokenizer is None:
        raise ValueError("corrupt_subject: needs the prompt as text, with a tokenizer")
    start = prompt.rfind(subject)
    if start < 0:
        raise ValueError(
            f"corrupt_subject: {subject!r} is not in the prompt {prompt!r}"
        )
    where = subject_mask(tokenizer, prompt, (start, start + len(subject)), length)
    if not where.any():
        raise ValueError(f"corrupt_subject: no token of the prompt covers {subject!r}")
    return where


@torch.no_grad()
def noised_start(
    parts: ModelParts, ids: Tensor, subject: Tensor, scale: float, seed: int
) -> Tuple[Tensor, Dict[str, Any]]:
    r"""
    The first block's input with the subject's embeddings noised: Gaussian
    noise of ``scale`` times the embeddings' standard deviation, the draw of
    ``seed`` (the study's draw of that seed for this prompt), added at the
    embedding module's output.

    Args:
        parts (ModelParts): The model's parts.
        ids (Tensor): ``(1, T)`` long: the prompt.
        subject (Tensor): ``(T,)`` bool: :func:`subject_positions`.
        scale (float): The noise's standard deviation in embedding standard
                    deviations.
        seed (int): The draw's seed.

    Returns:
        2-element tuple of the first block's input ``(1, T, d)`` and the
        graph's ``counterfactual`` record.
    """
    embed = cast(Any, parts.model).get_input_embeddings()
    std = scale * embedding_std(parts.model)
    draw = noise_draw(
        torch.ones_like(ids), subject[None], seed, embed.embedding_dim, std
    ).to(ids.device)

    def add(_: Any, args: Any, output: Tensor) -> Tensor:
        return output + draw.to(output.dtype)

    handle = embed.register_forward_hook(add)
    try:
        start = first_block_inputs(parts, ids)
    finally:
        handle.remove()
    record = {
        "kind": "subject_noise",
        "positions": subject.nonzero()[:, 0].tolist(),
        "noise_scale": scale,
        "noise_std": std,
        "seed": seed,
    }
    return start, record
