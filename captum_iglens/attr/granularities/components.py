r"""
The granularities whose columns are components of the stream's straight segments
(heads, source tokens, neurons, experts): what they share. Each segment's update
is a sum of components traced with the path; every column's attributions, credits
and segment attributions come from one gradient split of the segments,
``ComponentSplit._split``, which each granularity implements.
"""

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from captum_iglens.attr.estimators import Estimator
from captum_iglens.attr.granularities.blocks import Sublayers
from captum_iglens.attr.tracing import TracedPath, path_levels
from captum_iglens.readout.interface import PathReadout


class ComponentSplit(Sublayers):
    r"""A granularity whose columns split segments into traced components."""

    learned_readout = True
    supports_unmultiplied = False

    def column_blocks(self) -> Optional[List[int]]:
        return None  # components of a segment, not segments

    def map_needs_gradients(self, rule: Estimator) -> bool:
        return True  # the segments are split by gradients

    def attributions(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        multiply_by_inputs: bool = True,
    ) -> Tensor:
        self.check_multiply_by_inputs(multiply_by_inputs)
        with torch.no_grad():
            values = path_levels(readout, path, chunk_rows)[0]
        return self._columns(
            rule, readout, path, values, n_steps, chunk_rows, grad_kwargs, True
        )

    def credits(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
    ) -> Tensor:
        with torch.no_grad():  # the split takes its own gradients
            return self._columns(rule, readout, path, values, n_steps, chunk_rows)

    def segment_attributions(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
    ) -> Tensor:
        return self._columns(
            rule, readout, path, values, n_steps, chunk_rows, grad_kwargs, True
        )

    def _columns(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        grad_kwargs: Optional[Dict[str, Any]] = None,
        per_dimension: bool = False,
    ) -> Tensor:
        """The columns ``(B, P, n)``, or ``(B, P, n, d)`` per dimension, zero at
        padding."""
        b, p = path.targets.shape
        attrs = self._split(
            rule,
            readout,
            path,
            values.flatten(0, 1),
            n_steps,
            chunk_rows,
            per_dimension,
            grad_kwargs,
        )
        mask = path.mask.view(b, p, *[1] * (attrs.dim() - 1))
        return attrs.view(b, p, *attrs.shape[1:]) * mask

    def _split(
        self,
        rule: Estimator,
        readout: PathReadout,
        path: TracedPath,
        values: Tensor,
        n_steps: int,
        chunk_rows: int,
        per_dimension: bool,
        grad_kwargs: Optional[Dict[str, Any]],
    ) -> Tensor:
        r"""
        The columns of the ``N = B·P`` flattened paths of ``path``, from its
        traced components and the levels ``values`` ``(N, K)``.

        Returns:
            *Tensor* ``(N, n)``, or ``(N, n, d)`` with ``per_dimension``.
        """
        raise NotImplementedError
