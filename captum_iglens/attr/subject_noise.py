r"""
ROME's corruption of a prompt's subject (Meng et al. 2022), in one place for
the restoration study and the probability flow's ``corrupt_subject``: Gaussian
noise of ``NOISE_SCALE`` times the embeddings' standard deviation
(:func:`embedding_std`), added to the embeddings of the tokens that overlap the
subject's characters (:func:`subject_mask`), one draw per seed
(:func:`noise_draw`).
"""

from typing import Any, List, Tuple, cast

import torch
from torch import Tensor
from torch.nn import Module

#: The noise's standard deviation in units of :func:`embedding_std` (ROME's 3).
NOISE_SCALE = 3.0


@torch.no_grad()
def embedding_std(model: Module, chunk: int = 16384) -> float:
    r"""
    The standard deviation of the input embeddings over the whole vocabulary, as
    the embedding module returns them (after any scaling it applies, as Gemma's
    does), over all ids and coordinates.

    Args:

        model (PreTrainedModel): A causal LM.
        chunk (int, optional): Ids embedded at a time. Default: 16384.

    Returns:
        *float*.
    """
    embed = cast(Any, model).get_input_embeddings()
    vocab = embed.weight.shape[0]
    device = embed.weight.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    squares = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for start in range(0, vocab, chunk):
        ids = torch.arange(start, min(vocab, start + chunk), device=device)
        values = embed(ids[None]).double()
        total += values.sum()
        squares += (values * values).sum()
        count += values.numel()
    mean = total / count
    return float(((squares / count - mean * mean) * count / (count - 1)).sqrt())


def subject_mask(
    tokenizer: Any, prompt: str, span: Tuple[int, int], length: int
) -> Tensor:
    r"""
    The tokens of ``prompt`` (as the tokenizer encodes it plainly) that overlap
    the characters ``span``.

    Args:
        tokenizer (PreTrainedTokenizerBase): A fast tokenizer (it returns
                    offsets).
        prompt (str): The text.
        span (tuple[int, int]): The subject's ``(start, end)`` characters.
        length (int): The prompt's token count, which the offsets must match.

    Returns:
        *Tensor* ``(T,)`` bool.

    Raises:
        ValueError: If the offsets do not match ``length`` tokens.
    """
    offsets: List[Tuple[int, int]] = tokenizer(prompt, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    if len(offsets) != length:
        raise ValueError(f"tokenizer: offsets of {prompt!r} do not match its ids")
    start, end = span
    return torch.tensor([a < end and b > start and b > a for a, b in offsets])


def noise_draw(
    mask: Tensor, subject: Tensor, seed: int, width: int, noise_std: float
) -> Tensor:
    r"""
    ``(B, T, d)``: one seed's noise on the subject's embeddings. Each sequence
    draws ``torch.randn(n, d)`` over its ``n`` real tokens (left-padded) from a
    generator seeded with ``seed``, so that the noise does not depend on the
    batch it is drawn in.

    Args:
        mask (Tensor): ``(B, T)``: the attention mask, zeros at left padding.
        subject (Tensor): ``(B, T)`` bool: the tokens to noise.
        seed (int): The draw's seed.
        width (int): The embeddings' width ``d``.
        noise_std (float): The noise's standard deviation.

    Returns:
        *Tensor* float32, zero outside ``subject``.
    """
    batch, length = mask.shape
    draw = torch.zeros(batch, length, width)
    for b, n in enumerate(mask.sum(-1).tolist()):
        generator = torch.Generator().manual_seed(int(seed))
        draw[b, length - n :] = torch.randn(n, width, generator=generator)
    where = subject.to(device=draw.device, dtype=draw.dtype)[..., None]
    return draw * noise_std * where
