r"""IG-Lens: exact layer-wise attribution of a token's probability, Captum-style."""

from captum_iglens._utils.estimators import METHODS
from captum_iglens.layer_ig_lens import LayerIGLens
from captum_iglens.readout import Readout
from captum_iglens.result import IGLensResult

__version__ = "0.1.0"

__all__ = ["IGLensResult", "LayerIGLens", "METHODS", "Readout", "__version__"]
