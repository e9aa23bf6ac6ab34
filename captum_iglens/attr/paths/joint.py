r"""
The ``"joint"`` path: every column's update scaled together, ``γ(α) = h_base +
α·(h_final - h_base)``, one integral for all of them.

The columns of a granularity are displacements ``u_c`` that add up to
``D = h_final - h_base`` (each block's update, or its sub-layers', heads',
source tokens', neurons' or experts' terms). Integrated Gradients along the one
straight segment ``h_base → h_final``, with the ``u_c`` as its inputs, gives
column ``c`` the credit ``∫_0^1 ∇f(γ(α))·u_c dα``: the credits add up to
``f(h_final) - f(h_base)`` (the gradient theorem), every column is treated
alike (no depth order), and, being linear in ``u_c``, a column's credit is the
sum of its components' credits. One gradient per step serves every column, so
a granularity's columns all come from one integral per position.
"""

from typing import Any, Callable, Optional, Sequence, Tuple, Type, Union

import torch
from torch import Tensor

from captum_iglens.attr._utils.component_reads import component_dots, component_norms
from captum_iglens.attr._utils.path_math import chunks, path_values
from captum_iglens.attr.estimators import (
    Estimator,
    Integration,
    Segments,
    SplitChains,
)
from captum_iglens.attr.granularities.base import PathGranularity
from captum_iglens.attr.paths.base import IntegrationPath
from captum_iglens.readout.scores import TokenScore

#: Bytes of one float32 column of one row per dimension that a call of the
#: estimator holds at once: the component, its share of the gradient products
#: and, per dimension, its output.
_BYTES_PER_ENTRY = 3 * 4


class Joint(IntegrationPath):
    r"""
    All columns integrated along ``h_base → h_final`` at once: the
    estimator's :meth:`~captum_iglens.attr.estimators.base.Estimator.components`
    of that one segment, with every column's update as a component. With
    ``method="prediction_aware"`` each step's observed change ``f(γ_s) -
    f(γ_{s-1})`` is split among the columns by their first-order terms ``u_c ·
    ḡ_s`` (``ḡ_s`` the step's mean gradient), so the credits add up exactly at
    any ``n_steps``; Captum's rules give plain Integrated Gradients along the
    segment. The readout is the model's own at every point: a learned readout
    per layer defines no such path.
    """

    name = "joint"
    default_steps = 128
    default_method = "adaptive"
    companion = True
    onset_meaning = "blocks wrote it"
    trajectory_caption = (
        "lens level: what the head reads after each block; cumulative credit: "
        "the blocks' joint credits so far (every update scaled together). The "
        "two differ; at the last block, f(h_base) + cumulative credit = p_model"
    )

    def check(
        self,
        granularity: Type[PathGranularity],
        multiply_by_inputs: bool,
        baselines_given: bool,
    ) -> None:
        if not multiply_by_inputs:
            raise ValueError(
                "multiply_by_inputs: path='joint' credits each column's update "
                "(u_c times the path-averaged gradient) and has no form without "
                "it; build LayerIGLens with multiply_by_inputs=True or use "
                "path='telescoping'"
            )
        if baselines_given and not granularity.input_column:
            raise ValueError(
                "baselines: path='joint' credits what each block writes; a "
                "baseline other than h_0 adds the update h_0 - h_base, which "
                f"granularity={granularity.name!r} has no column for (it would "
                "be merged into the first block's credit). Use baselines=None, "
                "a granularity with an 'input' column (head, source, "
                "source_head), or path='telescoping'"
            )

    def map_needs_gradients(
        self, granularity: PathGranularity, rule: Estimator
    ) -> bool:
        return True  # every estimator splits the segment by its gradients

    def segments(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        blocks: Optional[Sequence[int]] = None,
    ) -> Tensor:
        def updates(rows: slice) -> Tensor:
            return points[rows].float().diff(dim=1)

        n_columns = points.shape[1] - 1
        groups = None if blocks is None else torch.tensor(list(blocks))
        if integration.per_dimension:  # f(h_base) is read here
            with torch.no_grad():
                start = path_values(
                    integration.readout, points[:, :1], targets, integration.chunk_rows
                )[0]
            values = torch.cat([start.to(values.dtype), values], dim=1)
        credits, errors = self._integrate(
            integration, points, updates, n_columns, targets, values, groups
        )
        if errors is not None and integration.errors is not None:
            integration.errors.append(errors)
        return credits

    def split_segments(
        self, integration: Integration, chains: SplitChains
    ) -> Tuple[Tensor, Tensor]:
        r"""Every split segment's components and every whole segment's update,
        as the columns of one integral (:class:`JointColumns`), grouped by
        ``chains.blocks`` where given, else by segment. Where
        ``integration.errors`` collects error estimates and the estimator gives
        them, each scalar credit comes as the pair ``(credit, error)`` (a
        trailing dimension of 2), so that a granularity arranging its columns
        along the leading dimensions carries each error with its credit (the
        component granularities' ``credits`` take the pairs apart)."""
        stream, blocks = chains.stream, chains.blocks
        n, n_split, c = stream.shape[0], len(chains.split), chains.components.shape[1]
        k = stream.shape[1] - 1
        groups = torch.tensor(list(range(k) if blocks is None else blocks))
        columns = JointColumns(
            stream, chains.components, chains.split, chains.whole, groups
        )
        out, errors = self._integrate(
            integration,
            stream,
            columns.rows,
            columns.n_columns,
            chains.targets,
            chains.values,
            columns.parents,
        )
        if errors is not None and integration.errors is not None:
            out = torch.stack([out, errors.to(out.dtype)], dim=-1)
        rest = out.shape[2:]
        parts, plain_out = out[:, : n_split * c], out[:, n_split * c :]
        return parts.reshape(n * n_split, c, *rest), plain_out.reshape(-1, *rest)

    def _integrate(
        self,
        integration: Integration,
        stream: Tensor,
        columns: Callable[[slice], Any],
        n_columns: int,
        targets: TokenScore,
        values: Tensor,
        parents: Optional[Tensor],
    ) -> Tuple[Tensor, Optional[Tensor]]:
        r"""
        The estimator's credits of the columns ``columns(rows)`` ``(g, n, d)``
        (a tensor, or an object the estimators read as components) along
        ``stream[:, 0] → stream[:, -1]``, a group of rows at a time so that the
        columns of a group fit the readout's memory budget.

        Args:

            stream (Tensor): ``(N, K + 1, d)``: the chains; their ends are the
                        path's.
            values (Tensor): ``(N, ≥ 2)``: ``f`` at the chains' points, the
                        first and the last read.

        Returns:
            2-element tuple: the credits ``(N, n)``, or ``(N, n, d)`` per
            dimension, and their error estimates ``(N, n)`` where the
            estimator gives them (else None).
        """
        n, d = stream.shape[0], stream.shape[-1]
        ends = stream[:, [0, -1]]
        end_values = values[:, [0, -1]]
        groups = None if parents is None else parents.to(stream.device)
        fractions = _steps(ends, integration.n_steps)
        budget = integration.readout.max_chunk_bytes
        rows_per_call = max(1, budget // (n_columns * d * _BYTES_PER_ENTRY))
        found = [
            integration.rule.components_and_errors(
                integration,
                Segments(
                    ends[rows],
                    columns(rows),
                    targets[rows],
                    end_values[rows],
                    parents=groups,
                    fractions=fractions[rows],
                ),
            )
            for rows in chunks(n, rows_per_call)
        ]
        if not found:
            return ends.new_zeros(0, n_columns), None
        credits, errors = zip(*found)
        known = None if errors[0] is None else torch.cat(errors)
        return torch.cat(credits), known


def _steps(ends: Tensor, n_steps: int) -> Tensor:
    r"""
    Where the steps along each row's ``h_base → h_final`` end. The final norm
    of the readout makes ``f`` depend on the direction of ``γ(α)`` alone (an
    RMSNorm exactly, a LayerNorm up to its centring), and that direction turns
    from ``h_base``'s to ``h_final``'s around ``α ≈ ‖h_base‖ / ‖h_final‖``, a
    few thousandths on real models, where ``f`` then changes fastest. Half the
    step ends are equal in ``α``; the others are equal in the mixing weight
    ``β`` of the two directions, ``α = β a / (β a + (1 - β) b)`` with ``a =
    ‖h_base‖`` (at least ``b / 1000``) and ``b = ‖h_final‖``. Where the steps
    end changes no sum, only how fast the split among the columns converges
    (on SmolLM2 the mean error of a block credit at 128 steps is 3× smaller
    than with equal steps: ``benchmarks/joint.py``).

    Args:

        ends (Tensor): ``(N, 2, d)``: ``h_base`` and ``h_final`` per row.
        n_steps (int): ``n``.

    Returns:
        *Tensor* ``(N, n + 1)`` float32, from 0 to 1, not decreasing.
    """
    n, device = ends.shape[0], ends.device
    norms = ends.float().norm(dim=-1)  # (N, 2)
    b = norms[:, 1:].clamp_min(torch.finfo(torch.float32).tiny)
    a = torch.maximum(norms[:, :1], b / 1000)
    equal = (n_steps - 1) // 2  # inner ends of each kind
    turning = n_steps - 1 - equal
    alpha = torch.arange(1, equal + 1, device=device) / (equal + 1)
    beta = torch.arange(1, turning + 1, device=device) / (turning + 1)
    turned = beta * a / (beta * a + (1 - beta) * b)
    inner = torch.cat([alpha.expand(n, -1), turned], dim=1).sort(dim=1).values
    zeros = inner.new_zeros(n, 1)
    return torch.cat([zeros, inner, zeros + 1], dim=1)


class JointColumns:
    r"""
    The columns of :meth:`Joint.split_segments`: each split segment's
    components, then each whole segment's update, every column in the group of
    its segment. The estimators read a group of chains at a time
    (:meth:`rows`) through ``dots`` and ``norms``
    (:mod:`~captum_iglens.attr._utils.component_reads`), which read the split
    segments' components through their own products where those are kept
    factored (neurons, experts, sources), never as ``(chains, columns, d)``.

    Args:

        stream (Tensor): ``(N, K + 1, d)`` path points.
        components (Tensor): ``(N·len(split), C, d)``, or an object read as
                    components (:mod:`~captum_iglens.attr._utils.component_reads`).
        split (list[int]): The segments split into components.
        whole (list[int]): The segments that are one column each.
        groups (Tensor): ``(K,)`` long: the group of each segment.
    """

    def __init__(
        self,
        stream: Tensor,
        components: Any,
        split: Sequence[int],
        whole: Sequence[int],
        groups: Tensor,
    ) -> None:
        self.stream, self.components = stream, components
        self.split, self.whole = list(split), list(whole)
        self.groups = groups.to(stream.device)
        c = components.shape[1]
        self.parents = torch.cat(
            [self.groups[self.split].repeat_interleave(c), self.groups[self.whole]]
        )
        self.n_columns = len(self.parents)

    def rows(self, chains: slice) -> "ChainColumns":
        r"""The columns of the chains ``chains``."""
        return ChainColumns(self, chains)


class ChainColumns:
    r"""
    :class:`JointColumns` of a group of chains, as the estimators read
    components: ``shape`` ``(g, C, d)``, ``[rows]`` (built), ``dots``,
    ``norms`` and ``parents``.
    """

    def __init__(self, columns: JointColumns, chains: slice) -> None:
        start, stop, _ = chains.indices(columns.stream.shape[0])
        steps = columns.stream[chains].float().diff(dim=1)  # (g, K, d)
        self.components, self.parents = columns.components, columns.parents
        self.n_split = len(columns.split)
        self.first = start * self.n_split
        self.whole = steps[:, columns.whole]
        n_groups = int(columns.groups.max()) + 1
        self.group_sums = steps.new_zeros(stop - start, n_groups, steps.shape[-1])
        self.group_sums.index_add_(1, columns.groups, steps)
        self.shape = torch.Size([stop - start, columns.n_columns, steps.shape[-1]])

    def __getitem__(self, rows: Union[slice, Tensor]) -> Tensor:
        whole = self.whole[rows]
        parts = self.components[self._split_rows(rows)].to(whole.device)
        parts = parts.reshape(whole.shape[0], -1, whole.shape[-1])
        return torch.cat([parts, whole], dim=1)

    def dots(self, rows: Union[slice, Tensor], grads: Tensor) -> Tensor:
        r"""``g_s · u_c`` ``(g, S, C)`` for the rows ``rows`` and ``grads``
        ``(g, S, d)``."""
        g, s, _ = grads.shape
        per_segment = grads.repeat_interleave(self.n_split, dim=0)
        parts = component_dots(self.components, self._split_rows(rows), per_segment)
        parts = parts.to(grads.device).view(g, self.n_split, s, -1).transpose(1, 2)
        whole = torch.einsum("gsd,gwd->gsw", grads, self.whole[rows])
        return torch.cat([parts.reshape(g, s, -1), whole], dim=2)

    def norms(self, rows: Union[slice, Tensor]) -> Tuple[Tensor, Tensor]:
        r"""``‖u_c‖²`` ``(g, C)`` for the rows ``rows``, and each group's
        summed columns' ``(g, G)`` (its segments' steps)."""
        _, square, _ = component_norms(self.components, self._split_rows(rows), None)
        whole = self.whole[rows]
        square = square.to(whole.device).view(whole.shape[0], -1)
        square = torch.cat([square, whole.square().sum(-1)], dim=1)
        return square, self.group_sums[rows].square().sum(-1)

    def _split_rows(self, rows: Union[slice, Tensor]) -> Tensor:
        """The rows of ``components`` of the chains ``rows``."""
        chains = torch.arange(self.shape[0])[rows]
        offsets = torch.arange(self.n_split)
        return (self.first + chains[:, None] * self.n_split + offsets).flatten()
