r"""
A short KL fine-tune of per-layer translators from their closed-form start (the
tuned lens's objective, Belrose et al. 2023): minimise the mean over states and
rows of ``KL(p_L ‖ softmax(R(h_i + h_i W_iᵀ + b_i)))`` with Adam, the model's
readout frozen.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.readout.readout import Readout


def kl_tune(
    readout: Readout,
    states: Tensor,
    weight: Tensor,
    bias: Tensor,
    *,
    steps: int,
    lr: float = 1e-4,
    batch: int = 32,
    seed: int = 0,
    progress: Optional[object] = None,
) -> Tuple[Tensor, Tensor]:
    r"""
    Fine-tunes translators on KL to the model's output distribution.

    Args:

        readout (Readout): The model's readout ``R`` (its parameters are not
                    changed: gradients flow to the translators only).
        states (Tensor): ``(L + 1, N, d)`` training rows, ``h_L`` last.
        weight (Tensor): ``(L, d, d)`` starting translators (deltas).
        bias (Tensor): ``(L, d)``.
        steps (int): Adam steps, ``>= 1``.
        lr (float, optional): Adam's learning rate. Default: 1e-4
        batch (int, optional): Rows per step. Default: 32
        seed (int, optional): Seeds the rows drawn per step. Default: 0
        progress (tqdm, optional): Updated once per step. Default: None

    Returns:
        2-element tuple of the tuned **weight** ``(L, d, d)`` and **bias**
        ``(L, d)``, float32 on the CPU.
    """
    device = next(readout.head.parameters()).device
    w = weight.detach().to(device).clone().requires_grad_(True)
    b = bias.detach().to(device).clone().requires_grad_(True)
    optimizer = torch.optim.Adam([w, b], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    frozen = [(p, p.requires_grad) for p in readout.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            picked = torch.randint(states.shape[1], (batch,), generator=generator)
            rows = states[:, picked].to(device)
            optimizer.zero_grad()
            _loss(readout, rows, w, b).backward()
            optimizer.step()
            if progress is not None:
                progress.update()  # type: ignore[attr-defined]
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return w.detach().cpu(), b.detach().cpu()


def _loss(readout: Readout, rows: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Mean over states and rows of ``KL(p_L ‖ p_i)``."""
    with torch.no_grad():
        final = readout(rows[-1]).float().log_softmax(-1)
    translated = rows[:-1] + torch.einsum("lnd,led->lne", rows[:-1], weight)
    logits = readout(translated + bias[:, None]).float().log_softmax(-1)
    return (final.exp() * (final - logits)).sum(-1).mean()
