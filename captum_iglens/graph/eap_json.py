r"""
EAP-IG's graph file (``Graph.to_json`` / ``Graph.from_json``), the circuit
file MIB's circuit-localization track evaluates, read and written against a
:class:`~captum_iglens.graph.model_graph.ModelGraph`.

The file is one JSON object:

- ``cfg``: ``n_layers``, ``n_heads``, ``parallel_attn_mlp`` and ``d_model``;
- ``nodes``: ``{name: {"in_graph": bool}}``, every node of the graph;
- ``edges``: ``{"{sender}->{receiver}": {"score": float, "in_graph": bool}}``,
  every edge, a head's reads named ``a{l}.h{h}<q>``, ``<k>``, ``<v>``.

EAP-IG's graph always has separate query, key and value receivers, and one
per query head: with grouped key/value heads, ``a{l}.h{h}<k>`` is query head
``h``'s own read of the keys (through its group's projection), as
TransformerLens' split inputs repeat the key/value heads per query head.
"""

import json
import math
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from captum_iglens.graph.model_graph import ModelGraph

PathLike = Union[str, Path]


def eap_document(
    graph: ModelGraph,
    d_model: int,
    scores: np.ndarray,
    in_graph: Optional[np.ndarray] = None,
) -> Dict[str, Any]:
    r"""
    A graph's scores and circuit as EAP-IG's JSON object.

    Args:
        graph (ModelGraph): The model's graph, with ``qkv``.
        d_model (int): The residual stream's width (EAP-IG's reader needs it).
        scores (np.ndarray): ``(E,)``: each edge's score, in the graph's edge
                    order.
        in_graph (np.ndarray, optional): ``(E,)`` bool: the circuit's edges.
                    Default: None (every edge)

    Returns:
        *dict*: ``cfg``, ``nodes`` (a node is in the graph where one of its
        edges is) and ``edges``.

    Raises:
        ValueError: If the graph's reads are not separate, or an array has
            another length.
    """
    if not graph.qkv:
        raise ValueError(
            "qkv: EAP-IG's graph has separate query, key and value receivers; "
            "build the graph with qkv=True (CLI: --qkv)"
        )
    kept = np.ones(graph.n_edges, bool) if in_graph is None else in_graph
    for name, array in (("scores", scores), ("in_graph", kept)):
        if np.shape(array) != (graph.n_edges,):
            raise ValueError(
                f"{name}: expected ({graph.n_edges},), got {np.shape(array)}"
            )
    node_kept = np.zeros(len(graph.nodes), bool)
    node_kept[graph.edge_senders[kept]] = True
    node_kept[graph.receiver_node[graph.edge_receivers[kept]]] = True
    return {
        "cfg": {
            "n_layers": graph.n_layers,
            "n_heads": graph.n_heads,
            "parallel_attn_mlp": graph.parallel,
            "d_model": d_model,
        },
        "nodes": {
            name: {"in_graph": bool(flag)} for name, flag in zip(graph.nodes, node_kept)
        },
        "edges": {
            name: {"score": float(score), "in_graph": bool(flag)}
            for name, score, flag in zip(graph.edges, scores.tolist(), kept.tolist())
        },
    }


def read_eap_json(
    path: PathLike, graph: ModelGraph, d_model: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray]:
    r"""
    Reads an EAP-IG graph file for a model, refusing any mismatch by field.

    Args:
        path (str or Path): The file.
        graph (ModelGraph): The model's graph (its ``qkv`` is ignored: the
                    file's receivers are always separate).
        d_model (int, optional): The model's width, checked against
                    ``cfg.d_model`` where given. Default: None

    Returns:
        2-element tuple of **scores** ``(E,)`` float64 and **in_graph**
        ``(E,)`` bool, in the order of the graph with ``qkv``.

    Raises:
        ValueError: Naming the file and the field: not a JSON object, a
            ``cfg`` of another model (layers, heads, parallel blocks, width),
            edges missing or extra, a score that is not a finite number or an
            ``in_graph`` that is not a bool.
    """
    where = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: not a readable JSON file ({error})") from None
    if not isinstance(data, dict) or not {"cfg", "edges"} <= set(data):
        raise ValueError(f"{where}: expected EAP-IG's object with 'cfg' and 'edges'")
    expected = dict(
        n_layers=graph.n_layers,
        n_heads=graph.n_heads,
        parallel_attn_mlp=graph.parallel,
    )
    if d_model is not None:
        expected["d_model"] = d_model
    cfg = data["cfg"] if isinstance(data["cfg"], dict) else {}
    for key, value in expected.items():
        if cfg.get(key) != value:
            raise ValueError(
                f"{where}: cfg.{key} is {cfg.get(key)!r}, but the model has {value!r}"
            )
    full = ModelGraph(
        graph.n_layers, graph.n_heads, True, graph.n_kv_heads, graph.parallel
    )
    return _edges(data["edges"], full, where)


def _edges(edges: Any, graph: ModelGraph, where: str) -> Tuple[np.ndarray, np.ndarray]:
    """The scores and ``in_graph`` flags of every edge of ``graph``."""
    if not isinstance(edges, dict):
        raise ValueError(f"{where}: 'edges' is not an object")
    positions = graph.edge_positions(edges, where)
    scores = np.empty(graph.n_edges)
    kept = np.empty(graph.n_edges, bool)
    for position, (name, entry) in zip(positions, edges.items()):
        score = entry.get("score") if isinstance(entry, dict) else None
        flag = entry.get("in_graph", True) if isinstance(entry, dict) else None
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise ValueError(f"{where}: edges[{name!r}].score is not a number")
        if not math.isfinite(score):
            raise ValueError(f"{where}: edges[{name!r}].score is not finite")
        if not isinstance(flag, bool):
            raise ValueError(f"{where}: edges[{name!r}].in_graph is not a bool")
        scores[position], kept[position] = score, flag
    return scores, kept
