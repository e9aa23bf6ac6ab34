r"""
Tokenized pairs in batches of one length (no padding: a pair's two prompts
have as many tokens, and a batch holds pairs of one length), the sum of a
value over the batches, and the per-model filter: a pair is kept where the
model prefers the answer to the foil on the clean prompt. Under ``torchrun``
each process computes every ``world_size``-th batch and the values come back
in batch order (:func:`~captum_iglens.studies.distributed.computed_in_order`),
so that sums and filters are one process's to the last bit.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.studies.distributed import computed_in_order
from captum_iglens.studies.circuits.tasks import Encoded


@dataclass(frozen=True)
class Batch:
    r"""
    Pairs of one token length ``T``, as tensors.

    Attributes:

        clean (Tensor): Clean token ids, ``(B, T)``.
        counterfactual (Tensor): Counterfactual token ids, ``(B, T)``.
        answer (Tensor): The answers' first tokens, ``(B,)``.
        foil (Tensor): The foils' first tokens, ``(B,)``.
        index (Tensor): Each pair's index in the encoded list, ``(B,)``.
    """

    clean: Tensor
    counterfactual: Tensor
    answer: Tensor
    foil: Tensor
    index: Tensor


def make_batches(
    encoded: Sequence[Encoded], batch_size: int, device: Any = "cpu"
) -> List[Batch]:
    r"""
    Groups pairs by token length, in order of first appearance.

    Args:

        encoded (list[Encoded]): The tokenized pairs.
        batch_size (int): The most pairs a batch holds.
        device (Any): Where the tensors go. Default: ``"cpu"``

    Returns:
        *list[Batch]*, each pair in exactly one.
    """
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    by_length: Dict[int, List[int]] = {}
    for i, pair in enumerate(encoded):
        by_length.setdefault(len(pair.clean), []).append(i)
    out = []
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            rows = [encoded[i] for i in chunk]

            def ids(values: List[Any]) -> Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            out.append(
                Batch(
                    clean=ids([r.clean for r in rows]),
                    counterfactual=ids([r.counterfactual for r in rows]),
                    answer=ids([r.answer for r in rows]),
                    foil=ids([r.foil for r in rows]),
                    index=ids(chunk),
                )
            )
    return out


def batch_sum(
    batches: Sequence[Batch], per_batch: Callable[[Batch], Tensor], total: Tensor
) -> Tensor:
    r"""
    ``total`` plus every batch's value, added in batch order; under
    ``torchrun`` each process computes its share of the batches and every
    process gets the same sum, bit for bit one process's.

    Args:

        batches (list[Batch]): The batches.
        per_batch (Callable[[Batch], Tensor]): A batch's value, on the CPU,
                    of ``total``'s shape.
        total (Tensor): Where the sum starts (added to in place).

    Returns:
        *Tensor*: ``total``.
    """
    for value in computed_in_order(batches, per_batch):
        total += value
    return total


@torch.no_grad()
def filter_pairs(
    model: Any, encoded: Sequence[Encoded], batch_size: int = 16
) -> Tuple[List[Encoded], Dict[str, int]]:
    r"""
    Keeps the pairs where the model prefers the answer to the foil on the
    clean prompt (its next-token logit is higher), with one plain forward of
    the model per batch of clean prompts.

    Args:

        model (Any): A Hugging Face causal LM.
        encoded (list[Encoded]): The tokenized pairs.
        batch_size (int): Pairs per forward. Default: 16

    Returns:
        2-element tuple of **kept** (*list[Encoded]*, in order) and **counts**
        (*dict[str, int]*: ``"pairs"``, ``"kept"``, ``"prefers foil"``).
    """
    device = next(model.parameters()).device
    keep = [False] * len(encoded)

    def prefers(batch: Batch) -> List[bool]:
        logits = model(input_ids=batch.clean).logits[:, -1].float()
        rows = torch.arange(len(batch.index), device=device)
        return (logits[rows, batch.answer] > logits[rows, batch.foil]).tolist()

    batches = make_batches(encoded, batch_size, device)
    for batch, flags in zip(batches, computed_in_order(batches, prefers)):
        for i, ok in zip(batch.index.tolist(), flags):
            keep[i] = bool(ok)
    kept = [pair for pair, ok in zip(encoded, keep) if ok]
    counts = {
        "pairs": len(encoded),
        "kept": len(kept),
        "prefers foil": len(encoded) - len(kept),
    }
    return kept, counts
