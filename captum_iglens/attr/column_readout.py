r"""
How the credit columns of a path are read, one object per call of
:class:`~captum_iglens.attr.layer_ig_lens.LayerIGLens`: by one readout at every
point (:class:`OneReadout`: the logit readout, or a readout per layer that
reads every state of the path alike, e.g. identity translators), or by a
readout per layer whose columns then split into a block part and a
lens-change part (:class:`LensChange`, :mod:`captum_iglens.attr.lens_change`).
The logit readout is the identity case of the readout per layer
(:class:`~captum_iglens.readout.interface.LayerwiseReadout`): both give the
map, the attributions and the convergence delta through the same three
methods, and record the readout in the same shape (:func:`readout_record`).
"""

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.path_math import path_values, work_dtype
from captum_iglens.attr.estimators import Integration, estimator
from captum_iglens.attr.granularities import PathGranularity, check_learned_readout
from captum_iglens.attr.paths import IntegrationPath
from captum_iglens.attr.lens_change import (
    ReadoutPlan,
    ReadoutSplit,
    one_readout,
    plan,
    split_attributions,
    split_components,
    split_map,
)
from captum_iglens.attr.tracing import TracedPath, path_levels
from captum_iglens.readout.interface import LayerwiseReadout, PathReadout
from captum_iglens.readout.layer_readout import readout_record
from captum_iglens.readout.scores import Views
from captum_iglens.result import IGLensResult

#: The convergence delta of per-dimension attributions, from their sums
#: ``(B, P)``.
DeltaOf = Callable[[Tensor], Tensor]


class ColumnReadout(ABC):
    r"""
    The readout of one granularity's columns.

    Args:

        granularity (PathGranularity): The granularity.
        readout (PathReadout): What the integrations read through.
        record (dict): :func:`readout_record` of the lens's readout.
        along (IntegrationPath): How the path points are joined.
    """

    def __init__(
        self,
        granularity: PathGranularity,
        readout: PathReadout,
        record: Dict[str, Optional[str]],
        along: IntegrationPath,
    ) -> None:
        self.granularity = granularity
        self.readout = readout
        self.record = record
        self.along = along

    @abstractmethod
    def map(
        self, integration: Integration, path: TracedPath, top_k: int
    ) -> ReadoutSplit:
        r"""The scalar columns (and their levels and views) of the map."""

    @abstractmethod
    def attributions(
        self, integration: Integration, path: TracedPath
    ) -> Tuple[Tensor, DeltaOf]:
        r"""The per-dimension attributions ``(B, P, n, d)`` in the work dtype
        of the points, and the convergence delta of their sums."""

    @abstractmethod
    def delta(self, path: TracedPath, credits: Tensor, chunk_rows: int) -> Tensor:
        r"""The convergence delta of block credits ``(B, P)`` given by a caller
        (:meth:`LayerIGLens.compute_convergence_delta`)."""

    @abstractmethod
    def credits_and_delta(
        self, path: TracedPath, split: ReadoutSplit
    ) -> Tuple[Tensor, Tensor]:
        r"""The map's credits ``(B, P, n)`` and delta ``(B, P)``, float32, zero
        at padding."""

    def result(
        self, path: TracedPath, split: ReadoutSplit, method: str, n_steps: int
    ) -> IGLensResult:
        r"""The map of :meth:`map` as a result."""
        mask = path.mask
        credits, delta = self.credits_and_delta(path, split)
        levels = split.levels.float()
        # a learned readout records its lens-change parts, 0 where it is one
        # readout along the path
        zeros = torch.zeros_like(credits)
        learned = self.record["kind"] != IGLensResult.readout_kind
        lens_change = zeros if learned else None
        if split.lens is not None:
            lens_change = split.lens.float() * mask[..., None]
        return IGLensResult(
            attributions=credits,
            levels=levels[..., 1:],
            base_prob=levels[..., 0],
            model_prob=path.model_prob.float(),
            delta=delta,
            targets=path.targets,
            positions=path.positions,
            mask=mask,
            layer_names=path.names,
            method=method,
            n_steps=n_steps,
            target_sets=path.target_sets,
            foils=path.foils,
            lens_change=lens_change,
            credit_error=(
                None if split.errors is None else split.errors.float() * mask[..., None]
            ),
            readout_kind=str(self.record["kind"]),
            readout_checksum=self.record["checksum"],
            path=self.along.name,
            **({} if split.views is None else _view_fields(split.views)),
        )


class OneReadout(ColumnReadout):
    r"""Every point read by one readout: the credits are the granularity's
    own, integrated along the path, and there is no lens-change part."""

    def map(
        self, integration: Integration, path: TracedPath, top_k: int
    ) -> ReadoutSplit:
        values, views = path_levels(self.readout, path, integration.chunk_rows, top_k)
        errors: List[Tensor] = []
        credits = self.granularity.credits(
            replace(integration, errors=errors), path, values
        )
        levels = self.granularity.levels(path, values)
        views = None if views is None else column_views(self.granularity, path, views)
        # the error estimates of a map whose columns are the path's segments
        known = errors[0].view_as(credits) if len(errors) == 1 else None
        return ReadoutSplit(levels, credits, None, views, known)

    def attributions(
        self, integration: Integration, path: TracedPath
    ) -> Tuple[Tensor, DeltaOf]:
        attrs = self.granularity.attributions(integration, path)
        return attrs, lambda credits: self.delta(path, credits, integration.chunk_rows)

    def delta(self, path: TracedPath, credits: Tensor, chunk_rows: int) -> Tensor:
        """``credits - (f_model - f(h_base))``, zero at padding; ``(B,)`` when
        one output is attributed per example."""
        b, p = path.targets.shape
        base_prob = path_values(
            self.readout,
            path.points[:, :, :1].flatten(0, 1),
            path.score.flatten(),
            chunk_rows,
        )[0].view(b, p)
        gap = completeness_gap(credits, path.model_prob, base_prob, path.mask)
        gap = gap.to(work_dtype(path.points.dtype))
        return gap.sum(-1) if path.one_output else gap

    def credits_and_delta(
        self, path: TracedPath, split: ReadoutSplit
    ) -> Tuple[Tensor, Tensor]:
        credits = split.block.float() * path.mask[..., None]
        model_prob, base_prob = path.model_prob.float(), split.levels[..., 0].float()
        sums = credits.double().sum(-1)
        delta = completeness_gap(sums, model_prob, base_prob, path.mask)
        return credits, delta.float()


class LensChange(ColumnReadout):
    r"""A learned readout per layer whose translators differ along the path:
    every column is a block part plus a lens-change part.

    Args:

        route (ReadoutPlan): The readouts of the columns (or segments).
    """

    def __init__(
        self,
        granularity: PathGranularity,
        readout: LayerwiseReadout,
        record: Dict[str, Optional[str]],
        along: IntegrationPath,
        route: ReadoutPlan,
    ) -> None:
        super().__init__(granularity, readout, record, along)
        self.route = route

    def map(
        self, integration: Integration, path: TracedPath, top_k: int
    ) -> ReadoutSplit:
        return self._split(integration, path, top_k)

    def attributions(
        self, integration: Integration, path: TracedPath
    ) -> Tuple[Tensor, DeltaOf]:
        split = self._split(integration, path)
        attrs = split.block.to(work_dtype(path.points.dtype))
        return attrs, lambda block: learned_delta(path, split, block)

    def delta(self, path: TracedPath, credits: Tensor, chunk_rows: int) -> Tensor:
        """The attributions are block parts: the delta adds the lens parts (of
        the map by the path's own estimator, exact on every built-in path)."""
        rule = estimator(self.along.default_method)
        exact = Integration(rule, self.readout, 1, chunk_rows, self.along)
        return learned_delta(path, split_map(exact, path, self.route), credits)

    def credits_and_delta(
        self, path: TracedPath, split: ReadoutSplit
    ) -> Tuple[Tensor, Tensor]:
        lens = _lens(split)
        credits = (split.block + lens).float() * path.mask[..., None]
        delta = learned_delta(path, split, split.block.sum(-1), one_output=False)
        return credits, delta.float()

    def _split(
        self, integration: Integration, path: TracedPath, top_k: int = 0
    ) -> ReadoutSplit:
        """The block and lens parts of the columns: columns that are segments
        (:func:`split_map`, :func:`split_attributions`) or components of
        segments (:func:`split_components`)."""
        granularity, route = self.granularity, self.route
        if granularity.column_blocks() is not None:
            if integration.per_dimension:
                return split_attributions(integration, path, route)
            return split_map(integration, path, route, top_k)
        split = split_components(
            integration,
            path,
            route,
            granularity.column_segments(len(path.names)),
            lambda segments, ends: granularity.component_columns(segments, path, ends),
            top_k,
        )
        views = (
            None
            if split.views is None
            else column_views(granularity, path, split.views)
        )
        return replace(
            split, levels=granularity.levels(path, split.levels), views=views
        )


def column_readout(
    readout: LayerwiseReadout,
    layers: Sequence[Module],
    granularity: PathGranularity,
    along: IntegrationPath,
) -> ColumnReadout:
    r"""
    How ``granularity``'s columns on the path through ``layers`` are read.

    Args:

        readout (LayerwiseReadout): The lens's readout.
        layers (list[Module]): The chosen blocks.
        granularity (PathGranularity): The granularity.
        along (IntegrationPath): How the path points are joined.

    Returns:
        :class:`OneReadout` through the model's own readout where ``readout``
        reads every state of the path alike (the logit readout; the logit
        readout's numbers, exactly, where every translator on the path is the
        identity), else :class:`LensChange`.

    Raises:
        ValueError: If the readouts along the path differ and ``granularity``'s
            columns cannot be split by block, or ``along`` cannot integrate
            them.
    """
    record = readout_record(readout)
    if one_readout(readout, layers):
        return OneReadout(granularity, readout.base, record, along)
    check_learned_readout(granularity.name, readout.kind)
    if not along.learned_readout:
        raise ValueError(
            f"path: {along.name!r} is not available with a learned readout per "
            "layer that differs along the path; use path='telescoping', or the "
            "logit readout"
        )
    blocks = granularity.column_blocks()
    if blocks is None:
        blocks = granularity.segment_blocks()
    assert blocks is not None  # granularities with learned_readout have them
    return LensChange(
        granularity, readout, record, along, plan(readout, layers, blocks)
    )


def learned_delta(
    path: TracedPath, split: ReadoutSplit, block: Tensor, one_output: bool = True
) -> Tensor:
    r"""``Σ block parts + Σ lens parts - (f_model - f_0(h_base))`` from the
    block parts' sums ``(B, P)``, zero at padding; ``(B,)`` when one output is
    attributed per example (and ``one_output``)."""
    sums = block.double() + _lens(split).double().sum(-1)
    gap = completeness_gap(sums, path.model_prob, split.levels[..., 0], path.mask)
    gap = gap.to(work_dtype(path.points.dtype))
    return gap.sum(-1) if path.one_output and one_output else gap


def completeness_gap(
    sums: Tensor, model_prob: Tensor, base_prob: Tensor, mask: Tensor
) -> Tensor:
    r"""
    The convergence delta ``Σ credits - (f_model - f(h_base))``, in float64 so
    that the map and :meth:`LayerIGLens.compute_convergence_delta` agree to
    the last bit of the credits given.

    Args:

        sums (Tensor): The credits summed over their columns, in float64
            ``(B, P)``.
        model_prob (Tensor): ``f_model`` ``(B, P)``.
        base_prob (Tensor): ``f(h_base)`` ``(B, P)``.
        mask (Tensor): 1 at attributed positions, 0 at padding ``(B, P)``.

    Returns:
        *Tensor* ``(B, P)``, float64: the delta, zero at padding.
    """
    change = model_prob.double() - base_prob.double()
    return (sums.double() - change) * mask


def _lens(split: ReadoutSplit) -> Tensor:
    assert split.lens is not None  # a lens-change split has lens parts
    return split.lens


def column_views(granularity: PathGranularity, path: TracedPath, views: Views) -> Views:
    r"""
    The views of the path points ``(B, P, K)`` (points ``1 .. K``) as the views
    of the credit columns ``(B, P, n)``: each column shows the distribution of
    the path point whose level it reads. Which point that is comes from the
    granularity's own :meth:`~PathGranularity.levels`, applied to the points'
    indices, so every granularity's columns get their views the same way.
    """
    b, p, k_plus_1 = path.points.shape[:3]
    index = torch.arange(k_plus_1, device=views.rank.device).expand(b, p, k_plus_1)
    point = granularity.levels(path, index)[0, 0, 1:].to(views.rank.device)
    return views[:, :, point - 1]


def _view_fields(views: Views) -> Dict[str, Any]:
    """The view fields of :class:`IGLensResult` (float32, like the credits)."""
    return dict(
        top_ids=views.top_ids,
        top_probs=views.top_probs.float(),
        entropy=views.entropy.float(),
        kl=views.kl.float(),
        rank=views.rank,
    )
