r"""The Captum-facing attribution classes and the text entry point."""

from captum_iglens.attr.estimators import ESTIMATORS
from captum_iglens.attr.competitors import competitor_maps
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.attr.llm_attr import LLMLayerAttribution
from captum_iglens.attr.text import attribute_text

__all__ = [
    "ESTIMATORS",
    "LLMLayerAttribution",
    "LayerIGLens",
    "attribute_text",
    "competitor_maps",
]
