r"""
A flow graph's tables: its edges and its position pairs as rows, as CSV and as
the text the command line prints.
"""

import csv
import io
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from captum_iglens._utils.output_paths import check_writable
from captum_iglens._utils.serialization import write_atomic
from captum_iglens.graph.model_graph import ModelGraph

#: The columns of the edges' CSV (``effect`` added where the graph has them).
EDGE_COLUMNS = ("edge", "sender", "receiver", "flow", "share")
#: The columns of the position pairs' CSV.
PAIR_COLUMNS = (
    "edge",
    "sender_position",
    "receiver_position",
    "sender_token",
    "receiver_token",
    "flow",
)


def edge_rows(
    graph: ModelGraph,
    flows: np.ndarray,
    kept: np.ndarray,
    effects: Optional[np.ndarray] = None,
) -> List[Dict[str, Any]]:
    r"""
    One row per kept edge, largest ``|flow|`` first
    (:meth:`FlowGraph.edges_table
    <captum_iglens.attr.flow.graph.FlowGraph.edges_table>`).

    Args:

        graph (ModelGraph): The graph's nodes and edges.
        flows (np.ndarray): ``(E,)``: each edge's flow.
        kept (np.ndarray): The indices of the kept edges.
        effects (np.ndarray, optional): ``(E,)``: each edge's own effect.
                    Default: None

    Returns:
        *list[dict]*.
    """
    total = float(np.abs(flows[kept]).sum()) or 1.0
    rows = []
    for i in kept[np.argsort(-np.abs(flows[kept]), kind="stable")]:
        row = dict(
            edge=graph.edges[i],
            sender=graph.senders[graph.edge_senders[i]],
            receiver=graph.receivers[graph.edge_receivers[i]],
            flow=float(flows[i]),
            share=abs(float(flows[i])) / total,
        )
        if effects is not None:
            row["effect"] = float(effects[i])
        rows.append(row)
    return rows


def pair_rows(
    pair_flows: Optional[np.ndarray],
    kept: np.ndarray,
    edges: Sequence[str],
    tokens: Sequence[str],
    top: Optional[int] = None,
) -> List[Dict[str, Any]]:
    r"""
    The kept edges' flows by sender and receiver position, largest ``|flow|``
    first (:meth:`FlowGraph.pairs_table
    <captum_iglens.attr.flow.graph.FlowGraph.pairs_table>`).

    Args:

        pair_flows (np.ndarray, optional): ``(E, T, T)``: the flows by pair.
        kept (np.ndarray): The indices of the kept edges.
        edges (Sequence[str]): The ``E`` edge names.
        tokens (Sequence[str]): The ``T`` prompt tokens.
        top (int, optional): At most this many rows. Default: None (all)

    Returns:
        *list[dict]*.

    Raises:
        ValueError: If ``pair_flows`` is None.
    """
    if pair_flows is None:
        raise ValueError(
            "pair_flows: this graph has none; build it with "
            "receiver_positions=True (CLI: --receiver-positions)"
        )
    pairs = pair_flows[kept]
    flat = pairs.reshape(-1)
    order = np.argsort(-np.abs(flat), kind="stable")
    order = order[flat[order] != 0][:top]
    edge, sender, receiver = np.unravel_index(order, pairs.shape)
    return [
        dict(
            edge=edges[kept[e]],
            sender_position=int(s),
            receiver_position=int(t),
            sender_token=tokens[s],
            receiver_token=tokens[t],
            flow=float(pairs[e, s, t]),
        )
        for e, s, t in zip(edge, sender, receiver)
    ]


def write_csv(
    path: Union[str, Path], rows: List[Dict[str, Any]], columns: Sequence[str]
) -> None:
    r"""
    Writes ``rows`` as CSV with ``columns``, atomically; floats as their
    ``repr``, so that they read back exactly.

    Args:

        path (str or Path): The file to write.
        rows (list[dict]): The rows.
        columns (Sequence[str]): The header.
    """
    path = check_writable(path, "path")
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: repr(v) if isinstance(v, float) else v for k, v in row.items()}
        )
    write_atomic(path, out.getvalue())


def pair_lines(rows: List[Dict[str, Any]]) -> List[str]:
    r"""
    :func:`pair_rows` as text, ``sender@s -> receiver@t`` and the flow, under
    a header line.

    Args:

        rows (list[dict]): The rows.

    Returns:
        *list[str]*.
    """
    lines = [f"{'edge, by position (sender@s -> receiver@t)':<44} {'flow':>12}"]
    for row in rows:
        at = f"@{row['sender_position']}->"
        where = row["edge"].replace("->", at, 1) + f"@{row['receiver_position']}"
        lines.append(f"{where:<44} {row['flow']:>+12.4e}")
    return lines
