r"""What the path integrals need of a readout: the interface every readout of
IG-Lens implements.

A readout maps hidden states to logits. It carries the index of the path point
it reads (``layer``): the model's own :class:`~captum_iglens.readout.Readout`
reads every point the same way and ignores it, while a per-layer readout ``f_l``
(tuned-lens's ``Lens.forward(h, idx)``) picks its translator from it.
:class:`PathReadout` is what the estimators read through;
:class:`LayerwiseReadout` adds what a lens needs to place the readouts of a
path's states, and is what every readout of IG-Lens implements.
"""

from typing import Optional, Protocol, runtime_checkable

import torch
from torch import nn, Tensor

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


@runtime_checkable
class LayerwiseReadout(PathReadout, Protocol):
    r"""
    A readout of every hidden state of the model, ``f_0 .. f_L``: what
    :class:`~captum_iglens.attr.layer_ig_lens.LayerIGLens` takes as its
    ``readout`` (and :meth:`~captum_iglens.attr.layer_ig_lens.LayerIGLens.from_model`
    as its ``lens``). Where the readouts along a path differ, each block's
    credit splits into a block part and a lens-change part
    (:mod:`captum_iglens.attr.lens_change`).

    The model's own :class:`~captum_iglens.readout.Readout` is the identity
    case: kind ``"logit"``, every state read alike. A readout of a new kind is
    one object with these members, recorded in results by its ``kind`` and
    :meth:`checksum`.

    Attributes:

        kind (str): The readout's name in results (``"logit"``, ``"tuned"``,
                    ``"linear"``, or a new one); any kind but ``"logit"``
                    records its lens-change parts and its checksum.
        base (PathReadout): The model's own readout ``R``, which reads state
                    ``n_layers`` (so the path's last point reads the model's
                    probability); the readout itself for ``"logit"``.
        n_layers (int): ``L``, the index of the last block's output, the state
                    ``base`` reads; 0 for a readout that reads every state
                    alike (it numbers them all 0).
    """

    @property
    def kind(self) -> str: ...

    @property
    def base(self) -> PathReadout: ...

    @property
    def n_layers(self) -> int: ...

    def checksum(self) -> Optional[str]:
        r"""What identifies the readout's parameters in results (a string for
        every kind but ``"logit"``, which records None)."""
        ...

    def state_index(self, block: nn.Module) -> int:
        r"""
        The hidden-state index of ``block``'s output (``i`` for the model's
        block ``i``, 1-based).

        Raises:
            ValueError: If ``block`` is not one of the blocks the readout reads,
                naming ``layer``.
        """
        ...

    def same(self, i: int, j: int) -> bool:
        r"""Whether states ``i`` and ``j`` are read by one readout (then a
        block between them has a lens-change part of exactly 0)."""
        ...
