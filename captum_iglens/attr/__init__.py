r"""The Captum-facing attribution classes and the text entry point."""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.attr.estimators import ESTIMATORS
    from captum_iglens.attr.competitors import competitor_maps
    from captum_iglens.attr.layer_ig_lens import LayerIGLens
    from captum_iglens.attr.llm_attr import LLMLayerAttribution
    from captum_iglens.attr.text import attribute_text

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ESTIMATORS": "captum_iglens.attr.estimators",
        "competitor_maps": "captum_iglens.attr.competitors",
        "LayerIGLens": "captum_iglens.attr.layer_ig_lens",
        "LLMLayerAttribution": "captum_iglens.attr.llm_attr",
        "attribute_text": "captum_iglens.attr.text",
    },
)

__all__ = [
    "ESTIMATORS",
    "LLMLayerAttribution",
    "LayerIGLens",
    "attribute_text",
    "competitor_maps",
]
