r"""IG-Lens: exact layer-wise attribution of a token's probability, Captum-style."""

from captum_iglens.attr import (
    ESTIMATORS,
    LayerIGLens,
    attribute_text,
    competitor_maps,
)
from captum_iglens.hf.architectures import register_architecture
from captum_iglens.readout import Readout
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings
from captum_iglens.version import __version__

__all__ = [
    "ESTIMATORS",
    "IGLensResult",
    "LayerIGLens",
    "Readout",
    "Settings",
    "__version__",
    "attribute_text",
    "competitor_maps",
    "register_architecture",
]
