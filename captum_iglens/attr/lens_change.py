r"""
Exact credits under a learned readout per layer: each block's term split into
a *block part* and a *lens-change part*.

With readouts ``f_i`` (a :class:`~captum_iglens.readout.interface.LayerwiseReadout`)
and block ``j`` of the path going from ``h_s`` (read by ``f_a``) to ``h_e``
(read by ``f_b``), its term ``f_b(h_e) - f_a(h_s)`` is split as the average of
the two orders (state first, or readout first):

    block part = ½ [(f_a(h_e) - f_a(h_s)) + (f_b(h_e) - f_b(h_s))]
    lens part  = ½ [(f_b - f_a)(h_s) + (f_b - f_a)(h_e)]

The block part is the mean of the block's integrated gradients under ``f_a``
and under ``f_b`` (each one straight segment, read by one readout, with the
estimator asked for), so it splits inside the block as today; the terms
telescope to ``p_model - f_0(h_base)``. A block made of several columns
(``granularity="sublayer"``) splits its block part per column, and its lens
part puts ``½ (f_b - f_a)(h_s)`` on its first column and ``½ (f_b - f_a)(h_e)``
on its last. Translators that are equal are one readout (a lens part of
exactly 0, and one integral, not two).

A granularity whose columns are *components* of straight segments (heads,
neurons, experts, sources: :func:`split_components`) is split the same way:
every segment of the stream belongs to a block, each column's block part is
the mean of its component integrals under the block's ``f_a`` and ``f_b``
(the estimator's own split, once per readout, so the components add up to the
segment's integral under each), and the lens part sits on the block's first
column (``h_s``) and its last (``h_e``).
"""

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.attr.estimators import Integration
from captum_iglens.attr.tracing import TracedPath, path_levels
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.scores import TokenScore, Views

Key = Tuple[int, int]  # (path point, hidden-state index of its readout)


@dataclass
class ReadoutPlan:
    """Which readout each column's block starts and ends with, canonical
    (states read alike share one index; the model's own is ``L``), and the
    readout they index."""

    readout: LayerwiseReadout
    start: List[int]  # (n,): f_a of each column's block
    end: List[int]  # (n,): f_b
    first: List[bool]  # (n,): the column opens its block
    last: List[bool]  # (n,): the column closes its block

    def level_readouts(self) -> List[int]:
        """The readout of each point ``0 .. n``: ``f_a`` of the first block at
        ``h_base``, then each column's ``f_b``."""
        return [self.start[0], *self.end]


@dataclass
class ReadoutSplit:
    """The parts of every column, with the levels of every point."""

    levels: Tensor  # (B, P, n + 1): f at the points, the last the model's own
    block: Tensor  # (B, P, n), or (B, P, n, d) per dimension
    lens: Optional[Tensor]  # (B, P, n); None where one readout reads every point
    views: Optional[Views] = None  # (B, P, n)
    errors: Optional[Tensor] = None  # (B, P, n): each credit's error estimate


def one_readout(readout: LayerwiseReadout, layers: Sequence[Module]) -> bool:
    r"""
    Whether ``readout`` reads every state of the path through ``layers`` (its
    ``h_base`` and the blocks' outputs) alike, as the model's own readout reads
    the last: then no column has a lens-change part.
    """
    states = _states(readout, layers)
    return all(readout.same(states[-1], i) for i in states)


def plan(
    readout: LayerwiseReadout, layers: Sequence[Module], column_blocks: Sequence[int]
) -> ReadoutPlan:
    r"""
    The readouts of the columns of a path through ``layers``.

    Args:

        readout (LayerwiseReadout): The readout per layer.
        layers (list[Module]): The chosen blocks; block ``j`` of the path goes
                    from the output of ``layers[j - 1]`` (``h_base`` for
                    ``j = 0``, read as state 0) to the output of ``layers[j]``.
        column_blocks (list[int]): The path block of each credit column, in
                    order (``[0, 1, ...]`` for blocks, ``[0, 0, 1, 1, ...]``
                    for sub-layers), or of each straight segment of the
                    stream where the columns are components of segments.

    Returns:
        *ReadoutPlan*.
    """
    states = _states(readout, layers)
    canonical = _canonical(readout, sorted(set(states)))
    start = [canonical[states[j]] for j in column_blocks]
    end = [canonical[states[j + 1]] for j in column_blocks]
    blocks = list(column_blocks)
    first = [i == 0 or blocks[i - 1] != j for i, j in enumerate(blocks)]
    last = [i == len(blocks) - 1 or blocks[i + 1] != j for i, j in enumerate(blocks)]
    return ReadoutPlan(readout, start, end, first, last)


def _states(readout: LayerwiseReadout, layers: Sequence[Module]) -> List[int]:
    """The hidden-state index of each point of the path: 0 for ``h_base``,
    then each block's output."""
    return [0] + [readout.state_index(m) for m in layers]


def _canonical(readout: LayerwiseReadout, used: List[int]) -> Dict[int, int]:
    """Each used state's readout, as the first equal one (the model's own,
    ``L``, first of all)."""
    order = sorted(used, key=lambda i: (i != readout.n_layers, i))
    found: Dict[int, int] = {}
    for i in order:
        found[i] = next((j for j in found if readout.same(i, j)), i)
    return found


def split_map(
    integration: Integration, path: TracedPath, route: ReadoutPlan, top_k: int = 0
) -> ReadoutSplit:
    r"""
    The scalar block and lens parts of every column (``attribute_map``): with
    an exact estimator from the readout's values alone, else the mean of the
    estimator's credits under both readouts. ``integration`` reads through
    ``route.readout``.
    """
    readout, chunk_rows = route.readout, integration.chunk_rows
    levels, views = path_levels(
        readout, path, chunk_rows, top_k, _tensor(route.level_readouts()[:-1], path)
    )
    values = _values(readout, path, route, levels, chunk_rows)
    lens = _lens_parts(values, route, path)
    if integration.rule.exact:
        block = _exact_block_parts(values, route, path)
    else:
        block = _integrated(integration, path, route, values)
    return ReadoutSplit(levels, block, lens, views)


def split_attributions(
    integration: Integration, path: TracedPath, route: ReadoutPlan
) -> ReadoutSplit:
    r"""
    The per-dimension block parts ``(B, P, n, d)`` of every column
    (``attribute``): the mean of the estimator's attributions under both
    readouts, with the scalar lens parts beside them.
    """
    readout, chunk_rows = route.readout, integration.chunk_rows
    with torch.no_grad():
        levels = path_levels(
            readout, path, chunk_rows, 0, _tensor(route.level_readouts()[:-1], path)
        )[0]
        values = _values(readout, path, route, levels, chunk_rows)
        lens = _lens_parts(values, route, path)
    block = _integrated(replace(integration, per_dimension=True), path, route, values)
    return ReadoutSplit(levels, block, lens)


def _tensor(values: Sequence[int], path: TracedPath) -> Tensor:
    return torch.tensor(list(values), dtype=torch.long, device=path.points.device)


def _values(
    readout: LayerwiseReadout,
    path: TracedPath,
    route: ReadoutPlan,
    levels: Tensor,
    chunk_rows: int,
) -> Dict[Key, Tensor]:
    """``f_t`` at every (point, readout) the parts need, ``(B, P)`` each: the
    levels, and the rest read once each (the last point by the model's own
    readout is the model's probability)."""
    found: Dict[Key, Tensor] = {
        (c, t): levels[..., c] for c, t in enumerate(route.level_readouts())
    }
    found[(len(route.end), readout.n_layers)] = path.model_prob
    wanted: List[Key] = []
    for c, (a, b) in enumerate(zip(route.start, route.end), start=1):
        for key in ((c - 1, a), (c, a), (c - 1, b), (c, b)):
            if key not in found and key not in wanted:
                wanted.append(key)
    if not wanted:
        return found
    b, p, _, d = path.points.shape
    points = path.points[:, :, [c for c, _ in wanted]].flatten(0, 1)
    read = path_values(
        readout,
        points,
        path.score.flatten(),
        chunk_rows,
        layers=_tensor([t for _, t in wanted], path),
    )[0].view(b, p, len(wanted))
    for i, key in enumerate(wanted):
        found[key] = read[..., i]
    return found


def _lens_parts(
    values: Dict[Key, Tensor], route: ReadoutPlan, path: TracedPath
) -> Tensor:
    """``½ (f_b - f_a)`` at the block's start (on its first column) and at its
    end (on its last), in float64 then float32 ``(B, P, n)``."""
    parts = []
    for c, (a, b) in enumerate(zip(route.start, route.end), start=1):
        part = torch.zeros_like(path.model_prob, dtype=torch.float64)
        if a != b:
            if route.first[c - 1]:
                part = part + _gap(values, c - 1, a, b)
            if route.last[c - 1]:
                part = part + _gap(values, c, a, b)
        parts.append(part / 2)
    return torch.stack(parts, -1)


def _gap(values: Dict[Key, Tensor], c: int, a: int, b: int) -> Tensor:
    return values[(c, b)].double() - values[(c, a)].double()


def _exact_block_parts(
    values: Dict[Key, Tensor], route: ReadoutPlan, path: TracedPath
) -> Tensor:
    """``½ [Δ f_a + Δ f_b]`` across each column, in float64 ``(B, P, n)``."""
    parts = []
    for c, (a, b) in enumerate(zip(route.start, route.end), start=1):
        change_a = values[(c, a)].double() - values[(c - 1, a)].double()
        change_b = values[(c, b)].double() - values[(c - 1, b)].double()
        parts.append((change_a + change_b) / 2)
    return torch.stack(parts, -1)


def _integrated(
    integration: Integration,
    path: TracedPath,
    route: ReadoutPlan,
    values: Dict[Key, Tensor],
) -> Tensor:
    """The mean of the estimator's credits (or attributions, with
    ``integration.per_dimension``) of each column under its block's two
    readouts, each column one straight segment read by one readout;
    ``(B, P, n)`` or ``(B, P, n, d)``."""
    b, p, k_plus_1, d = path.points.shape
    n = k_plus_1 - 1
    columns = torch.arange(n, device=path.points.device)
    pairs = torch.stack(
        [path.points[:, :, columns], path.points[:, :, columns + 1]], 3
    ).flatten(0, 2)  # (B·P·n, 2, d)
    targets = path.score.flatten().repeat_interleave(n)
    orders = [route.start] if route.start == route.end else [route.start, route.end]
    parts: list[Tensor] = []
    rule = integration.rule
    for order in orders:
        ends = torch.stack(
            [
                torch.stack([values[(c - 1, t)], values[(c, t)]], -1)
                for c, t in enumerate(order, start=1)
            ],
            2,
        ).flatten(0, 2)  # (B·P·n, 2)
        layers = _tensor(order, path).repeat(b * p)[:, None].expand(-1, 2)
        if integration.per_dimension:
            found = rule.attributions(
                integration, pairs, targets, ends[:, 1], layers=layers
            )[:, 0].view(b, p, n, d)
        else:
            found = rule.credits(integration, pairs, targets, ends, layers=layers)
            found = found[:, 0].view(b, p, n)
        parts.append(found.double())
    return torch.stack(parts).mean(0)


#: The granularity's component columns ``(B, P, n)`` (or ``(B, P, n, d)``)
#: under an integration, from ``f`` at both ends of every segment
#: ``(B, P, S, 2)``.
Columns = Callable[[Integration, Tensor], Tensor]


class SegmentReadout:
    r"""
    A learned readout that reads the rows of each straight segment with one
    readout per segment: the component splits label every row of a segment
    with the path point at its end (``q``), read here as readout ``table[q]``.

    Args:

        readout (LayerwiseReadout): The readout per layer.
        table (Tensor): ``(S + 1,)`` long: the readout of the segment ending
                    at each path point (entry 0 unused).
    """

    def __init__(self, readout: LayerwiseReadout, table: Tensor) -> None:
        self.readout = readout
        self.table = table
        self.max_chunk_bytes = readout.max_chunk_bytes

    @property
    def vocab_size(self) -> int:
        return self.readout.vocab_size

    @property
    def device(self) -> torch.device:
        return self.readout.device

    def rows_per_chunk(self, backward: bool = False) -> int:
        return self.readout.rows_per_chunk(backward)

    def __call__(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        return self.readout(hidden, self._index(layer))

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        return self.readout.score(hidden, score, self._index(layer))

    def _index(self, layer: Optional[Tensor]) -> Tensor:
        if layer is None:
            raise ValueError("layer: a segment readout reads labelled rows only")
        return self.table.to(layer.device)[layer]


def split_components(
    integration: Integration,
    path: TracedPath,
    route: ReadoutPlan,
    column_segments: Sequence[int],
    columns: Columns,
    top_k: int = 0,
) -> ReadoutSplit:
    r"""
    The block and lens parts of columns that are components of the stream's
    straight segments (``granularity="head"``, ``"neuron"``, ...).

    Args:

        integration (Integration): Reads through ``route.readout``.
        path (TracedPath): The traced stream (``K`` points, ``S = K - 1``
                    segments).
        route (ReadoutPlan): The readouts of the segments (:func:`plan` with
                    the path block of each segment).
        column_segments (list[int]): The segment each of the ``n`` columns
                    is a component of, in order.
        columns (Callable): The granularity's component columns under an
                    integration that reads through a :class:`SegmentReadout`,
                    from ``f`` at both ends of every segment ``(B, P, S, 2)``.
        top_k (int): Views of the top tokens at the points. Default: 0

    Returns:
        *ReadoutSplit* with ``levels`` and ``views`` at the stream's points
        ``(B, P, K)``, ``block`` ``(B, P, n)`` (or per dimension, as
        ``columns`` gives) and ``lens`` ``(B, P, n)``.
    """
    readout, chunk_rows = route.readout, integration.chunk_rows
    with torch.no_grad():
        levels, views = path_levels(
            readout, path, chunk_rows, top_k, _tensor(route.level_readouts()[:-1], path)
        )
        values = _values(readout, path, route, levels, chunk_rows)
        lens = _component_lens(values, route, column_segments, path)
    orders = [route.start] if route.start == route.end else [route.start, route.end]
    parts: list[Tensor] = []
    for order in orders:
        ends = torch.stack(
            [
                torch.stack([values[(s, t)], values[(s + 1, t)]], -1)
                for s, t in enumerate(order)
            ],
            2,
        )  # (B, P, S, 2)
        table = _tensor([order[0], *order], path)
        segments = integration.reading(SegmentReadout(readout, table))
        parts.append(columns(segments, ends).double())
    return ReadoutSplit(levels, torch.stack(parts).mean(0), lens, views)


def _component_lens(
    values: Dict[Key, Tensor],
    route: ReadoutPlan,
    column_segments: Sequence[int],
    path: TracedPath,
) -> Tensor:
    """``½ (f_b - f_a)`` at a block's start on the first column of its first
    segment, and at its end on the last column of its last, float64
    ``(B, P, n)``."""
    segments = list(column_segments)
    n = len(segments)
    lens = torch.zeros(
        *path.model_prob.shape, n, dtype=torch.float64, device=path.model_prob.device
    )
    for s, (a, b) in enumerate(zip(route.start, route.end)):
        if a == b:
            continue
        if route.first[s]:
            lens[..., segments.index(s)] += _gap(values, s, a, b) / 2
        if route.last[s]:
            lens[..., n - 1 - segments[::-1].index(s)] += _gap(values, s + 1, a, b) / 2
    return lens
