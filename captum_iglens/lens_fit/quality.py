r"""
How good a per-layer readout is, on held-out states (the tuned-lens paper's
figure): per state ``h_i``, the KL divergence from the model's output
distribution to the readout's, ``KL(p_L ‖ p_i)`` in nats, and how often the
readout's most probable token is the model's.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.readout.readout import Readout
from captum_iglens.readout.translators import Translators


@dataclass
class Quality:
    r"""
    Per state ``h_0 … h_L``: the mean KL from the model's output and the top-1
    agreement with it, over held-out rows.

    Attributes:

        kl (Tensor): ``(L + 1,)`` float64, nats; 0 at ``h_L``.
        top1 (Tensor): ``(L + 1,)`` float64 in ``[0, 1]``; 1 at ``h_L``.
    """

    kl: Tensor
    top1: Tensor


@torch.no_grad()
def lens_quality(
    readout: Readout,
    states: Tensor,
    translators: Optional[Translators] = None,
    chunk: int = 64,
) -> Quality:
    r"""
    The quality of a readout at every state of held-out rows.

    Args:

        readout (Readout): The model's readout ``R``.
        states (Tensor): ``(L + 1, N, d)``: ``h_0 … h_L`` per row.
        translators (Translators, optional): One per state ``h_0 … h_{L−1}``
                    (None: the logit lens). Default: None
        chunk (int, optional): Rows read out at once. Default: 64

    Returns:
        :class:`Quality`.
    """
    last = states.shape[0] - 1
    kl = torch.zeros(last + 1, dtype=torch.float64)
    top1 = torch.zeros(last + 1, dtype=torch.float64)
    device = next(readout.head.parameters()).device
    dtype = next(readout.head.parameters()).dtype
    for start in range(0, states.shape[1], chunk):
        rows = states[:, start : start + chunk].to(device, dtype)
        final = readout(rows[last]).float().log_softmax(-1)
        best = final.argmax(-1)
        for i in range(last + 1):
            h = rows[i]
            if translators is not None:
                h = translators(h, torch.full((len(h),), i))
            divergence, agree = _compare(final, best, readout(h))
            kl[i] += divergence
            top1[i] += agree
    n = states.shape[1]
    return Quality(kl=kl / n, top1=top1 / n)


def _compare(final: Tensor, best: Tensor, logits: Tensor) -> Tuple[float, float]:
    """Summed ``KL(final ‖ logits)`` and count of equal argmaxes over rows."""
    log_q = logits.float().log_softmax(-1)
    divergence = (final.exp() * (final - log_q)).sum(-1).clamp_min(0).sum()
    return float(divergence), float((log_q.argmax(-1) == best).sum())
