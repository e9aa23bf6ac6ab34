r"""
The hidden states the fit needs, recorded by owned hooks while the model runs:
``h_0`` (the first block's input, after any embedding scaling) and the output of
every block, at every position but the first (the BOS or first token, whose
states are unlike the others'; Din et al. and tuned-lens leave it out too).

:class:`StateRecorder` hands each forward's states, ``(L + 1, N, d)`` float32,
to a callback, once per forward: once for a whole sequence, and once per token
during cached generation, so states sampled by the model are recorded while it
samples them, without a second pass.
"""

from typing import Any, Callable, List, Optional

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle

from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.hf.parts import ModelParts

#: What receives the states of one forward: ``(L + 1, B, T, d)`` float32 and the
#: ``(B, T)`` bool mask of the rows to keep.
StatesSink = Callable[[Tensor, Tensor], None]


class StopForward(Exception):
    r"""Raised by :class:`StateRecorder` with ``stop=True`` after the last block,
    so a forward that only feeds the fit skips the final norm and head."""


class StateRecorder:
    r"""
    Hooks on the model's blocks that record ``h_0 … h_L`` of every forward.

    Used as a context manager: exactly the hooks it registered are removed on
    exit. Rows are the positions ``t >= 1`` of each forward whose ``attention_mask``
    (``set_mask``) is 1, or all positions ``t >= 1`` without a mask. The offset
    of a forward's first position grows by each forward's length, so in cached
    generation only the prompt's first position is left out.

    Args:

        parts (ModelParts): The model's parts.
        sink (Callable[[Tensor, Tensor], None]): Receives, per forward, the
                    states ``(L + 1, B, T, d)`` float32 on the CPU and the
                    ``(B, T)`` bool mask of the rows kept.
        stop (bool, optional): Raise :class:`StopForward` after the last block
                    (the caller catches it). Default: False
    """

    def __init__(self, parts: ModelParts, sink: StatesSink, stop: bool = False) -> None:
        self.blocks: List[Module] = list(parts.blocks)
        self.sink, self.stop = sink, stop
        self.mask: Optional[Tensor] = None
        self.offset = 0
        self._states: List[Tensor] = []
        self._handles: List[RemovableHandle] = []

    def set_mask(self, mask: Optional[Tensor], offset: int = 0) -> None:
        r"""The ``(B, T)`` mask of the next forwards' real tokens (None: all), and
        the position of their first token in its sequence (``offset``)."""
        self.mask, self.offset = mask, offset

    def __enter__(self) -> "StateRecorder":
        first, last = self.blocks[0], len(self.blocks) - 1
        self._handles.append(
            first.register_forward_pre_hook(self._record_input, with_kwargs=True)
        )
        for index, block in enumerate(self.blocks):
            self._handles.append(
                block.register_forward_hook(self._output(index == last))
            )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _record_input(self, module: Module, args: Any, kwargs: Any) -> None:
        self._states = [hidden_of(None, args, kwargs).detach()]

    def _output(self, last: bool) -> Callable[..., None]:
        def hook(module: Module, args: Any, output: Any) -> None:
            self._states.append(hidden_of(output).detach())
            if last:
                self._flush()
                if self.stop:
                    raise StopForward

        return hook

    def _flush(self) -> None:
        states = torch.stack([s.float().cpu() for s in self._states])  # (L+1,B,T,d)
        self._states = []
        length = states.shape[2]
        keep = torch.ones(states.shape[1], length, dtype=torch.bool)
        if self.mask is not None:
            keep &= self.mask[:, -length:].bool().cpu()
        if self.offset == 0:
            keep[:, 0] = False
            if self.mask is not None:  # left padding: the first real token
                first = self.mask.long().cpu().argmax(-1)
                keep[torch.arange(len(first)), first] = False
        self.offset += length
        self.sink(states, keep)


def record_forward(model: Module, recorder: StateRecorder, **inputs: Any) -> None:
    r"""
    One forward of ``model`` on ``inputs`` whose states go to ``recorder``, which
    must be entered with ``stop=True``: the forward ends after the last block.

    Args:

        model (Module): The causal LM.
        recorder (StateRecorder): Entered, with ``stop=True``.
        **inputs: ``input_ids`` and ``attention_mask``.
    """
    recorder.set_mask(inputs.get("attention_mask"))
    try:
        with torch.inference_mode():
            model(**inputs, use_cache=False)
    except StopForward:
        return
    raise RuntimeError("the model's last block did not run")
