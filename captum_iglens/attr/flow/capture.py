r"""
One forward and one backward of the whole model at a batch of path points,
keeping what the flow's edges are made of: every node's write to the residual
stream and every receiver's node-input gradient.

At each point the model runs on the prompt's tokens with the first block's
input replaced by the interpolated one. Every attention module runs through an
attention implementation of ours (:data:`FLOW_IMPLEMENTATION`): it calls the eager
attention function of the module's own family with the key-value groups
expanded to one per query head, so that the gradient of each query head's keys
and values is its own (the model keeps its grouped weights; nothing is
ungrouped). Then, per block, the gradient through a head's query, key or value
read alone is carried back to the block's input by one batched vector-Jacobian
product through the graph of that forward (the input norm, the projection, the
family's query/key norm and rotary embedding). The gradient through the MLP
alone comes with the backward itself: the block's output is the mid-block
state plus the MLP's write, so it is the gradient at the mid-block state minus
the gradient at the block's output.

Split by receiver position (``pairs``), a head's gradient is taken through its
output at one query position ``t`` at a time: the gradient at the heads' output
is masked to ``t`` and carried back through the attention by one
vector-Jacobian product batched over ``t`` (a head at ``t`` reads the stream at
every position ``s ≤ t`` through its keys and values). An MLP reads the stream
at its own position only.
"""

import inspect
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from captum_iglens.attr._utils.attention import (
    _SWITCH,
    _configs,
    _family_eager,
    attention_of,
)
from captum_iglens.attr._utils.block_parts import output_factors, projection_weight
from captum_iglens.attr._utils.capture import _lock_of, hidden_of
from captum_iglens.attr.flow.head_reads import (
    PROJECTIONS,
    batched_head_reads,
    projections_of,
    split_head_reads,
)
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.graph.target import Target, rows_metric
from captum_iglens.hf.parts import ModelParts

#: The name our attention implementation is registered under.
FLOW_IMPLEMENTATION = "captum_iglens_flow"

_RECORDS: "weakref.WeakKeyDictionary[Module, Dict[str, Tensor]]" = (
    weakref.WeakKeyDictionary()
)
_REGISTER = threading.Lock()


class _Ungrouped:
    """The attention module as the eager function sees it, with one key-value
    head per query head (the keys and values it gets are expanded already)."""

    num_key_value_groups = 1

    def __init__(self, module: Module) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _flow_attention(
    module: Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    *args: Any,
    **kwargs: Any,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The family's eager attention on keys and values expanded per query head
    (head ``h`` reads group ``h // groups``, as ``repeat_kv`` orders them)."""
    groups = query.shape[1] // key.shape[1]
    key_rep = key.repeat_interleave(groups, dim=1)
    value_rep = value.repeat_interleave(groups, dim=1)
    record = _RECORDS.get(module)
    if record is not None:
        record.update(query=query, key=key, value=value, key_rep=key_rep)
        record["value_rep"] = value_rep
    eager = _family_eager(module)
    output, _ = eager(
        _Ungrouped(module), query, key_rep, value_rep, attention_mask, *args, **kwargs
    )
    return output, None


def _register() -> None:
    with _REGISTER:
        ALL_ATTENTION_FUNCTIONS.register(FLOW_IMPLEMENTATION, _flow_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(FLOW_IMPLEMENTATION, eager_mask)


@dataclass
class PointState:
    r"""
    What one batch of ``P`` path points leaves for the edges, at the
    ``T' = T − f`` positions from the first kept one ``f`` on.

    Args:
        m (Tensor): ``(P,)`` float64: the target at each point.
        grad_final (Tensor): ``(P, T', d)``: ``∇f``, the gradient of ``m``
                    with respect to the last block's output.
        writes (Tensor): ``(P, S, T', d)``: each sender's write to the stream
                    (:attr:`~captum_iglens.graph.model_graph.ModelGraph.senders` order).
        rho (Tensor): ``(P, R, B, T', d)``: each receiver's node-input
                    gradient with respect to the stream it reads
                    (:attr:`~captum_iglens.graph.model_graph.ModelGraph.receivers`
                    order); ``B = 1``, or split by receiver position,
                    ``B = T'``: row ``b`` through the receiver's output at
                    position ``f + b`` alone.
    """

    m: Tensor
    grad_final: Tensor
    writes: Tensor
    rho: Tensor


class _Hooks:
    """Owned hooks; exactly these handles are removed on exit."""

    def __init__(self) -> None:
        self.handles: List[RemovableHandle] = []
        self.seen: Dict[Tuple[str, int], Tensor] = {}

    def keep_input(self, module: Module, name: str, index: int) -> None:
        def hook(_: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            self.seen[name, index] = hidden_of(None, args, kwargs)

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def keep_output(self, module: Module, name: str, index: int) -> None:
        def hook(_: Module, args: Any, output: Any) -> None:
            self.seen[name, index] = hidden_of(output)

        self.handles.append(module.register_forward_hook(hook))

    def replace_input(self, module: Module, hidden: Tensor) -> None:
        def hook(
            _: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
        ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@contextmanager
def _flow_forward(parts: ModelParts, hooks: _Hooks) -> Iterator[List[Module]]:
    """Switches the model to :data:`FLOW_IMPLEMENTATION` and records each attention
    module's query, keys and values; restores everything on exit."""
    attn_out = parts.attn_out
    assert attn_out is not None  # checked by flow_graph_of
    attentions = [attention_of(b, o) for b, o in zip(parts.blocks, attn_out)]
    _register()
    with _lock_of(parts.blocks[0]), _SWITCH:
        saved = [(c, c._attn_implementation_internal) for c in _configs([parts.model])]
        try:
            for config, _ in saved:
                config._attn_implementation_internal = FLOW_IMPLEMENTATION
            for module in attentions:
                _RECORDS[module] = {}
            yield attentions
        finally:
            hooks.remove()
            for module in attentions:
                _RECORDS.pop(module, None)
            for config, value in reversed(saved):
                config._attn_implementation_internal = value


def _install(
    parts: ModelParts, hooks: _Hooks, first_input: Tensor, attentions: List[Module]
) -> None:
    hooks.replace_input(parts.blocks[0], first_input)
    assert parts.mid is not None and parts.mlp_out is not None
    for layer, block in enumerate(parts.blocks):
        projections = projections_of(attentions[layer])
        if projections is not None:  # the split path of head_reads
            hooks.keep_input(attentions[layer], "x", layer)
            for name, projection in zip(PROJECTIONS, projections):
                hooks.keep_output(projection, name, layer)
        hooks.keep_input(block, "in", layer)
        hooks.keep_output(block, "out", layer)
        hooks.keep_input(parts.mid[layer], "mid", layer)
        hooks.keep_input(_listed(parts.attn_out)[layer], "heads", layer)


def _listed(modules: Optional[List[Module]]) -> List[Module]:
    assert modules is not None
    return modules


def run_points(
    parts: ModelParts,
    input_ids: Tensor,
    first_inputs: Tensor,
    targets: Sequence[Target],
    graph: ModelGraph,
    first: int = 0,
    split: bool = False,
) -> PointState:
    r"""
    The model at ``P`` path points: one forward, one backward and one batched
    vector-Jacobian product per block for its heads.

    Args:
        parts (ModelParts): The model's parts (checked by
                    :func:`~captum_iglens.attr.flow.engine.flow_graph_of`).
        input_ids (Tensor): ``(P, T)`` long: each point's prompt tokens (or
                    ``(1, T)``, one prompt for every point).
        first_inputs (Tensor): ``(P, T, d)``: the first block's input at each
                    point.
        targets (Sequence[Target]): Each point's target ``m``, of one kind
                    and position; the model computes the logits of that
                    position only (``logits_to_keep``).
        graph (ModelGraph): The graph's nodes.
        first (int, optional): The first position kept: the writes and
                    gradients are those of positions ``first`` to ``T − 1``
                    (``T' = T − first`` of them). Default: 0
        split (bool, optional): Split each receiver's gradient by the position
                    of its output (from ``first`` on). Default: False

    Returns:
        *PointState*. No hook stays on the model.
    """
    h0 = first_inputs.detach().clone().requires_grad_(True)
    m, grad_final, rho, seen = _gradients(
        parts, input_ids, h0, targets, graph, first, split
    )
    # the forward's graph is freed here, before the writes are gathered
    writes = _writes(parts, graph, seen, h0, first)
    return PointState(m=m, grad_final=grad_final, writes=writes, rho=rho)


def _gradients(
    parts: ModelParts,
    input_ids: Tensor,
    h0: Tensor,
    targets: Sequence[Target],
    graph: ModelGraph,
    first: int,
    split: bool,
) -> Tuple[Tensor, Tensor, Tensor, Dict[Tuple[str, int], Tensor]]:
    """The forward and backward of :func:`run_points`: ``m``, ``∇f``, the
    receivers' gradients and the detached states the writes are made of."""
    hooks = _Hooks()
    ids = input_ids.expand(h0.shape[0], -1)
    with torch.enable_grad(), _flow_forward(parts, hooks) as attentions:
        _install(parts, hooks, h0, attentions)
        logits = target_logits(parts, ids, targets[0].position)
        m = rows_metric(targets, logits)
        records = [_RECORDS[a] for a in attentions]
        seen = hooks.seen
        hooks.remove()
        n = graph.n_layers
        wanted = (
            [seen["out", n - 1]]
            + [r[name] for r in records for name in ("query", "key_rep", "value_rep")]
            + [seen[name, layer] for name in ("mid", "out") for layer in range(n)]
            + ([seen["heads", layer] for layer in range(n)] if split else [])
        )
        grads = torch.autograd.grad(m.sum(), wanted, retain_graph=True)
        reads = [
            _by_query_position(seen["heads", layer], r, grads[1 + 5 * n + layer], first)
            if split
            else tuple(g.unsqueeze(0) for g in grads[1 + 3 * layer : 4 + 3 * layer])
            for layer, r in enumerate(records)
        ]
        # the gradient through the MLP alone: the block's output is the
        # mid-block state plus the MLP's write
        at_mid, at_out = grads[1 + 3 * n : 1 + 4 * n], grads[1 + 4 * n : 1 + 5 * n]
        mlps = [(mid - out)[:, first:] for mid, out in zip(at_mid, at_out)]
        rho = _receiver_gradients(
            graph, seen, records, attentions, reads, mlps, first, split
        )
    states = {
        key: value.detach()
        for key, value in seen.items()
        if key[0] in ("heads", "in", "mid", "out")
    }
    return m.detach().double(), grads[0][:, first:].detach(), rho, states


def target_logits(parts: ModelParts, ids: Tensor, position: int) -> Tensor:
    """The logits ``(P, V)`` at ``position``: the model computes that row only
    where its forward takes ``logits_to_keep``."""
    kwargs: Dict[str, Any] = {}
    if "logits_to_keep" in inspect.signature(parts.model.forward).parameters:
        kwargs["logits_to_keep"] = torch.tensor([position], device=ids.device)
        position = -1
    return parts.model(input_ids=ids, use_cache=False, **kwargs).logits[:, position]


def _by_query_position(
    heads: Tensor, record: Dict[str, Tensor], grad: Tensor, first: int
) -> Tuple[Tensor, ...]:
    """The gradients at the queries and the expanded keys and values
    ``(T − first, P, H, T, e)`` through the heads' output ``heads``
    ``(P, T, H · e)`` at each query position from ``first`` on alone
    (``grad``: the gradient at that output)."""
    length = grad.shape[1]
    at = torch.eye(length, dtype=grad.dtype, device=grad.device)[first:]
    upstream = at[:, None, :, None] * grad.unsqueeze(0)  # (T − first, P, T, H · e)
    reads = [record["query"], record["key_rep"], record["value_rep"]]
    return torch.autograd.grad(
        heads, reads, upstream, retain_graph=True, is_grads_batched=True
    )


def _receiver_gradients(
    graph: ModelGraph,
    seen: Dict[Tuple[str, int], Tensor],
    records: List[Dict[str, Tensor]],
    attentions: List[Module],
    head_grads: List[Tuple[Tensor, ...]],
    mlp_grads: List[Tensor],
    first: int,
    split: bool,
) -> Tensor:
    """``(P, R, B, T', d)``: per block, each head's reads (through its query,
    key and value alone), then the MLP's (through the MLP alone), at the
    positions from ``first`` on; ``B`` is the batch of ``head_grads`` (1, or
    one per query position from ``first`` on, with ``split``)."""
    n = graph.n_layers
    rho: Optional[Tensor] = None
    per_block = graph.n_heads * len(graph.kinds) + 1
    for layer in range(n):
        record = records[layer]
        reads = [record["query"], record["key"], record["value"]]
        upstream = head_grads[layer]
        projections = projections_of(attentions[layer])
        if projections is None:
            per_head = batched_head_reads(
                reads, seen["in", layer], upstream, graph.qkv, first
            )
        else:
            names = ("in", "x", *PROJECTIONS)
            mine = {name: seen[name, layer] for name in names}
            per_head = split_head_reads(
                reads, mine, projections, upstream, graph.qkv, first
            )
        if rho is None:  # (P, R, B, T', d), filled block by block
            b, p, t, d = per_head.shape[1:]
            rho = per_head.new_empty(p, n * per_block, b, t, d)
        row = layer * per_block
        rho[:, row : row + per_block - 1] = per_head.permute(2, 0, 1, 3, 4).detach()
        mlp = mlp_grads[layer].detach()
        if not split:
            rho[:, row + per_block - 1, 0] = mlp
        else:  # an MLP at position t reads the stream at t alone
            diagonal = torch.diag_embed(mlp.transpose(1, 2))  # (P, d, T', T')
            rho[:, row + per_block - 1] = diagonal.permute(0, 2, 3, 1)
    assert rho is not None
    return rho


@torch.no_grad()
def _writes(
    parts: ModelParts,
    graph: ModelGraph,
    seen: Dict[Tuple[str, int], Tensor],
    h0: Tensor,
    first: int,
) -> Tensor:
    r"""``(P, S, T', d)``, at the positions from ``first`` on: the embeddings;
    per block each head's write (its slice of the output projection, times the
    post-norm's factor held at its real value where the family normalises the
    attention output) and the MLP's (the block's output minus the mid-block
    state)."""
    attn_out = _listed(parts.attn_out)
    seen = {key: value[:, first:] for key, value in seen.items()}
    h0 = h0[:, first:]
    p, t, d = h0.shape
    per_block = graph.n_heads + 1
    out = h0.new_empty(p, 1 + graph.n_layers * per_block, t, d)
    out[:, 0] = h0.detach()
    for layer in range(graph.n_layers):
        heads_in = seen["heads", layer]
        weight = projection_weight(attn_out[layer]).detach()
        per_head = torch.einsum(
            "pthe,dhe->phtd",
            heads_in.view(p, t, graph.n_heads, -1),
            weight.view(d, graph.n_heads, -1).to(heads_in.dtype),
        )
        h_in, mid = seen["in", layer], seen["mid", layer]
        norms = [parts.attn_norm[layer]] if parts.attn_norm else None
        factor = output_factors(
            norms,
            parts.attn_scale,
            per_head.sum(1).unsqueeze(2).float(),
            (mid - h_in).unsqueeze(2).float(),
        )
        row = 1 + layer * per_block
        heads = per_head * factor[:, :, 0].unsqueeze(1).to(per_head.dtype)
        out[:, row : row + graph.n_heads] = heads
        out[:, row + graph.n_heads] = seen["out", layer] - mid
    return out
