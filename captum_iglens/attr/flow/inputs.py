r"""
The flow's pairs, checked before the model runs: the prompts as token ids
``(B, T)``, their counterfactuals or baselines, and each pair's target and foil
tokens. A batch holds ``B`` pairs of one token length: each row is read as a
whole prompt (there is no attention mask), so a padded batch is not supported.
"""

from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from captum_iglens.graph.target import resolve_token

Prompt = Union[str, Tensor]
TokenSpec = Union[None, int, str, Sequence[Union[int, str]], Tensor]

#: Why a batch must be one tensor of prompts of one length.
EQUAL_LENGTHS = (
    "a batch is one (B, T) tensor of prompts of equal token length; a padded "
    "batch is not supported (the flow reads every position of every row)"
)


def prompt_ids(prompt: Any, name: str, tokenizer: Any, vocab: int) -> Tensor:
    r"""
    A prompt, or a batch of them, as token ids.

    Args:
        prompt (str or Tensor): Text (with a tokenizer) or token ids
                    ``(B, T)``.
        name (str): The argument's name, for messages.
        tokenizer (PreTrainedTokenizerBase or None): For text.
        vocab (int): The model's vocabulary size.

    Returns:
        *Tensor* ``(B, T)`` long, ``B, T >= 1``.

    Raises:
        ValueError: Naming ``name``, for text without a tokenizer, a list of
            prompts, a tensor that is not ``(B, T)`` long, or ids outside the
            vocabulary.
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"{name}: text needs a tokenizer; pass token ids (B, T)")
        prompt = tokenizer(prompt, return_tensors="pt").input_ids
    if isinstance(prompt, (list, tuple)):
        raise ValueError(
            f"{name}: got a {type(prompt).__name__} of prompts; {EQUAL_LENGTHS}"
        )
    if (
        not isinstance(prompt, Tensor)
        or prompt.dtype != torch.long
        or prompt.dim() != 2
    ):
        raise ValueError(f"{name}: expected text or token ids, a (B, T) long tensor")
    if prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(
            f"{name}: expected non-empty sequences (B, T), got {tuple(prompt.shape)}"
        )
    if bool(((prompt < 0) | (prompt >= vocab)).any()):
        raise ValueError(f"{name}: token ids must lie in [0, {vocab})")
    return prompt


def check_counterfactual(ids: Tensor, prompts: Tensor) -> None:
    r"""
    Refuses counterfactual prompts ``ids`` that are not one per prompt, of the
    prompts' token length.

    Args:
        ids (Tensor): ``(B', T')``: the counterfactuals.
        prompts (Tensor): ``(B, T)``: the prompts.

    Raises:
        ValueError: Naming ``counterfactual``.
    """
    if ids.shape[1] != prompts.shape[1]:
        raise ValueError(
            f"counterfactual: {ids.shape[1]} tokens, but the prompt has "
            f"{prompts.shape[1]}; the flow's path needs prompts of equal token "
            "length (reword one of them)"
        )
    if ids.shape[0] != prompts.shape[0]:
        raise ValueError(
            f"counterfactual: {ids.shape[0]} prompt(s), but inputs has "
            f"{prompts.shape[0]}; give one counterfactual per prompt, "
            f"{tuple(prompts.shape)}"
        )


def check_baselines(baselines: Tensor, n_pairs: int, length: int, d: int) -> None:
    r"""
    Refuses a baseline tensor that is not the first block's input of one or
    of every pair, ``(1, T, d)`` or ``(B, T, d)`` float and finite.

    Raises:
        ValueError: Naming ``baselines``.
    """
    shapes = {(1, length, d), (n_pairs, length, d)}
    if (
        not isinstance(baselines, Tensor)
        or tuple(baselines.shape) not in shapes
        or not baselines.dtype.is_floating_point
    ):
        rows = "1" if n_pairs == 1 else f"1 or {n_pairs}"
        raise ValueError(
            "baselines: expected 'pad', 'mean' or a float tensor "
            f"({rows}, {length}, {d})"
        )
    if not bool(torch.isfinite(baselines).all()):
        raise ValueError(
            "baselines: the tensor holds NaN or infinite values; the path "
            "starts from it, so every value must be finite"
        )


def pair_tokens(
    token: TokenSpec, name: str, n_pairs: int, tokenizer: Any, vocab: int
) -> Optional[Tuple[int, ...]]:
    r"""
    A target or foil token for each of ``n_pairs`` pairs.

    Args:
        token (int, str, sequence, Tensor or None): One token for every pair
                    (an id or the text of one token), or one per pair (a
                    sequence or a 1-D integer tensor of ``n_pairs``).
        name (str): The argument's name, for messages.
        n_pairs (int): The pairs ``B``.
        tokenizer (PreTrainedTokenizerBase or None): For text.
        vocab (int): The model's vocabulary size.

    Returns:
        *tuple[int, ...]* of ``n_pairs`` ids, or None (for None).

    Raises:
        ValueError: Naming ``name`` (with the pair's index), for a token that
            does not resolve or a sequence whose length is not ``n_pairs``.
        TypeError: Naming ``name``, for a tensor that is not of integers.
    """
    if token is None:
        return None
    if isinstance(token, Tensor):
        bad = token.dtype.is_floating_point or token.dtype.is_complex
        if bad or token.dtype == torch.bool or token.dim() > 1:
            raise TypeError(
                f"{name}: expected a token id, text, or one id per pair (a 1-D "
                f"integer tensor of {n_pairs}), got a {token.dtype} tensor of "
                f"shape {tuple(token.shape)}"
            )
        token = int(token) if token.dim() == 0 else [int(t) for t in token]
    if isinstance(token, (int, str)):
        one = resolve_token(token, name, tokenizer, vocab)
        assert one is not None
        return (one,) * n_pairs
    if not isinstance(token, Sequence):
        raise TypeError(
            f"{name}: expected a token id, text, or one per pair, got "
            f"{type(token).__name__}"
        )
    if len(token) != n_pairs:
        raise ValueError(f"{name}: {len(token)} tokens for {n_pairs} pair(s)")
    found = [
        resolve_token(t, f"{name}[{i}]", tokenizer, vocab) for i, t in enumerate(token)
    ]
    if any(t is None for t in found):
        raise ValueError(f"{name}: a token per pair, got None in {list(token)!r}")
    return tuple(int(t) for t in found if t is not None)


def check_distinct(
    tokens: Optional[Tuple[int, ...]], foils: Optional[Tuple[int, ...]]
) -> None:
    """Refuses a pair whose given foil is its given target token."""
    if tokens is None or foils is None:
        return
    for i, (token, foil) in enumerate(zip(tokens, foils)):
        if token == foil:
            where = f" (pair {i})" if len(tokens) > 1 else ""
            raise ValueError(f"foil: must differ from the target token {token}{where}")
