r"""What the path integrals need of a readout: the interface every readout of
IG-Lens implements.

A readout maps hidden states to logits. It carries the index of the path point
it reads (``layer``): the model's own :class:`~captum_iglens.readout.Readout`
reads every point the same way and ignores it, while a per-layer readout ``f_l``
(tuned-lens's ``Lens.forward(h, idx)``) picks its translator from it.
"""

from typing import Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from captum_iglens.readout.scores import TokenScore


@runtime_checkable
class PathReadout(Protocol):
    r"""
    The readout of the points of a path.

    ``layer`` is a long tensor of one index per row, the hidden state the row
    is read as: ``0`` for the first block's input (and ``h_base``), ``i`` for
    the output of block ``i`` (1-based), ``L`` for the last block's output,
    read by the model's own readout. Every point of a straight segment that an
    estimator integrates along is read with one index. None reads every row as
    state ``L``.

    Attributes:

        vocab_size (int): The number of logits ``V``.
        max_chunk_bytes (int): Memory budget of one chunk of float32 logits.
    """

    @property
    def max_chunk_bytes(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def device(self) -> torch.device:
        """Where the readout computes (captured states are moved there)."""
        ...

    def rows_per_chunk(self, backward: bool = False) -> int:
        r"""Rows read at once (with ``backward``, rows a backward pass may take)."""
        ...

    def __call__(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        r"""Logits ``(..., V)`` of hidden states ``(..., d)``; ``layer`` has the
        leading shape of ``hidden``."""
        ...

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        r"""The score ``(N,)`` of rows ``hidden`` ``(N, d)``, differentiable with
        respect to ``hidden``; ``layer`` is ``(N,)``."""
        ...
