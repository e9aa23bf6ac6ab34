"""Shared test helpers: hook snapshots and left-padded batches."""

from typing import Dict, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module


def hook_snapshot(model: Module) -> Dict[str, Tuple[List[int], ...]]:
    """Every hook id on every submodule, to compare before and after a call."""
    return {
        name: tuple(
            list(getattr(m, attr).keys())
            for attr in (
                "_forward_hooks",
                "_forward_pre_hooks",
                "_backward_hooks",
                "_backward_pre_hooks",
            )
        )
        for name, m in model.named_modules()
    }


def state_snapshot(model: Module) -> Tuple[Dict[str, Tensor], Dict[str, bool]]:
    """A copy of the weights and of every submodule's train/eval mode."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    return weights, modes


def assert_state_unchanged(model: Module, snapshot) -> None:
    weights, modes = snapshot
    now_weights, now_modes = state_snapshot(model)
    assert now_modes == modes
    assert weights.keys() == now_weights.keys()
    for key, value in weights.items():
        assert torch.equal(value, now_weights[key]), key


def left_padded(lengths: List[int], vocab: int, pad_id: int = 0) -> Tuple[Tensor, Tensor]:
    """Random token ids ``(B, max(lengths))`` with left padding, and their mask."""
    total = max(lengths)
    ids = torch.full((len(lengths), total), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, total - length :] = torch.randint(1, vocab, (length,))
        mask[row, total - length :] = 1
    return ids, mask
