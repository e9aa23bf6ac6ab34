r"""TransformerLens 4: IG-Lens on a ``TransformerBridge`` and TransformerLens names.

A bridge wraps a Hugging Face model (``bridge.original_model``) and, booted
with ``TransformerBridge.boot_transformers``, computes the model's own logits.
:func:`unwrap_bridge` returns the model after checking that. The names of
IG-Lens's segments map to TransformerLens hook points: block ``l`` ends at
``blocks.{l}.hook_resid_post``, its attention at ``blocks.{l}.hook_resid_mid``.
"""

from dataclasses import replace
from typing import Any, TypeVar

from torch import nn

from captum_iglens.columns import Column
from captum_iglens.integrations._verify import check_same_logits

#: A result record with ``layer_names`` (:class:`~captum_iglens.IGLensResult`).
Result = TypeVar("Result")


def is_bridge(model: Any) -> bool:
    r"""Whether ``model`` is a TransformerLens ``TransformerBridge`` (without
    importing TransformerLens)."""
    return type(model).__module__.startswith("transformer_lens") and isinstance(
        getattr(model, "original_model", None), nn.Module
    )


def unwrap_bridge(bridge: Any) -> nn.Module:
    r"""The Hugging Face model inside a bridge, checked against the bridge's logits.

    Args:
        bridge (TransformerBridge): A bridge around a Hugging Face causal LM.

    Returns:
        *nn.Module*: ``bridge.original_model``.

    Raises:
        ValueError: If the bridge's logits differ from the model's (e.g. after
            ``enable_compatibility_mode()``, which folds the norms).
    """
    model = bridge.original_model
    check_same_logits("TransformerBridge", bridge, model)
    return model


def hook_name(segment: str) -> str:
    r"""The TransformerLens hook point at the end of an IG-Lens segment.

    Args:
        segment (str): A segment name of :class:`LayerIGLens` built with
                    ``from_model``: ``"l"`` (block ``l``), ``"l.attn"`` or
                    ``"l.mlp"`` (its two halves at ``granularity="sublayer"``).

    Returns:
        *str*: ``"blocks.{l}.hook_resid_post"``, or ``"blocks.{l}.hook_resid_mid"``
        for ``"l.attn"``.
    """
    column = Column.parse(segment) if isinstance(segment, str) else None
    if (
        column is None
        or column.kind not in ("block", "sublayer")
        or not str(column.block).isdigit()
    ):
        raise ValueError(
            f"segment: expected 'l', 'l.attn' or 'l.mlp' with a block index l, got "
            f"{segment!r}"
        )
    point = "mid" if column.part == "attn" else "post"
    return f"blocks.{column.block}.hook_resid_{point}"


def with_hook_names(result: Result) -> Result:
    r"""A result whose layer names are TransformerLens hook names.

    Args:
        result (IGLensResult): From a lens built with ``from_model``.

    Returns:
        *IGLensResult*: a copy sharing the tensors, with ``layer_names`` such as
        ``["blocks.0.hook_resid_post", ...]`` (sub-layer segments:
        ``hook_resid_mid`` for attention, ``hook_resid_post`` for the MLP).
    """
    named: Any = result  # a dataclass with layer_names (not imported: layering)
    return replace(named, layer_names=[hook_name(n) for n in named.layer_names])
