r"""nnsight: IG-Lens on a ``LanguageModel`` (or ``TransformersModel``).

An nnsight model is an ``Envoy`` around a Hugging Face model (its ``_module``).
:func:`unwrap_nnsight` returns that model after checking, on one traced
forward, that the wrapper's logits are the model's.
"""

from typing import Any

from torch import nn, Tensor

from captum_iglens.integrations._verify import check_same_logits


def is_nnsight_model(model: Any) -> bool:
    r"""Whether ``model`` is an nnsight model wrapping a module (without importing
    nnsight)."""
    return type(model).__module__.startswith("nnsight") and isinstance(
        getattr(model, "_module", None), nn.Module
    )


def unwrap_nnsight(model: Any) -> nn.Module:
    r"""The Hugging Face model inside an nnsight model, checked against its logits.

    Args:
        model (LanguageModel): An nnsight model of a local Hugging Face causal LM
                    (its weights loaded, not a meta-device model of a remote one).

    Returns:
        *nn.Module*: the wrapped model.

    Raises:
        ValueError: If the traced logits differ from the model's.
    """
    inner = model._module

    def traced_logits(ids: Tensor) -> Tensor:
        with model.trace(ids):
            logits = model.output.logits.save()
        return logits

    check_same_logits(type(model).__name__, traced_logits, inner)
    return inner
