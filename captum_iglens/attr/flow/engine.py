r"""
The flow engine: the path from a baseline to the prompt, the model at its grid
points, and the edges summed over steps. A function of the model's parts and
checked arguments, so that a path class can call it as well as
:class:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow`.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.attr.flow.capture import PointState, run_points
from captum_iglens.attr.flow.budget import pairs_at_once, receivers_at_once
from captum_iglens.attr.flow.estimator import STEP_RULES, StepRule, StepTerms
from captum_iglens.attr.flow.reads import allowed, read_positions
from captum_iglens.graph.model_graph import ModelGraph, model_graph
from captum_iglens.graph.target import Target
from captum_iglens.hf.parts import ModelParts


def flow_graph_of(parts: ModelParts, qkv: bool) -> ModelGraph:
    r"""
    The graph of the flow through a model, whose blocks must split into heads
    and one MLP.

    Args:
        parts (ModelParts): The model's parts.
        qkv (bool): Separate query, key and value receivers.

    Returns:
        *ModelGraph*.

    Raises:
        ValueError: If the architecture has no attention output projection,
            no mid-block module or MLP output projection, parallel blocks or
            mixture-of-experts MLPs.
    """
    config = getattr(parts.model, "config", None)
    model_type = getattr(config, "model_type", None)
    missing = [
        name for name in ("attn_out", "mid", "mlp_out") if getattr(parts, name) is None
    ]
    if missing or parts.parallel_mlp is not None or parts.experts is not None:
        why = (
            f"its architecture entry has no {', '.join(missing)}"
            if missing
            else "its blocks are parallel or mixture-of-experts"
        )
        raise ValueError(
            f"model: probability flow needs sequential blocks split into attention "
            f"heads and one MLP; model_type {model_type!r} is not supported ({why})"
        )
    assert parts.n_heads is not None
    text: Any = getattr(config, "get_text_config", lambda: config)()
    kv = getattr(text, "num_key_value_heads", None)
    grouped = kv if isinstance(kv, int) and kv != parts.n_heads else None
    return model_graph(len(parts.blocks), parts.n_heads, qkv, grouped)


class _Reached(Exception):
    """Stops a forward once the first block's input is known."""


@torch.no_grad()
def first_block_inputs(parts: ModelParts, input_ids: Tensor) -> Tensor:
    r"""
    The first block's input (the embeddings, after any scaling of the model):
    the forward stops there.

    Args:
        parts (ModelParts): The model's parts.
        input_ids (Tensor): ``(N, T)`` long.

    Returns:
        *Tensor* ``(N, T, d)``.
    """
    found: List[Tensor] = []

    def stop(_: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        found.append(hidden_of(None, args, kwargs).detach())
        raise _Reached

    handle = parts.blocks[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        parts.model(input_ids=input_ids, use_cache=False)
    except _Reached:
        pass
    finally:
        handle.remove()
    return found[0]


@dataclass
class FlowTotals:
    r"""
    The flows summed over the steps of the path.

    Args:
        edges (Tensor): ``(R, S)`` float64: receiver by sender.
        direct (Tensor): ``(S, T)`` float64: into ``logits``, per sender position.
        input_edges (Tensor): ``(R, T)`` float64: out of ``input``, per position.
        by_position (Tensor, optional): ``(R, S, T)`` float64, by the
                    sender's position, where asked.
        by_pair (Tensor, optional): ``(R, S, T, T)`` float64, by the sender's
                    and the receiver's positions ``[r, u, s, t]``, where asked.
        m (Tensor): ``(n_steps + 1,)`` float64: the target at the grid points.
        effects (Tensor, optional): ``(R, S)`` float64: each edge's own effect
                    to first order, the sender's whole change times the
                    receiver's gradient averaged over the grid (trapezoid
                    weights), ``Δz_u · mean_k ρ_w``; None until the walk ends.
        direct_effects (Tensor, optional): ``(S,)`` float64: the same into
                    ``logits``, ``Δz_u · mean_k ∇f``; None until the walk ends.
    """

    edges: Tensor
    direct: Tensor
    input_edges: Tensor
    by_position: Optional[Tensor]
    by_pair: Optional[Tensor]
    m: Tensor
    effects: Optional[Tensor]
    direct_effects: Optional[Tensor]


def flow_totals(
    parts: ModelParts,
    input_ids: Tensor,
    base_inputs: Tensor,
    targets: Sequence[Target],
    graph: ModelGraph,
    *,
    n_steps: int,
    method: str,
    per_position: bool,
    receiver_positions: bool,
    internal_batch_size: int,
    max_chunk_bytes: int,
) -> List[FlowTotals]:
    r"""
    The edge flows of each pair along the straight path of the first block's
    input from its ``base_inputs`` to its prompt's, on ``n_steps`` equal steps.

    Each of the ``B`` pairs is walked as it would be alone, from its own first
    moving position and with its own sums; the points of several pairs share a
    forward where ``internal_batch_size`` holds their whole paths
    (:func:`~captum_iglens.attr.flow.budget.pairs_at_once`), and otherwise
    one pair's points run in chunks of ``internal_batch_size``, as alone.

    Memory: one forward's points (``internal_batch_size``, chosen by
    :func:`~captum_iglens.attr.flow.budget.points_at_once`), each pair's
    previous point's state, and a step's terms computed for a group of
    receivers at a time within ``max_chunk_bytes``; with ``per_position``
    also each pair's ``(R, S, T)`` float64 flows, with ``receiver_positions``
    its ``(R, S, T, T)`` ones and each point's gradients ``T`` times over.

    Args:
        parts (ModelParts): The model's parts (:func:`flow_graph_of`).
        input_ids (Tensor): ``(B, T)`` long: the prompts.
        base_inputs (Tensor): ``(B, T, d)``: the first block's input at each
                    path's start (a counterfactual prompt's, or a baseline).
        targets (Sequence[Target]): What is attributed, one per pair (of one
                    kind and position).
        graph (ModelGraph): The graph's nodes.
        n_steps (int): Steps of the path (``n_steps + 1`` forward and backward
                    passes per pair).
        method (str): ``"exact"`` or ``"first_order"``
                    (:mod:`~captum_iglens.attr.flow.estimator`).
        per_position (bool): Keep every edge per sender position.
        receiver_positions (bool): Also split those by the receiver's
                    position (implies ``per_position``).
        internal_batch_size (int): Grid points per forward, all pairs
                    together.
        max_chunk_bytes (int): The budget of a step's terms.

    Returns:
        *list[FlowTotals]*, one per pair, in order.
    """
    prompt_inputs = first_block_inputs(parts, input_ids)
    n_pairs, length, width = prompt_inputs.shape
    together, size = pairs_at_once(internal_batch_size, n_steps + 1, n_pairs)
    alphas = torch.linspace(0, 1, n_steps + 1, dtype=torch.float64)
    rule, found = STEP_RULES[method], []
    for low in range(0, n_pairs, together):
        group = slice(low, low + together)
        prompts, bases = prompt_inputs[group], base_inputs[group]
        walks = []
        for prompt, base in zip(prompts, bases):
            moving = first_moving(prompt[None], base[None])
            split = length - moving if receiver_positions else 1
            rows = receivers_at_once(
                graph, length - moving, width, max_chunk_bytes, split
            )
            stepper = _Stepper(rule, graph, rows, per_position, receiver_positions)
            walks.append(_Walk(moving, stepper))
        first = min(walk.first for walk in walks)
        for start in range(0, n_steps + 1, size):
            a = alphas[start : start + size].to(prompt_inputs.device)
            a = a.to(prompt_inputs.dtype).view(1, -1, 1, 1)
            points = bases[:, None] + a * (prompts - bases)[:, None]
            n = a.shape[1]
            cur = run_points(
                parts,
                input_ids[group].repeat_interleave(n, 0),
                points.flatten(0, 1),
                [target for target in targets[group] for _ in range(n)],
                graph,
                first,
                receiver_positions,
            )
            for i, walk in enumerate(walks):
                walk.add(_rows(cur, i * n, n, walk.first - first, receiver_positions))
            del cur, points  # freed before the next forward
        found += [walk.totals(length, n_steps) for walk in walks]
    return found


def first_moving(prompt_inputs: Tensor, base_inputs: Tensor) -> int:
    r"""
    The first position where the path's two ends differ. Every node's write
    before it is the same at every point of the path (the model is causal),
    so no flow leaves or crosses there, and the steps' terms are computed from
    it on.

    Args:
        prompt_inputs (Tensor): ``(1, T, d)``: the first block's input on the
                    prompt.
        base_inputs (Tensor): ``(1, T, d)``: at the path's start.

    Returns:
        *int* in ``[0, T)`` (the last position where the ends are equal).
    """
    moved = (prompt_inputs != base_inputs).any(-1).any(0)  # (T,)
    found = moved.nonzero()
    return int(found[0]) if len(found) else prompt_inputs.shape[1] - 1


def _from_position(totals: FlowTotals, first: int, length: int) -> FlowTotals:
    """The totals of positions ``first`` on, with the earlier ones (zero)
    put back in front."""

    def padded(flows: Tensor, axes: int) -> Tensor:
        if first == 0:
            return flows
        out = flows.new_zeros(*flows.shape[: flows.dim() - axes], *[length] * axes)
        if axes == 1:
            out[..., first:] = flows
        else:
            out[..., first:, first:] = flows
        return out

    by_position, by_pair = totals.by_position, totals.by_pair
    return FlowTotals(
        totals.edges,
        padded(totals.direct, 1),
        padded(totals.input_edges, 1),
        None if by_position is None else padded(by_position, 1),
        None if by_pair is None else padded(by_pair, 2),
        totals.m,
        None,
        None,
    )


class _Stepper:
    """Adds the flows of each step to the totals, a group of receivers' terms
    at a time (at the positions the points hold), by sender position where
    asked, and by receiver position too with ``pairs``."""

    def __init__(
        self,
        rule: StepRule,
        graph: ModelGraph,
        rows: int,
        per_position: bool,
        pairs: bool,
    ) -> None:
        self.rule, self.graph = rule, graph
        self.per_position, self.pairs = per_position or pairs, pairs
        self.allowed = allowed(graph)
        self.bands = _bands(self.allowed, rows)
        self.totals: Optional[FlowTotals] = None
        self.effects = EffectSums(self.bands)

    def add(self, prev: PointState, cur: PointState, j: int) -> None:
        r"""Adds the step from ``prev`` (one point) to point ``j`` of ``cur``."""
        work = torch.promote_types(cur.writes.dtype, torch.float32)
        dz = cur.writes[j].to(work) - prev.writes[0].to(work)  # (S, T', d)
        grad = (cur.grad_final[j].to(work) + prev.grad_final[0].to(work)) / 2
        self.effects.add_final(prev, grad, cur.rho.shape[1])
        direct = torch.einsum("td,std->st", grad, dz).double()
        (n_receivers, split), (n_senders, length, _) = cur.rho.shape[1:3], dz.shape
        sums = torch.zeros(n_receivers, n_senders, dtype=torch.float64)
        inputs = torch.zeros(n_receivers, length, dtype=torch.float64)
        kept = (
            torch.zeros(n_receivers, n_senders, length, dtype=torch.float64)
            if self.per_position
            else None
        )
        pairs = (
            torch.zeros(n_receivers, n_senders, length, split, dtype=torch.float64)
            if self.pairs
            else None
        )
        for rows, read in self.bands:
            rho = (cur.rho[j, rows].to(work) + prev.rho[0, rows].to(work)) / 2
            self.effects.add(rows, rho)
            if kept is None:  # B = 1: one product over positions and width
                product = rho.flatten(1) @ dz[:read].flatten(1).T  # (r, read)
                sums[rows, :read] = product.double().cpu()
                into = torch.einsum("rbsd,sd->rs", rho, dz[0])
                inputs[rows] = into.double().cpu()
                continue
            by_pair = torch.einsum("rbsd,usd->rusb", rho, dz[:read])
            terms = by_pair.sum(-1)  # (r, read, T)
            sums[rows, :read] = terms.sum(-1, dtype=torch.float64).cpu()
            inputs[rows] = terms[:, 0].double().cpu()
            kept[rows, :read] = terms.double().cpu()
            if pairs is not None:
                pairs[rows, :read] = by_pair.double().cpu()
        step = StepTerms(sums, direct.cpu(), float(cur.m[j] - prev.m[0]))
        edges, direct = self.rule.split(step, self.graph, self.allowed)
        if kept is not None:
            reads = (
                read_positions(self.graph, length).unsqueeze(1) if self.pairs else None
            )
            for rows, _ in self.bands:
                kept[rows] = self.rule.positions(edges[rows], kept[rows], None)
                if pairs is not None and reads is not None:  # (R, 1, T', T')
                    pairs[rows] = self.rule.positions(
                        kept[rows], pairs[rows], reads[rows]
                    )
        input_edges = self.rule.positions(edges[:, 0], inputs, None)
        empty = torch.zeros(0)  # the target's values are set at the end
        step_totals = FlowTotals(
            edges, direct, input_edges, kept, pairs, empty, None, None
        )
        self._accumulate(step_totals)

    def _accumulate(self, step: FlowTotals) -> None:
        if self.totals is None:
            self.totals = step
            return
        totals = self.totals
        totals.edges += step.edges
        totals.direct += step.direct
        totals.input_edges += step.input_edges
        for name in ("by_position", "by_pair"):
            total, part = getattr(totals, name), getattr(step, name)
            if total is not None:
                total += part


class EffectSums:
    r"""
    What the walk keeps for each edge's own effect to first order,
    ``Δz_u · mean_k ρ_w`` (EAP-IG's product form on the flow's trapezoid
    grid): the first point's writes and the sums of the steps' mean gradients,
    ``(R, T', d)`` over receiver positions and ``(T', d)`` into ``logits``.

    Args:
        bands (list): The receivers' bands and the senders each reads
                    (``_bands``).
    """

    def __init__(self, bands: List[Tuple[slice, int]]) -> None:
        self.bands = bands
        self.first: Optional[Tensor] = None
        self.rho: Optional[Tensor] = None
        self.grad: Optional[Tensor] = None

    def add_final(self, prev: PointState, grad: Tensor, n_receivers: int) -> None:
        r"""Adds a step's mean final gradient ``grad`` ``(T', d)``; on the
        first step, keeps ``prev``'s writes, the path's start."""
        if self.first is None:
            width = grad.shape[-1]
            self.first = prev.writes[0].to(grad.dtype)
            self.rho = grad.new_zeros(n_receivers, *self.first.shape[1:-1], width)
            self.grad = torch.zeros_like(grad)
        assert self.grad is not None
        self.grad += grad

    def add(self, rows: slice, rho: Tensor) -> None:
        r"""Adds a band's mean receiver gradients ``(r, B, T', d)`` of a step,
        summed over the receiver positions ``B``."""
        assert self.rho is not None
        self.rho[rows] += rho.sum(1)

    def effects(self, last: PointState, n_steps: int) -> Tuple[Tensor, Tensor]:
        r"""
        Each edge's own effect: the sender's whole change from the first
        point to ``last`` times the receiver's gradient averaged over the
        ``n_steps`` steps.

        Returns:
            *(Tensor, Tensor)*: ``(R, S)`` and, into ``logits``, ``(S,)``,
            float64 on the CPU.
        """
        assert self.first is not None and self.rho is not None
        assert self.grad is not None
        change = last.writes[0].to(self.first.dtype) - self.first  # (S, T', d)
        edges = torch.zeros(self.rho.shape[0], len(change), dtype=torch.float64)
        for rows, read in self.bands:
            mean = self.rho[rows].flatten(1) / n_steps
            edges[rows, :read] = (mean @ change[:read].flatten(1).T).double().cpu()
        direct = torch.einsum("td,std->s", self.grad / n_steps, change)
        return edges, direct.double().cpu()


#: Bands the receivers' step terms are computed in (at most): a receiver
#: reads only the senders before it, so each band takes its products with the
#: senders its last receiver reads, about half of all ``(R, S)`` products.
BANDS = 8


def _bands(allowed: Tensor, rows: int) -> List[Tuple[slice, int]]:
    """Slices of at most ``rows`` receivers (and about :data:`BANDS` of them),
    each with the number of senders its receivers read (the senders are in
    depth order, so a band reads a prefix of them)."""
    n_receivers = allowed.shape[0]
    size = min(rows, -(-n_receivers // BANDS))
    bands = []
    for first in range(0, n_receivers, size):
        band = slice(first, first + size)
        read = int(allowed[band].any(0).nonzero().max()) + 1
        bands.append((band, read))
    return bands


class _Walk:
    """One pair's walk: its first moving position, its stepper, its previous
    point and the target's values at the points so far."""

    def __init__(self, first: int, stepper: "_Stepper") -> None:
        self.first, self.stepper = first, stepper
        self.prev: Optional[PointState] = None
        self.values: List[Tensor] = []

    def add(self, state: PointState) -> None:
        """Adds the steps to each of ``state``'s points, in order."""
        self.values.append(state.m)
        for j in range(len(state.m)):
            if self.prev is not None:
                self.stepper.add(self.prev, state, j)
            self.prev = _point(state, j)

    def totals(self, length: int, n_steps: int) -> FlowTotals:
        """The walk's sums over every position of the ``length``-token prompt."""
        assert self.stepper.totals is not None and self.prev is not None
        totals = _from_position(self.stepper.totals, self.first, length)
        totals.m = torch.cat(self.values)
        effects = self.stepper.effects.effects(self.prev, n_steps)
        totals.effects, totals.direct_effects = effects
        return totals


def _rows(state: PointState, low: int, n: int, skip: int, split: bool) -> PointState:
    """Points ``low`` to ``low + n`` of ``state`` (one pair's) from ``skip``
    positions further on (the pair's first moving position; ``split``:
    the receivers' gradients are split by position too)."""
    rows = slice(low, low + n)
    rho = state.rho[rows, :, skip:] if split else state.rho[rows]
    return PointState(
        state.m[rows],
        state.grad_final[rows, skip:],
        state.writes[rows, :, skip:],
        rho[..., skip:, :],
    )


def _point(state: PointState, j: int) -> PointState:
    """Point ``j`` of ``state``, copied so that the batch can be freed."""
    return PointState(
        state.m[j : j + 1].clone(),
        state.grad_final[j : j + 1].clone(),
        state.writes[j : j + 1].clone(),
        state.rho[j : j + 1].clone(),
    )
