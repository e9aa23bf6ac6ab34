r"""How a lens is fitted, without torch (the command line's help reads the
defaults)."""

import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class FitOptions:
    r"""
    How a lens is fitted.

    Attributes:

        tokens (int): Fitting rows (positions, the first of each sequence left
                    out). Default: 8192
        eval_tokens (int): Held-out rows for the report. Default: 256
        length (int): Tokens per sampled sequence or corpus window. Default: 128
        batch (int): Sequences sampled or run together. Default: 32
        seed (int): Seeds the sampling and the tuning. Default: 0
        ridge (float): Relative ridge of the closed form (see
                    :func:`~captum_iglens.lens_fit.gram.solve_ridge`).
                    Default: 0.01
        kl_steps (int): Adam steps of the KL fine-tune (0: none). Default: 0
        kl_lr (float): Its learning rate. Default: 1e-4
        kl_batch (int): Rows per step. Default: 16
        kl_tokens (int): Fitting rows kept for the fine-tune. Default: 1024
        curve (tuple[int, ...]): Fitting sizes below ``tokens`` at which the
                    closed form is also solved and reported. Default: ()
        corpus (list[str], optional): Texts to fit on; None samples from the
                    model. Default: None
    """

    tokens: int = 8192
    eval_tokens: int = 256
    length: int = 128
    batch: int = 32
    seed: int = 0
    ridge: float = 0.01
    kl_steps: int = 0
    kl_lr: float = 1e-4
    kl_batch: int = 16
    kl_tokens: int = 1024
    curve: Tuple[int, ...] = ()
    corpus: Optional[List[str]] = field(default=None, repr=False)

    def check(self) -> None:
        r"""Raises ``ValueError`` naming the first option out of range."""
        for name, low in (
            ("tokens", 2),
            ("eval_tokens", 1),
            ("length", 2),
            ("batch", 1),
            ("kl_steps", 0),
            ("kl_batch", 1),
            ("kl_tokens", 1),
            ("seed", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        for name in ("ridge", "kl_lr"):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"{name}: expected a number > 0, got {value!r}")
        bad = [n for n in self.curve if not 2 <= n < self.tokens]
        if bad:
            raise ValueError(
                f"curve: expected sizes in [2, tokens={self.tokens}), got {bad}"
            )
