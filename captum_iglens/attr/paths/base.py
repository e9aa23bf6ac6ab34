r"""
The interface every integration path implements: how the traced states of a
granularity's path are joined into the straight segments an estimator
integrates along, and so how the credit columns are computed.
"""

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor

from captum_iglens.attr.estimators import Estimator, Integration
from captum_iglens.attr.granularities.base import PathGranularity
from captum_iglens.attr.tracing import TracedPath


class IntegrationPath(ABC):
    r"""
    How a granularity's columns are integrated between ``h_base`` and
    ``h_final``. Every path keeps the endpoints, so the credits of an exact
    estimator add up to ``f(h_final) - f(h_base)`` on any of them.

    Attributes:

        name (str): The name ``path=`` takes.
        learned_readout (bool): A learned readout per layer can split its
                    columns into block and lens-change parts (the columns are
                    the changes between consecutive path points).
    """

    name: ClassVar[str]
    learned_readout: ClassVar[bool] = False

    def map_needs_gradients(self, shape: PathGranularity, rule: Estimator) -> bool:
        r"""Whether :meth:`credits` of ``shape``'s columns with ``rule`` takes a
        backward pass (else the map runs under ``torch.inference_mode``)."""
        return shape.map_needs_gradients(rule)

    @abstractmethod
    def credits(
        self,
        shape: PathGranularity,
        integration: Integration,
        path: TracedPath,
        values: Tensor,
    ) -> Tensor:
        r"""
        The scalar credit of every column.

        Args:

            shape (PathGranularity): The granularity, which traced ``path``.
            integration (Integration): The estimator, readout and steps.
            path (TracedPath): The traced path points ``(B, P, K, d)``.
            values (Tensor): ``(B, P, K)``: ``f`` at the path points, the last
                        the model's own.

        Returns:
            *Tensor* ``(B, P, n)``, one per column of ``shape``.
        """

    @abstractmethod
    def attributions(
        self, shape: PathGranularity, integration: Integration, path: TracedPath
    ) -> Tensor:
        r"""
        Per-dimension attributions of every column, zero at padding.

        Args:

            shape (PathGranularity): As for :meth:`credits`, and so are
                        ``integration`` and ``path``.

        Returns:
            *Tensor* ``(B, P, n, d)``.
        """
