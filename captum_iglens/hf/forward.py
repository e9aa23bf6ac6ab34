r"""The one way this package runs a Hugging Face causal LM: position ids counted
from each sequence's first real token (as ``generate`` counts them), no cache, and
logits kept only where they are needed."""

import inspect
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Union

from torch import Tensor, nn


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    r"""Position ids counted from each sequence's first real token, as ``generate``
    counts them, so that a left-padded sequence is read as if it were alone.

    Args:
        attention_mask (Tensor): ``(B, T)``, ones at real tokens.

    Returns:
        **position_ids** (Tensor): ``(B, T)`` long; 0 at the padding.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def causal_lm_logits(
    model: nn.Module,
    *,
    input_ids: Optional[Tensor] = None,
    inputs_embeds: Optional[Tensor] = None,
    attention_mask: Optional[Tensor] = None,
    logits_to_keep: Optional[Union[int, Tensor]] = None,
) -> Tensor:
    r"""
    The logits of a causal LM, with position ids from the mask.

    Args:

        model (PreTrainedModel): The causal LM.
        input_ids (Tensor, optional): ``(B, T)`` token ids.
        inputs_embeds (Tensor, optional): ``(B, T, d)`` instead of ids.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at (left) padding.
                    Default: None (no padding).
        logits_to_keep (int or Tensor, optional): As in transformers: a tensor
                    of position indices keeps the logits at those only.
                    Default: None (every position).

    Returns:
        *Tensor*: logits ``(B, T', V)`` in the model's dtype.
    """
    position_ids = (
        None if attention_mask is None else position_ids_from_mask(attention_mask)
    )
    inputs: Dict[str, Any] = (
        {"input_ids": input_ids}
        if inputs_embeds is None
        else {"inputs_embeds": inputs_embeds}
    )
    if logits_to_keep is not None:
        inputs["logits_to_keep"] = logits_to_keep
    return model(
        **inputs,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).logits


class CausalLMForward(nn.Module):
    r"""
    Calls a Hugging Face causal LM the way Captum calls a forward function:
    positionally, ``(input_ids, attention_mask=None)`` (token ids, or float
    embeddings ``(B, T, d)`` as the model's ``inputs_embeds``), returning logits
    ``(B, T, V)`` (see :func:`causal_lm_logits`), so a left-padded sequence gets
    the same logits as the same sequence alone. Inside :meth:`keeping` it
    returns the logits of some positions only, ``(B, P, V)``: a map asks for the
    attributed ones where all of them would not fit in one readout chunk (at
    ``T = 16,384`` and a 128k vocabulary they are 8 GiB in float32).

    Args:

        model (transformers.PreTrainedModel): The causal LM.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.kept: Optional[Tensor] = None

    @contextmanager
    def keeping(self, positions: Tensor) -> Iterator[bool]:
        r"""
        Within this context the forward returns the logits at ``positions``
        only, ``(B, P, V)``, through transformers' ``logits_to_keep``; a model
        whose ``forward`` does not take it returns them all, as outside.

        Args:

            positions (Tensor): ``(P,)`` long, the positions to keep.

        Yields:
            *bool*: whether the logits are kept at ``positions`` only.
        """
        takes = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.kept = positions if takes else None
        try:
            yield takes
        finally:
            self.kept = None

    def forward(
        self, input_ids: Tensor, attention_mask: Optional[Tensor] = None
    ) -> Tensor:
        r"""The logits of token ids ``(B, T)``, or of embeddings ``(B, T, d)``
        (float, passed as the model's ``inputs_embeds``)."""
        embeds = input_ids.is_floating_point() and input_ids.dim() == 3
        return causal_lm_logits(
            self.model,
            input_ids=None if embeds else input_ids,
            inputs_embeds=input_ids if embeds else None,
            attention_mask=attention_mask,
            logits_to_keep=self.kept,
        )
