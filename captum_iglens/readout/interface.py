r"""What the path integrals need of a readout: the interface every readout of
IG-Lens implements.

A readout maps hidden states to logits. It carries the index of the path point
it reads (``layer``): the model's own :class:`~captum_iglens.readout.Readout`
reads every point the same way and ignores it, while a per-layer readout ``f_l``
(tuned-lens's ``Lens.forward(h, idx)``) picks its translator from it.
"""

from typing import Optional, Protocol, runtime_checkable

from torch import Tensor

from captum_iglens.readout.scores import TokenScore


@runtime_checkable
class PathReadout(Protocol):
    r"""
    The readout of the points of a path.

    ``layer`` is a long tensor of one index per row, the path point the row is
    read as: ``0`` for ``h_base`` and ``j`` for ``h_{L_j}``; the interpolation
    points of segment ``j`` (from ``h_{L_{j-1}}`` to ``h_{L_j}``) are read as
    point ``j``. None reads every row as the last point.

    Attributes:

        vocab_size (int): The number of logits ``V``.
        max_chunk_bytes (int): Memory budget of one chunk of float32 logits.
    """

    max_chunk_bytes: int

    @property
    def vocab_size(self) -> int: ...

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
