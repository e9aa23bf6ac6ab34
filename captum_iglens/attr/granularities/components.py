r"""
The granularities whose columns are components of the stream's straight segments
(heads, source tokens, neurons, experts): what they share. Each segment's update
is a sum of components traced with the path; every column's attributions and
credits come from one gradient split of the segments,
``ComponentSplit._split``, which each granularity implements with the path's
``split_segments`` (:class:`~captum_iglens.attr.paths.IntegrationPath`).
"""

import warnings
from dataclasses import replace
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.attr._utils.float32 import float32_copy
from captum_iglens.attr.estimators import Estimator, Integration
from captum_iglens.attr.granularities.blocks import Sublayers
from captum_iglens.attr.tracing import TracedPath, path_levels


class ComponentSplit(Sublayers):
    r"""A granularity whose columns split segments into traced components."""

    learned_readout = True
    supports_unmultiplied = False

    def column_blocks(self) -> Optional[List[int]]:
        return None  # components of a segment, not segments

    def map_needs_gradients(self, rule: Estimator) -> bool:
        return True  # the segments are split by gradients

    def attributions(self, integration: Integration, path: TracedPath) -> Tensor:
        self.check_multiply_by_inputs(integration.multiply_by_inputs)
        with torch.no_grad():
            values = path_levels(integration.readout, path, integration.chunk_rows)[0]
        per_dimension = replace(integration, per_dimension=True)
        return self.component_columns(per_dimension, path, values)

    def credits(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        with torch.no_grad():  # the split takes its own gradients
            scalar = replace(integration, per_dimension=False)
            columns = self.component_columns(scalar, path, values)
        if columns.dim() == 4:  # (B, P, n, 2) pairs: see Joint.split_segments
            columns, errors = columns.unbind(-1)
            assert integration.errors is not None  # pairs only where collected
            integration.errors.append(errors)
        return columns

    def component_columns(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        b, p = path.targets.shape
        integration, path = self._float32_on_cpu(integration, path)
        attrs = self._split(integration, path, values.flatten(0, 1))
        mask = path.mask.view(b, p, *[1] * (attrs.dim() - 1))
        return attrs.view(b, p, *attrs.shape[1:]) * mask

    def _float32_on_cpu(
        self, integration: Integration, path: TracedPath
    ) -> Tuple[Integration, TracedPath]:
        """The split of a half-precision model on the CPU reads through a
        float32 copy of the readout (its unembedding upcast a slice at a time,
        :func:`~captum_iglens.attr._utils.float32.float32_copy`), along float32
        path points: its gradients
        through a float16 or bfloat16 head are tens of times slower there than
        in float32 (the levels and ``p_model`` are read as before). A readout
        that cannot be copied is warned of, in one line, and read as it is."""
        half = path.points.dtype in (torch.float16, torch.bfloat16)
        if not half or path.points.device.type != "cpu":
            return integration, path
        try:
            readout = float32_copy(integration.readout)
        except Exception as error:  # any object may be a readout
            warnings.warn(
                f"granularity {self.name!r}: the {path.points.dtype} readout "
                f"could not be copied to float32 ({type(error).__name__}), so "
                "this split runs in half precision on the CPU, tens of times "
                "slower; load the model in float32 or run it on a GPU",
                stacklevel=2,
            )
            return integration, path
        return integration.reading(readout), replace(path, points=path.points.float())

    def _split(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        r"""
        The columns of the ``N = B·P`` flattened paths of ``path``, from its
        traced components and the levels ``values`` ``(N, K)`` (or ``f`` at both
        ends of every segment, ``(N, K - 1, 2)``).

        Returns:
            *Tensor* ``(N, n)``, or ``(N, n, d)`` with ``per_dimension``.
        """
        raise NotImplementedError
