r"""IG-Lens: exact layer-wise attribution of a token's probability, Captum-style.

The public names are imported on first use, so that ``import captum_iglens`` (and
the command line's ``--version``, ``--help`` and usage errors) does not pay for
torch and transformers.
"""

from typing import TYPE_CHECKING, Dict

from captum_iglens._utils.lazy import lazy_exports
from captum_iglens.version import __version__

if TYPE_CHECKING:
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

#: The module each public name is imported from, on first use.
_HOMES: Dict[str, str] = {
    "ESTIMATORS": "captum_iglens.attr",
    "LayerIGLens": "captum_iglens.attr",
    "LLMLayerAttribution": "captum_iglens.attr",
    "attribute_text": "captum_iglens.attr",
    "competitor_maps": "captum_iglens.attr",
    "register_architecture": "captum_iglens.hf.architectures",
    "load_default": "captum_iglens.hf.models",
    "Readout": "captum_iglens.readout",
    "Translators": "captum_iglens.readout.translators",
    "IGLensResult": "captum_iglens.result",
    "Settings": "captum_iglens.settings",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
