r"""
The flow engine: the path from a baseline to the prompt, the model at its grid
points, and the edges summed over steps. A function of the model's parts and
checked arguments, so that a path class can call it as well as
:class:`~captum_iglens.attr.flow.probability_flow.ProbabilityFlow`.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.attr.flow.capture import PointState, run_points
from captum_iglens.attr.flow.estimator import STEP_RULES, StepTerms
from captum_iglens.attr.flow.nodes import FlowLayout
from captum_iglens.attr.flow.targets import FlowTarget
from captum_iglens.hf.parts import ModelParts


def check_flow_parts(parts: ModelParts) -> int:
    r"""
    Checks that the model's blocks can be split into heads and MLPs.

    Returns:
        *int*: the number of query heads per block.

    Raises:
        ValueError: If the architecture has no attention output projection,
            no mid-block module or MLP output projection, parallel blocks or
            mixture-of-experts MLPs.
    """
    model_type = getattr(getattr(parts.model, "config", None), "model_type", None)
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
    return parts.n_heads


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
        by_position (Tensor, optional): ``(R, S, T)`` float64, where asked.
        m (Tensor): ``(n_steps + 1,)`` float64: the target at the grid points.
    """

    edges: Tensor
    direct: Tensor
    input_edges: Tensor
    by_position: Optional[Tensor]
    m: Tensor


def _terms(prev: PointState, cur: PointState, i: int, j: int) -> StepTerms:
    """The first-order terms between point ``i`` of ``prev`` and ``j`` of ``cur``."""
    rho = (prev.rho[i] + cur.rho[j]) / 2  # (R, T, d)
    grad = (prev.grad_final[i] + cur.grad_final[j]) / 2  # (T, d)
    dz = cur.writes[j] - prev.writes[i]  # (S, T, d)
    edges = torch.einsum("rtd,std->rst", rho, dz).double()
    direct = torch.einsum("td,std->st", grad, dz).double()
    return StepTerms(edges, direct, float(cur.m[j] - prev.m[i]))


def flow_totals(
    parts: ModelParts,
    input_ids: Tensor,
    base_inputs: Tensor,
    target: FlowTarget,
    layout: FlowLayout,
    *,
    n_steps: int,
    method: str,
    per_position: bool,
    internal_batch_size: int,
) -> FlowTotals:
    r"""
    The edge flows along the straight path of the first block's input from
    ``base_inputs`` to the prompt's, on ``n_steps`` equal steps.

    Args:
        parts (ModelParts): The model's parts (:func:`check_flow_parts`).
        input_ids (Tensor): ``(1, T)`` long: the prompt.
        base_inputs (Tensor): ``(1, T, d)``: the first block's input at the
                    path's start (a counterfactual prompt's, or a baseline).
        target (FlowTarget): What is attributed.
        layout (FlowLayout): The graph's nodes.
        n_steps (int): Steps of the path (``n_steps + 1`` forward and backward
                    passes).
        method (str): ``"prediction_aware"`` or ``"riemann_trapezoid"``
                    (:mod:`~captum_iglens.attr.flow.estimator`).
        per_position (bool): Keep every edge per sender position.
        internal_batch_size (int): Grid points per forward.

    Returns:
        *FlowTotals*.
    """
    step = STEP_RULES[method]
    allowed = layout.allowed()
    prompt_inputs = first_block_inputs(parts, input_ids)
    alphas = torch.linspace(0, 1, n_steps + 1, dtype=torch.float64)
    totals: Optional[FlowTotals] = None
    prev: Optional[PointState] = None
    values: List[Tensor] = []
    for start in range(0, n_steps + 1, internal_batch_size):
        a = alphas[start : start + internal_batch_size].to(prompt_inputs.device)
        a = a.to(prompt_inputs.dtype).view(-1, 1, 1)
        points = base_inputs + a * (prompt_inputs - base_inputs)
        cur = run_points(parts, input_ids, points, target, layout)
        values.append(cur.m)
        for j in range(len(a)):
            if prev is not None:
                edges, direct = step(_terms(prev, cur, -1, j), layout, allowed)
                totals = _add(totals, edges, direct, per_position)
            prev = _point(cur, j)
    assert totals is not None  # n_steps >= 1
    totals.m = torch.cat(values)
    return totals


def _point(state: PointState, j: int) -> PointState:
    return PointState(
        state.m[j : j + 1],
        state.grad_final[j : j + 1],
        state.writes[j : j + 1],
        state.rho[j : j + 1],
    )


def _add(
    totals: Optional[FlowTotals], edges: Tensor, direct: Tensor, per_position: bool
) -> FlowTotals:
    if totals is None:
        return FlowTotals(
            edges=edges.sum(-1),
            direct=direct.clone(),
            input_edges=edges[:, 0].clone(),
            by_position=edges.clone() if per_position else None,
            m=torch.zeros(0),
        )
    totals.edges += edges.sum(-1)
    totals.direct += direct
    totals.input_edges += edges[:, 0]
    if totals.by_position is not None:
        totals.by_position += edges
    return totals
