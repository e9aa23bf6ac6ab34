r"""
:class:`FlowGraph`, the result of the probability flow: edges between the
model's nodes whose flows add up exactly to the change of the target, with
:data:`FLOW_SCHEMA`, the declaration its files are loaded with.

Node and edge names follow EAP-IG and MIB (:mod:`captum_iglens.attr.flow.nodes`):
``input``, ``a{l}.h{h}``, ``m{l}``, ``logits``; an edge is
``"{sender}->{receiver}"``, with a head's reads ``a{l}.h{h}<q>``, ``<k>``,
``<v>`` as receivers where queries, keys and values were asked separately.
:meth:`FlowGraph.edge_scores` gives the plain ``{edge: flow}`` dictionary that
circuit tools score.
"""

import csv
import io
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from captum_iglens._utils.schema import (
    Array,
    Either,
    Integer,
    Json,
    ListOf,
    Maybe,
    Number,
    Record,
    Text,
    Texts,
)
from captum_iglens._utils.serialization import (
    JsonDocument,
    check_writable,
    plain,
    write_atomic,
)
from captum_iglens.viewer import Viewable
from captum_iglens.viewer._graph import graph_page

#: What a :class:`FlowGraph` holds: ``N`` nodes, ``E`` edges, ``T`` positions.
FLOW_SCHEMA = Record(
    nodes=Texts("N", nonempty=True),
    edges=Texts("E"),
    flows=Array("float", "E", numpy=True),
    tokens=Texts("T", nonempty=True),
    input_flows=Array("float", "T", numpy=True),
    position_flows=Maybe(Array("float", "E", "T", numpy=True)),
    pair_flows=Maybe(Array("float", "E", "T", "T", numpy=True)),
    counterfactual=Either(
        Record(kind=Text(("prompt",)), tokens=Texts("T")),
        Record(
            kind=Text(("subject_noise",)),
            subject=Text(nonempty=True),
            positions=ListOf(Integer(), nonempty=True),
            noise_scale=Number(low=0),
            noise_std=Number(low=0),
            seed=Integer(),
        ),
        Record(kind=Text(("pad", "mean", "tensor"))),
    ),
    settings=Json(),
    m_prompt=Number(),
    m_base=Number(),
    completeness_error=Number(low=0),
    conservation_error=Number(low=0),
)
#: The ways :meth:`FlowGraph.prune` keeps edges.
PRUNE_BY = ("share", "top")

#: The columns of :meth:`FlowGraph.to_csv`'s tables.
_EDGE_COLUMNS = ("edge", "sender", "receiver", "flow", "share")
_PAIR_COLUMNS = (
    "edge",
    "sender_position",
    "receiver_position",
    "sender_token",
    "receiver_token",
    "flow",
)


def edge_ends(edge: str) -> Tuple[str, str]:
    r"""The sender and receiver *nodes* of an edge name (a head's read,
    ``a0.h1<q>``, is the head ``a0.h1``); a name with another ``->`` keeps it
    in its receiver, which is then no node."""
    sender, _, receiver = edge.partition("->")
    return sender, receiver.partition("<")[0]


_BLOCK_NODE = re.compile(r"^(a|m)(\d+)(\.h\d+)?$")


def node_depth(node: str) -> float:
    r"""
    Where a node sits in the residual stream: ``input`` 0, the heads of block
    ``l`` ``2l + 1``, its MLP ``2l + 2``, ``logits`` infinity. A node reads what
    the nodes of smaller depth wrote; the stream after block ``l`` lies between
    depths ``2l + 2`` and ``2l + 3``.

    Raises:
        ValueError: For a name that is not a flow graph's node.
    """
    if node in ("input", "logits"):
        return 0.0 if node == "input" else math.inf
    found = _BLOCK_NODE.match(node)
    if found is None or (found.group(1) == "a") != bool(found.group(3)):
        raise ValueError(f"nodes: {node!r} is not a node of a flow graph")
    layer = int(found.group(2))
    return 2.0 * layer + (1 if found.group(1) == "a" else 2)


@dataclass
class FlowGraph(JsonDocument, Viewable):
    r"""
    A probability-flow graph: what each edge carried of the change of the
    target ``Δm = m(prompt) − m(base)``.

    The flows into ``logits`` add up to ``Δm`` and, at every other node but
    ``input``, the flows in add up to the flows out (with the exact estimator,
    to float rounding: ``completeness_error``, ``conservation_error``).
    The flows out of ``input`` are Integrated Gradients on the embeddings,
    per position in ``input_flows``. ``to_html`` writes the viewer's graph
    page (Jupyter shows it inline).

    Args:
        nodes (list[str]): ``N`` node names, ``input`` first, ``logits`` last.
        edges (list[str]): ``E`` edge names ``"{sender}->{receiver}"``.
        flows (ndarray): ``(E,)`` float64: each edge's flow, summed over
                    positions.
        tokens (list[str]): ``T`` prompt tokens (text, or ids as text).
        input_flows (ndarray): ``(T,)`` float64: the flow out of ``input``
                    at each position.
        position_flows (ndarray, optional): ``(E, T)`` float64: each edge's
                    flow by the position where its sender wrote it (where
                    asked). Default: None
        pair_flows (ndarray, optional): ``(E, T, T)`` float64, ``[e, s, t]``:
                    each edge's flow by the position ``s`` where its sender
                    wrote it and the position ``t`` of the receiver's output
                    (a head at ``t`` reads every ``s ≤ t``, an MLP its own
                    position, ``logits`` the attributed one); it adds up over
                    ``t`` to ``position_flows`` (where asked). Default: None
        counterfactual (dict): The path's start: ``kind`` (``"prompt"``,
                    ``"subject_noise"``, ``"pad"``, ``"mean"`` or
                    ``"tensor"``); for a prompt its ``tokens``, for a noised
                    subject its ``subject``, ``positions``, ``noise_scale``,
                    ``noise_std`` and ``seed``.
        settings (dict): ``method``, ``n_steps``, ``qkv``, ``target_kind``,
                    ``target``, ``foil``, ``position``, ``model`` (and
                    ``pruned``, on a pruned graph).
        m_prompt (float): ``m`` on the prompt.
        m_base (float): ``m`` at the path's start.
        completeness_error (float): ``|Σ_u F(u→logits) − Δm|`` of the whole
                    graph.
        conservation_error (float): The largest ``|inflow − outflow|`` over
                    the nodes of the whole graph.
    """

    KIND = "flow_graph"

    nodes: List[str]
    edges: List[str]
    flows: np.ndarray
    tokens: List[str]
    input_flows: np.ndarray
    counterfactual: Dict[str, Any]
    settings: Dict[str, Any]
    m_prompt: float
    m_base: float
    completeness_error: float
    conservation_error: float
    position_flows: Optional[np.ndarray] = None
    pair_flows: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        FLOW_SCHEMA.check({f.name: getattr(self, f.name) for f in fields(self)})
        known = set(self.nodes)
        for edge in self.edges:
            sender, receiver = edge_ends(edge)
            if sender not in known or receiver not in known:
                raise ValueError(f"edges: {edge!r} does not join two of the nodes")
        if self.pair_flows is not None:
            self._check_pairs(self.pair_flows, self.position_flows)

    @staticmethod
    def _check_pairs(pairs: np.ndarray, by_sender: Optional[np.ndarray]) -> None:
        """The flows by position pair add up to the flows by sender position."""
        if by_sender is None:
            raise ValueError(
                "pair_flows: given without position_flows, which they add up to"
            )
        gap = float(np.abs(pairs.sum(-1) - by_sender).max(initial=0.0))
        scale = float(np.abs(by_sender).max(initial=0.0))
        if gap > 1e-9 * max(scale, 1e-12):
            raise ValueError(
                f"pair_flows: they add up over the receiver's positions to "
                f"position_flows only within {gap:.3g}; the file is inconsistent"
            )

    @property
    def delta_m(self) -> float:
        """``Δm = m_prompt − m_base``."""
        return self.m_prompt - self.m_base

    # ------------------------------------------------------------- plain data

    def edge_scores(self) -> Dict[str, float]:
        r"""
        The flow of each edge, summed over positions, keyed by its EAP-IG/MIB
        name: the plain dictionary a circuit harness ranks and patches
        (``|F|`` ranks edges as EAP-IG's scores do).

        Returns:
            *dict[str, float]*: ``{"{sender}->{receiver}": flow}``.

        Examples::

            >>> scores = graph.edge_scores()
            >>> scores["a3.h1->logits"], scores["input->a0.h2<v>"]
        """
        return {edge: float(flow) for edge, flow in zip(self.edges, self.flows)}

    def node_flows(self) -> Dict[str, Tuple[float, float]]:
        r"""
        Returns:
            *dict[str, tuple[float, float]]*: per node, its inflow and outflow
            over this graph's edges.
        """
        into = {node: 0.0 for node in self.nodes}
        out = dict(into)
        for edge, flow in zip(self.edges, self.flows):
            sender, receiver = edge_ends(edge)
            out[sender] += float(flow)
            into[receiver] += float(flow)
        return {node: (into[node], out[node]) for node in self.nodes}

    def edges_table(self) -> List[Dict[str, Any]]:
        r"""
        One row per edge, largest ``|flow|`` first: ``edge``, ``sender``,
        ``receiver`` (the receiving node or head read), ``flow`` and
        ``share`` (of the graph's total ``|flow|``).

        Returns:
            *list[dict]*.
        """
        total = float(np.abs(self.flows).sum()) or 1.0
        order = np.argsort(-np.abs(self.flows), kind="stable")
        rows = []
        for i in order:
            sender, receiver = self.edges[i].split("->")
            flow = float(self.flows[i])
            rows.append(
                dict(
                    edge=self.edges[i],
                    sender=sender,
                    receiver=receiver,
                    flow=flow,
                    share=abs(flow) / total,
                )
            )
        return rows

    def pairs_table(self, top: Optional[int] = None) -> List[Dict[str, Any]]:
        r"""
        The flows by sender and receiver position, largest ``|flow|`` first:
        one row per edge and position pair that carried any, ``edge``,
        ``sender_position`` ``s``, ``receiver_position`` ``t``, their tokens
        ``sender_token`` and ``receiver_token``, and ``flow``.

        Args:
            top (int, optional): At most this many rows. Default: None (all)

        Returns:
            *list[dict]*.

        Raises:
            ValueError: If the graph has no ``pair_flows`` (build it with
                ``receiver_positions=True``).

        Examples::

            >>> graph = flow.attribute(prompt, counterfactual=other,
            ...                        receiver_positions=True)
            >>> graph.pairs_table(top=5)[0]["receiver_token"]
        """
        if self.pair_flows is None:
            raise ValueError(
                "pair_flows: this graph has none; build it with "
                "receiver_positions=True (CLI: --receiver-positions)"
            )
        flat = self.pair_flows.reshape(-1)
        order = np.argsort(-np.abs(flat), kind="stable")
        order = order[flat[order] != 0][:top]
        edge, sender, receiver = np.unravel_index(order, self.pair_flows.shape)
        return [
            dict(
                edge=self.edges[e],
                sender_position=int(s),
                receiver_position=int(t),
                sender_token=self.tokens[s],
                receiver_token=self.tokens[t],
                flow=float(self.pair_flows[e, s, t]),
            )
            for e, s, t in zip(edge, sender, receiver)
        ]

    def to_csv(self, path: Union[str, Path], pairs: bool = False) -> None:
        r"""
        Writes :meth:`edges_table` as CSV, atomically; with ``pairs``,
        :meth:`pairs_table` instead (every edge and position pair that carried
        flow).

        Args:
            path (str or Path): The file to write.
            pairs (bool, optional): Write the flows by sender and receiver
                        position. Default: False

        Raises:
            ValueError: With ``pairs``, if the graph has no ``pair_flows``.
        """
        path = check_writable(path, "path")
        rows = self.pairs_table() if pairs else self.edges_table()
        columns = _PAIR_COLUMNS if pairs else _EDGE_COLUMNS
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:  # floats as repr: read back exactly
            writer.writerow(
                {k: repr(v) if isinstance(v, float) else v for k, v in row.items()}
            )
        write_atomic(path, out.getvalue())

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this graph's viewer page, which :meth:`to_html` writes
        (see :func:`~captum_iglens.viewer._graph.graph_page`): layers as
        columns, edges drawn by ``|flow|``, a slider for the share kept."""
        return graph_page(self)

    def crossings(self) -> np.ndarray:
        r"""
        The flow that crosses the residual stream at each position, before the
        first block and after each block: the flow of the edges from a node at
        or before that depth to a node after it, at the position where the
        sender wrote and the receiver read.

        Every such cut separates ``input`` from ``logits``, so, by conservation,
        each row adds up to ``Δm`` over the positions (with the exact estimator,
        to float rounding, on the whole graph; a pruned graph gives what its
        edges carry). ``crossings()[l + 1, t] / Δm`` is the share of ``Δm``
        that went through position ``t``'s state after block ``l``: the
        integrated counterpart of restoring that state (causal tracing). At the
        attributed position it reaches 1 after the last block.

        Returns:
            *ndarray* ``(L + 1, T)`` float64: row 0 before block 0 (the
            input's flows), row ``l + 1`` after block ``l``.

        Raises:
            ValueError: If the graph has no ``position_flows`` (build it with
                ``per_position=True``).

        Examples::

            >>> graph = flow.attribute(prompt, counterfactual=other, per_position=True)
            >>> share = graph.crossings()[:, -1] / graph.delta_m  # last position
        """
        if self.position_flows is None:
            raise ValueError(
                "position_flows: this graph has none; build it with "
                "per_position=True (CLI: --per-position)"
            )
        ends = [edge_ends(edge) for edge in self.edges]
        sender = np.array([node_depth(s) for s, _ in ends])
        receiver = np.array([node_depth(r) for _, r in ends])
        blocks = [node_depth(n) for n in self.nodes if n.startswith("m")]
        cuts = np.array([0.0] + sorted(blocks))[:, None]  # (L + 1, 1)
        crossing = (sender[None] <= cuts) & (receiver[None] > cuts)  # (L + 1, E)
        return crossing.astype(np.float64) @ self.position_flows

    # ---------------------------------------------------------------- pruning

    def prune(self, keep: float, by: str = "share") -> "FlowGraph":
        r"""
        The graph with fewer edges.

        Args:
            keep (float): With ``by="share"``, the share of the total ``|flow|``
                    to keep, in ``(0, 1]``: the smallest set of edges (the
                    largest ``|flow|`` first) that carries it. With
                    ``by="top"``, the percentage of edges to keep, in
                    ``(0, 100]`` (at least one edge).
            by (str, optional): ``"share"`` or ``"top"``. Default: ``"share"``

        Returns:
            *FlowGraph*: the kept edges (and their nodes' names unchanged);
            ``settings["pruned"]`` records ``keep`` and ``by``. The error fields
            stay those of the whole graph.

        Raises:
            ValueError: If ``by`` is unknown or ``keep`` out of its range.
        """
        if by not in PRUNE_BY:
            raise ValueError(f"by: expected one of {PRUNE_BY}, got {by!r}")
        high = 1.0 if by == "share" else 100.0
        if (
            isinstance(keep, bool)
            or not isinstance(keep, (int, float))
            or not (0 < keep <= high)
        ):
            raise ValueError(
                f"keep: expected a number in (0, {high:g}] for by={by!r}, got {keep!r}"
            )
        magnitude = np.abs(self.flows)
        order = np.argsort(-magnitude, kind="stable")
        if by == "top":
            count = max(1, math.ceil(len(order) * keep / 100))
        else:
            carried = np.cumsum(magnitude[order])
            count = int(np.searchsorted(carried, keep * carried[-1] * (1 - 1e-12))) + 1
        kept = np.sort(order[: min(count, len(order))])
        return replace(
            self,
            edges=[self.edges[i] for i in kept],
            flows=self.flows[kept],
            position_flows=None
            if self.position_flows is None
            else self.position_flows[kept],
            pair_flows=None if self.pair_flows is None else self.pair_flows[kept],
            settings={**self.settings, "pruned": {"keep": keep, "by": by}},
        )

    # ------------------------------------------------------------------- files

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary of every field."""
        values = {f.name: plain(getattr(self, f.name)) for f in fields(self)}
        for name in ("position_flows", "pair_flows"):
            if values[name] is None:
                del values[name]
        return FLOW_SCHEMA.dump(values)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "FlowGraph":
        """Inverse of :meth:`to_dict`; every field is checked
        (:data:`FLOW_SCHEMA`)."""
        return cls(**FLOW_SCHEMA.load(data))

    @property
    def _target(self) -> str:
        """What was attributed, as the settings say (a file may say less)."""
        said = self.settings.get("target_text", self.settings.get("target_kind"))
        return str(said or "probability flow")

    def format_table(self, top: int = 20) -> str:
        r"""
        The ``top`` edges by ``|flow|`` and the graph's checks, as text.

        Args:
            top (int, optional): How many edges. Default: 20

        Returns:
            *str*.
        """
        lines = [
            f"target: {self._target}"
            f"  m(prompt) = {self.m_prompt:.6g}  m(base) = {self.m_base:.6g}"
            f"  Δm = {self.delta_m:+.6g}",
            f"{'edge':<28} {'flow':>12} {'share':>7}",
        ]
        for row in self.edges_table()[:top]:
            lines.append(
                f"{row['edge']:<28} {row['flow']:>+12.4e} {row['share']:>7.3f}"
            )
        if self.pair_flows is not None:
            lines.append(
                f"{'edge, by position (sender@s -> receiver@t)':<44} {'flow':>12}"
            )
            for row in self.pairs_table(top):
                sender, receiver = row["edge"].split("->")
                where = (
                    f"{sender}@{row['sender_position']}"
                    f"->{receiver}@{row['receiver_position']}"
                )
                lines.append(f"{where:<44} {row['flow']:>+12.4e}")
        lines.append(
            f"completeness: |Σ F(u->logits) - Δm| = {self.completeness_error:.2e}; "
            f"worst conservation error: {self.conservation_error:.2e} "
            f"({len(self.edges)} edges)"
        )
        return "\n".join(lines)
