r"""Wrapped models, unwrapped for IG-Lens.

A TransformerLens 4 ``TransformerBridge`` or an nnsight ``LanguageModel``
(``TransformersModel``) wraps a Hugging Face causal LM. :func:`unwrap_model`
returns that model, after one forward shows that the wrapper's own logits equal
the model's; IG-Lens then runs on the model itself, whose logits its readout
reproduces on every call. Neither library is imported here: a wrapper is
recognised by its class's module, so the core does not depend on them (install
them with ``pip install "captum-iglens[transformer-lens]"`` or ``"[nnsight]"``).
``nn.DataParallel`` and ``DistributedDataParallel`` compute their ``.module``'s
logits by construction and are unwrapped unchecked.
"""

from typing import Any

from torch import nn

from captum_iglens.integrations import nnsight, transformer_lens

_DATA_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def unwrap_model(model: Any) -> Any:
    r"""The Hugging Face model inside a TransformerLens bridge, an nnsight model or
    a data-parallel wrapper.

    Args:
        model (Any): A ``TransformerBridge``, an nnsight ``LanguageModel`` /
                    ``TransformersModel``, an ``nn.DataParallel`` or
                    ``DistributedDataParallel``, or anything else.

    Returns:
        The wrapped model (for a bridge or an nnsight model, verified: its
        logits equal the wrapper's), or ``model`` itself if it is not such a
        wrapper.

    Raises:
        ValueError: If the wrapper's logits differ from the wrapped model's.
    """
    if isinstance(model, _DATA_PARALLEL):
        return model.module
    if transformer_lens.is_bridge(model):
        return transformer_lens.unwrap_bridge(model)
    if nnsight.is_nnsight_model(model):
        return nnsight.unwrap_nnsight(model)
    return model


__all__ = ["unwrap_model"]
