r"""
The flow's memory budget: how many path points run at once, and how many
receivers a step's terms are computed for at once, so that a long prompt stays
within ``max_chunk_bytes`` (the budget the layer maps' readout chunks use).

One path point holds, at its peak, what its edges are made of (every sender's
write ``(S, T, d)``, every receiver's gradient ``(R, T, d)`` and ``∇f``) and
what the model's forward keeps for the backward (the eager attention's
``T × T`` scores and probabilities per head, the blocks' hidden states and the
MLPs' inner activations). :func:`point_bytes` estimates it from the model's
shape; :func:`points_at_once` fits the points of one forward in the budget. A
single point is the floor: it may exceed a small budget, since a forward
cannot run on less than one point. A batch of pairs shares the same budget:
:func:`pairs_at_once` puts the whole paths of several pairs in one forward
where it holds them, else one pair's points at a time.

Split by receiver position, a point holds each receiver's gradient ``T`` times
(one per position of its output) and the graph ``R × S × T × T`` flows: that
is bounded by the memory the machine has available
(:func:`~captum_iglens.attr.flow.pair_memory.check_pair_memory`), not by the
budget, since it is the result.
"""

from typing import Optional, Tuple

from captum_iglens.attr._utils.block_parts import projection_weight
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.hf.parts import ModelParts

#: ``T × T`` float32 arrays per query head and block that the eager attention
#: keeps for the backward (scores, masked scores, probabilities).
ATTENTION_ARRAYS = 3
#: ``(T, d)`` arrays per block the forward keeps (norm inputs and outputs,
#: queries, keys and values expanded per query head, projections, the
#: residual sums).
HIDDEN_ARRAYS = 14
#: ``(T, I)`` arrays per block of the MLP's inner width ``I`` (gate, up, the
#: activation, their product).
MLP_ARRAYS = 4


def point_bytes(
    parts: ModelParts, graph: ModelGraph, length: int, pairs: bool = False
) -> int:
    r"""
    Estimated bytes one path point of a ``length``-token prompt holds at its
    peak: its kept state and its forward's activations.

    Args:
        parts (ModelParts): The model's parts (checked by
                    :func:`~captum_iglens.attr.flow.engine.flow_graph_of`).
        graph (ModelGraph): The graph's nodes.
        length (int): The prompt's tokens ``T``.
        pairs (bool, optional): Gradients split by receiver position.
                    Default: False

    Returns:
        *int*.
    """
    assert parts.mlp_out is not None
    inner = projection_weight(parts.mlp_out[0]).shape[1]
    size = next(parts.blocks[0].parameters()).element_size()
    width = projection_weight(parts.mlp_out[0]).shape[0]
    split = length if pairs else 1
    nodes = len(graph.senders) + (len(graph.receivers) - 1) * split + 1
    kept = nodes * length * width * size
    attention = ATTENTION_ARRAYS * graph.n_heads * length * length * 4
    hidden = (HIDDEN_ARRAYS * width + MLP_ARRAYS * inner) * length * size
    # with pairs, one block's backward batched over the query positions
    reads = graph.n_heads * len(graph.kinds) * length * width * size
    batched = split * (attention + reads) if pairs else 0
    return kept + graph.n_layers * (attention + hidden) + batched


def points_at_once(
    point: int, n_points: int, internal_batch_size: Optional[int], budget: int
) -> int:
    r"""
    The path points of one forward: ``internal_batch_size`` where given (one
    point always fits; more must fit the budget), else as many as fit the
    budget, at least one and at most ``n_points``.

    Args:
        point (int): Bytes of one point (:func:`point_bytes`).
        n_points (int): The path's points, ``n_steps + 1``.
        internal_batch_size (int, optional): The caller's choice.
        budget (int): ``max_chunk_bytes``.

    Returns:
        *int*.

    Raises:
        ValueError: If ``internal_batch_size`` points do not fit the budget.
    """
    most = max(1, budget // point)
    if internal_batch_size is None:
        return min(most, n_points)
    if internal_batch_size > most:
        raise ValueError(
            f"internal_batch_size: {internal_batch_size} path points need about "
            f"{internal_batch_size * point / 2**20:,.0f} MiB, over max_chunk_bytes "
            f"{budget / 2**20:g} MiB, which holds {most}; give a smaller "
            "internal_batch_size (or None, chosen from the budget) or a larger "
            "max_chunk_bytes"
        )
    return internal_batch_size


def pairs_at_once(points: int, n_points: int, n_pairs: int) -> Tuple[int, int]:
    r"""
    How the paths of ``n_pairs`` pairs are cut into forwards of at most
    ``points`` path points: the whole paths of as many pairs as it holds,
    else one pair at a time in chunks of ``points`` (as the pair runs alone).

    Args:
        points (int): Path points per forward (:func:`points_at_once`).
        n_points (int): Each path's points, ``n_steps + 1``.
        n_pairs (int): The pairs ``B``.

    Returns:
        2-element tuple of the pairs whose points share a forward and each
        one's points per forward.
    """
    together = max(1, min(n_pairs, points // n_points))
    return together, min(n_points, points // together)


def receivers_at_once(
    graph: ModelGraph, length: int, width: int, budget: int, split: int = 1
) -> int:
    r"""
    Receivers whose step terms are computed at once: per receiver, its mean
    gradient ``(split, T, d)`` and its terms with every sender at every
    position ``(S, T, split)``, in float32 and in float64 (``split``: 1, or
    ``T`` by receiver position).

    Returns:
        *int*, at least one.
    """
    per_row = split * length * (2 * width * 4 + len(graph.senders) * (4 + 8))
    return max(1, budget // per_row)
