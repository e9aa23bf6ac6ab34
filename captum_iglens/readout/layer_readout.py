r"""A learned readout per layer: ``f_i(h) = softmax(R(T_i(h)))``.

:class:`LayerReadout` is a :class:`~captum_iglens.readout.interface.LayerwiseReadout`
whose ``layer`` is the hidden-state index of each row (``0`` the first block's
input, ``i`` the output of block ``i``, 1-based, ``L`` the last block's output,
read by the model's own readout ``R``). Its two kinds, ``"linear"`` and
``"tuned"``, hold :class:`~captum_iglens.readout.translators.Translators` (the
maths is the same; the kind records where they came from); the logit lens is
the plain :class:`~captum_iglens.readout.readout.Readout`, and any other
:class:`~captum_iglens.readout.interface.LayerwiseReadout` is taken as it is.
"""

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import nn, Tensor

from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.readout import Readout
from captum_iglens.readout.scores import TokenScore
from captum_iglens.readout.translators import (
    TUNED_LENS_TYPE,
    Translators,
    unembedding_hash,
)

#: The kinds of :class:`LayerReadout`, by where its translators came from.
TRANSLATOR_KINDS = ("linear", "tuned")


class LayerReadout(nn.Module):
    r"""
    The model's readout behind one affine translator per hidden state.

    ``f_i(h) = score(softmax(R(h + W_i h + b_i)))`` for state ``i < L``, and
    ``R`` alone for ``i = L`` (and for rows read without a ``layer``), so the
    last block's output keeps the model's own probability.

    Args:

        readout (Readout): The model's own readout ``R``.
        translators (Translators): ``L`` translators, checked against the model
                    (hidden size, number of blocks, unembedding) here, before
                    any forward.
        blocks (list[nn.Module]): The model's ``L`` decoder blocks in order,
                    which give each block on a path its hidden-state index
                    (not registered as submodules).
        kind (str, optional): ``"tuned"`` or ``"linear"``. Default: None,
                    ``"tuned"`` for translators of the tuned-lens type
                    (``lens_type="linear_tuned_lens"``), else ``"linear"``.

    Examples::

        >>> parts = model_parts(model)
        >>> readout = LayerReadout.from_folder(
        ...     "lens/", parts.readout(), parts.blocks)
        >>> ig_lens = LayerIGLens.from_model(model, lens=readout)
    """

    def __init__(
        self,
        readout: Readout,
        translators: Translators,
        blocks: Sequence[nn.Module],
        kind: Optional[str] = None,
    ) -> None:
        super().__init__()
        if not isinstance(readout, Readout):
            raise TypeError(
                f"readout: expected a captum_iglens.Readout, got "
                f"{type(readout).__name__}"
            )
        if not isinstance(translators, Translators):
            raise TypeError(
                f"translators: expected Translators, got {type(translators).__name__}"
            )
        if kind is None:
            kind = "tuned" if translators.lens_type == TUNED_LENS_TYPE else "linear"
        if kind not in TRANSLATOR_KINDS:
            raise ValueError(f"kind: expected 'linear' or 'tuned', got {kind!r}")
        blocks = list(blocks)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise TypeError("blocks: expected the model's decoder blocks (modules)")
        translators.check_model(
            _hidden_size(readout, translators.d_model),
            len(blocks),
            unembedding_hash(readout.head),
            _head_dtype(readout),
        )
        self.base = readout
        self.translators = translators
        self.kind = kind
        self._blocks: List[nn.Module] = blocks

    @classmethod
    def from_folder(
        cls,
        folder: Union[str, Path],
        readout: Readout,
        blocks: Sequence[nn.Module],
        kind: Optional[str] = None,
    ) -> "LayerReadout":
        r"""The readout of a tuned-lens folder (see :meth:`Translators.load`)."""
        return cls(readout, Translators.load(folder), blocks, kind)

    @property
    def max_chunk_bytes(self) -> int:
        """The model readout's memory budget."""
        return self.base.max_chunk_bytes

    @property
    def device(self) -> torch.device:
        """The model readout's device."""
        return self.base.device

    @property
    def vocab_size(self) -> int:
        """The number of logits ``V``."""
        return self.base.vocab_size

    @property
    def n_layers(self) -> int:
        """``L``: the model's number of blocks (state ``L`` is the last output)."""
        return len(self._blocks)

    def rows_per_chunk(self, backward: bool = False) -> int:
        """As :meth:`Readout.rows_per_chunk`."""
        return self.base.rows_per_chunk(backward)

    def state_index(self, block: nn.Module) -> int:
        r"""
        The hidden-state index of ``block``'s output: its 0-based position
        among the model's blocks plus one.

        Raises:
            ValueError: If ``block`` is not one of the model's blocks.
        """
        for i, candidate in enumerate(self._blocks):
            if candidate is block:
                return i + 1
        raise ValueError(
            "layer: a block on the path is not one of the blocks the learned "
            "readout was built for"
        )

    def same(self, i: int, j: int) -> bool:
        """Whether states ``i`` and ``j`` are read alike (equal translators)."""
        return self.translators.same(i, j)

    def forward(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        r"""
        Logits ``R(T_i(h))`` of hidden states ``(..., d)``.

        Args:

            hidden (Tensor): ``(..., d)``.
            layer (Tensor, optional): The hidden-state index of each row, of the
                        leading shape of ``hidden``. Default: None (state ``L``:
                        the model's own readout)

        Returns:
            *Tensor* ``(..., V)`` in the model's dtype.
        """
        if layer is None:
            return self.base(hidden)
        shape = hidden.shape
        flat = self.translators(hidden.reshape(-1, shape[-1]), layer.reshape(-1))
        return self.base(flat.reshape(shape))

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        r"""The score ``(N,)`` of rows ``hidden`` ``(N, d)`` under their states'
        readouts (``layer`` ``(N,)``), differentiable with respect to
        ``hidden``; see :meth:`Readout.score`."""
        if layer is not None:
            hidden = self.translators(hidden, layer)
        return self.base.score(hidden, score)

    def checksum(self) -> str:
        """The translators' checksum, recorded in results."""
        return self.translators.checksum()

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, n_layers={self.n_layers}"


#: What ``lens=`` takes: None or ``"logit"`` (the model's readout), a
#: tuned-lens folder, :class:`Translators`, or a readout of any kind.
LensType = Union[None, str, Path, Translators, LayerwiseReadout]


def resolve_readout(
    readout: Readout, lens: LensType, blocks: Sequence[nn.Module]
) -> LayerwiseReadout:
    r"""
    The readout of every layer that ``lens`` names, resolved once per entry
    point.

    Args:

        readout (Readout): The model's own readout.
        lens (str, Path, Translators or LayerwiseReadout, optional): None or
                    ``"logit"`` for ``readout`` itself; a tuned-lens folder or
                    :class:`Translators` for a learned readout per layer
                    (refused, before any forward, if made for another model);
                    a :class:`~captum_iglens.readout.interface.LayerwiseReadout`
                    is the readout itself, of its own kind.
        blocks (list[nn.Module]): The model's decoder blocks.

    Returns:
        ``readout``, a :class:`LayerReadout` around it, or ``lens``. The
        caller's translators stay where they are: the readout casts them to
        the states' device and dtype, once per parameter version.

    Raises:
        ValueError: For ``"linear"``, which names the cached fit on the command
            line only.
        TypeError: If ``lens`` is none of these (a ``LayerIGLens`` goes to
            ``attribute_text(attribution=...)``, not ``lens=``).
    """
    if not isinstance(lens, (type(None), str, Path, Translators, LayerwiseReadout)):
        raise TypeError(
            "lens: expected None, 'logit', a tuned-lens folder, Translators or a "
            f"LayerwiseReadout, got {type(lens).__name__}; a ready LayerIGLens is "
            "passed as attribution="
        )
    if lens == "linear":
        raise ValueError(
            "lens: 'linear' names the cached fit on the command line; in Python "
            "pass its folder, captum_iglens.lens_fit.cached_lens(model_parts("
            "model), tokenizer), which fits and caches it when there is none"
        )
    if lens is None or lens == "logit":
        return readout
    if isinstance(lens, LayerwiseReadout):
        return lens
    translators = lens if isinstance(lens, Translators) else Translators.load(lens)
    return LayerReadout(readout, translators, blocks)


def readout_record(readout: Optional[LayerwiseReadout]) -> Dict[str, Optional[str]]:
    r"""
    The one record of a readout that results, run files and studies keep.

    Args:

        readout (LayerwiseReadout, optional): The readout; None for the logit
                    readout.

    Returns:
        *dict*: ``{"kind": ..., "checksum": ...}``, the readout's kind and
        :meth:`~captum_iglens.readout.interface.LayerwiseReadout.checksum`
        (``"logit"`` and None for the logit readout).
    """
    if readout is None:
        return {"kind": Readout.kind, "checksum": None}
    return {"kind": readout.kind, "checksum": readout.checksum()}


def _head_dtype(readout: Readout) -> Optional[torch.dtype]:
    """The dtype of the unembedding's weight (None without one)."""
    weight = getattr(readout.head, "weight", None)
    return weight.dtype if isinstance(weight, Tensor) else None


def hidden_width(readout: LayerwiseReadout) -> Optional[int]:
    r"""The hidden size ``d`` that ``readout`` reads, where its base is the
    model's :class:`~captum_iglens.readout.readout.Readout` and says it (the
    final norm's weight, or the head's where there is no norm); else None."""
    base = readout.base
    if not isinstance(base, Readout):
        return None
    return _hidden_size(base, 0) or None


def _hidden_size(readout: Readout, fallback: int) -> int:
    """The hidden size the readout takes: the norm's weight length, else the
    head's input size (``fallback`` when neither says)."""
    norm = readout.norm
    weight = getattr(norm, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 1:
        return weight.shape[0]
    head_weight = getattr(readout.head, "weight", None)
    if readout.norm is None and isinstance(head_weight, Tensor):
        return head_weight.shape[-1]
    return fallback
