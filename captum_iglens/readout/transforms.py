r"""The transforms some models apply to the head's output before the softmax.

Each repeats the model's own operations in the same order, so the readout's
logits are bit-identical to the model's.
"""

import torch
from torch import nn, Tensor


class Softcap(nn.Module):
    r"""Final-logit softcapping, ``cap * tanh(logits / cap)`` (Gemma 2 and 3).

    The operations are those of the model's forward, in the same order, so the
    result is bit-identical to the model's logits. Where no gradient is
    recorded, the ``tanh`` and the product are computed in place on the
    quotient, so the transform holds one ``(rows, V)`` array beside its input
    (two where autograd records it, which keeps the ``tanh``).

    Args:
        cap (float): The softcapping value, ``config.final_logit_softcapping``.
                    Must be positive.
    """

    def __init__(self, cap: float) -> None:
        super().__init__()
        if not cap > 0:
            raise ValueError(f"cap must be positive, got {cap!r}")
        self.cap = cap

    def forward(self, logits: Tensor) -> Tensor:
        if torch.is_grad_enabled() and logits.requires_grad:
            return torch.tanh(logits / self.cap) * self.cap
        return (logits / self.cap).tanh_().mul_(self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"


class LogitScale(nn.Module):
    r"""Multiplies the logits by a constant, ``logits * factor`` (Cohere).

    Args:
        factor (float): The multiplier, e.g. Cohere's ``config.logit_scale``.
    """

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, logits: Tensor) -> Tensor:
        return logits * self.factor

    def extra_repr(self) -> str:
        return f"factor={self.factor}"


class LogitDivide(nn.Module):
    r"""Divides the logits by a constant, ``logits / divisor`` (Granite).

    Kept apart from :class:`LogitScale` because ``x / s`` and ``x * (1 / s)``
    can differ in the last bit, and the readout must reproduce the model's
    logits exactly.

    Args:
        divisor (float): The divisor, e.g. Granite's ``config.logits_scaling``.
                    Must be nonzero.
    """

    def __init__(self, divisor: float) -> None:
        super().__init__()
        if divisor == 0:
            raise ValueError("divisor must be nonzero")
        self.divisor = divisor

    def forward(self, logits: Tensor) -> Tensor:
        return logits / self.divisor

    def extra_repr(self) -> str:
        return f"divisor={self.divisor}"
