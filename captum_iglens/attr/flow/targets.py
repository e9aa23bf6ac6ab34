r"""
What the flow attributes: ``m`` of the logits at one position, ``p(y)``,
``p(y) − p(foil)`` or ``logit(y) − logit(foil)``.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from captum_iglens.attr.flow.options import TARGETS


@dataclass(frozen=True)
class FlowTarget:
    r"""
    The target ``m`` of the flow.

    Args:
        kind (str): One of :data:`~captum_iglens.attr.flow.options.TARGETS`.
        token (int): The token ``y``.
        position (int): The position ``t`` whose logits are read (non-negative).
        foil (int, optional): The foil token, for the differences. Default: None
    """

    kind: str
    token: int
    position: int
    foil: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in TARGETS:
            raise ValueError(
                f"target_kind: expected one of {TARGETS}, got {self.kind!r}"
            )
        if (self.foil is None) != (self.kind == "prob"):
            raise ValueError(
                f"foil: target_kind {self.kind!r} "
                + ("takes no foil" if self.kind == "prob" else "needs a foil token")
            )
        if self.foil is not None and self.foil == self.token:
            raise ValueError(f"foil: must differ from the target token {self.token}")

    def __call__(self, logits: Tensor) -> Tensor:
        r"""
        Args:
            logits (Tensor): ``(P, T, V)``.

        Returns:
            *Tensor* ``(P,)`` float32: ``m`` per row.
        """
        return self.of_row(logits[:, self.position])

    def of_row(self, row: Tensor) -> Tensor:
        r"""
        Args:
            row (Tensor): ``(P, V)``: the logits at ``position``.

        Returns:
            *Tensor* ``(P,)`` float32: ``m`` per row.
        """
        row = row.float()
        if self.kind == "logit_diff":
            assert self.foil is not None
            return row[:, self.token] - row[:, self.foil]
        probs = torch.softmax(row, dim=-1)
        if self.kind == "prob":
            return probs[:, self.token]
        assert self.foil is not None
        return probs[:, self.token] - probs[:, self.foil]
