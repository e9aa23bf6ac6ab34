r"""
What the causal studies' forwards share: forward hooks registered for one call,
a block's output with its hidden state replaced, and the model's probability of
the targets.
"""

from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator

from torch import Tensor
from torch.nn import Module

from captum_iglens.hf.forward import causal_lm_logits


def target_probabilities(
    model: Module, ids: Tensor, mask: Tensor, positions: Tensor, targets: Tensor
) -> Tensor:
    """``(B, P)``: the model's probability of ``targets`` at ``positions``."""
    logits = causal_lm_logits(
        model, input_ids=ids, attention_mask=mask, logits_to_keep=positions
    )
    return logits.float().softmax(-1).gather(-1, targets[..., None])[..., 0]


def replace_output(output: Any, hidden: Tensor) -> Any:
    """A block's ``output`` with its hidden state replaced by ``hidden``."""
    return hidden if isinstance(output, Tensor) else (hidden, *output[1:])


@contextmanager
def hooked(hooks: Dict[Module, Callable[..., Any]]) -> Iterator[None]:
    """Forward hooks (with kwargs) owned here: registered on entry, removed on exit."""
    handles = []
    try:
        for module, hook in hooks.items():
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
