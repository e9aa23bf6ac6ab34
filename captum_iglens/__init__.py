r"""IG-Lens: exact layer-wise attribution of a token's probability, Captum-style."""

from captum_iglens.attr import (
    ESTIMATORS,
    LayerIGLens,
    LLMLayerAttribution,
    attribute_text,
    competitor_maps,
)
from captum_iglens.hf.architectures import register_architecture
from captum_iglens.hf.models import load_default
from captum_iglens.readout import Readout
from captum_iglens.readout.translators import Translators
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings
from captum_iglens.version import __version__

__all__ = [
    "ESTIMATORS",
    "IGLensResult",
    "LLMLayerAttribution",
    "LayerIGLens",
    "Readout",
    "Settings",
    "Translators",
    "__version__",
    "attribute_text",
    "competitor_maps",
    "load_default",
    "register_architecture",
]
