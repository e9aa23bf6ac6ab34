r"""The ``"telescoping"`` path: the straight segments between consecutive path
points, ``h_base → h_{L_1} → ... → h_{L_k}``, one integral per segment."""

from torch import Tensor

from captum_iglens.attr.estimators import Integration
from captum_iglens.attr.granularities.base import PathGranularity
from captum_iglens.attr.paths.base import IntegrationPath
from captum_iglens.attr.tracing import TracedPath


class Telescoping(IntegrationPath):
    r"""
    Each column is integrated along its own stretch of the path (or split out
    of it, for granularities whose columns are components of a segment), so a
    block's credit with an exact estimator is ``f(h_{L_j}) - f(h_{L_{j-1}})``:
    the change in what the readout makes of the stream across the block.
    """

    name = "telescoping"
    learned_readout = True

    def credits(
        self,
        shape: PathGranularity,
        integration: Integration,
        path: TracedPath,
        values: Tensor,
    ) -> Tensor:
        return shape.credits(integration, path, values)

    def attributions(
        self, shape: PathGranularity, integration: Integration, path: TracedPath
    ) -> Tensor:
        return shape.attributions(integration, path)
