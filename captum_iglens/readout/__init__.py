r"""The model's own map from a last-block state to its logits, and its transforms."""

from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.readout import Readout, target_log_prob
from captum_iglens.readout.transforms import LogitDivide, LogitScale, Softcap

__all__ = [
    "LogitDivide",
    "LogitScale",
    "PathReadout",
    "Readout",
    "Softcap",
    "target_log_prob",
]
