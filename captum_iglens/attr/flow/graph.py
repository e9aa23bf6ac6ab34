r"""
:class:`FlowGraph`, the result of the probability flow: the edges of the
model's :class:`~captum_iglens.graph.model_graph.ModelGraph` with flows that
add up exactly to the change of the target, and :data:`FLOW_SCHEMA`, the
declaration its files are loaded with.

A file holds the graph's configuration (``cfg``) and one flow per edge of the
graph that configuration implies, in its order; node and edge names are
derived from it, never stored or parsed. A circuit is an ``in_graph`` mask
over those edges (:meth:`FlowGraph.prune`). On load, the flows are checked
against each other: with the exact estimator they must add up to ``Δm`` and
be conserved at every node; the errors shown are recomputed, never read.
:meth:`FlowGraph.to_eap_json` writes EAP-IG's and MIB's graph file.
"""

import json
import math
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from captum_iglens._utils.schema import (
    Array,
    Either,
    Flag,
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
from captum_iglens.attr.flow.options import SCORES
from captum_iglens.attr.flow.route import Route, best_route
from captum_iglens.attr.flow.tables import (
    EDGE_COLUMNS,
    PAIR_COLUMNS,
    edge_rows,
    pair_lines,
    pair_rows,
    write_csv,
)
from captum_iglens.graph.eap_json import eap_document
from captum_iglens.graph.model_graph import ModelGraph, model_graph
from captum_iglens.viewer import Viewable
from captum_iglens.viewer._graph import graph_page

#: The configuration a graph's nodes and edges are derived from (EAP-IG's
#: ``cfg``, with the key/value heads and whether a head's reads are separate).
GRAPH_CFG = Record(
    n_layers=Integer(low=1),
    n_heads=Integer(low=1),
    n_kv_heads=Maybe(Integer(low=1)),
    d_model=Integer(low=1),
    qkv=Flag(),
    parallel_attn_mlp=Flag(),
)
#: What a :class:`FlowGraph` holds: ``E`` edges, ``T`` positions.
FLOW_SCHEMA = Record(
    cfg=GRAPH_CFG,
    flows=Array("float", "E", numpy=True),
    effects=Maybe(Array("float", "E", numpy=True)),
    in_graph=Maybe(Array("bool", "E", numpy=True)),
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
)
#: The ways :meth:`FlowGraph.prune` keeps edges.
PRUNE_BY = ("share", "top")
#: The estimators whose flows add up exactly, checked on load.
EXACT_METHODS = ("exact",)
#: How far an exact graph's sums may be from their totals, relative to the
#: flows' magnitude (float64 rounding over tens of thousands of edges).
EXACT_RTOL = 1e-9
#: The same for the plain first-order terms, float32 products summed per
#: position and over positions.
PLAIN_RTOL = 1e-5


def graph_of(cfg: Dict[str, Any]) -> ModelGraph:
    """The :class:`ModelGraph` a graph configuration (:data:`GRAPH_CFG`) implies."""
    return model_graph(
        cfg["n_layers"],
        cfg["n_heads"],
        cfg["qkv"],
        cfg.get("n_kv_heads"),
        cfg["parallel_attn_mlp"],
    )


@dataclass
class FlowGraph(JsonDocument, Viewable):
    r"""
    A probability-flow graph: what each edge of the model's graph carried of
    the change of the target ``Δm = m(prompt) − m(base)``.

    The flows into ``logits`` add up to ``Δm`` and, at every other node but
    ``input``, the flows in add up to the flows out (with the exact estimator,
    to float rounding: :attr:`completeness_error`,
    :attr:`conservation_error`, recomputed from the flows, never stored).
    The flows out of ``input`` are Integrated Gradients on the embeddings,
    per position in ``input_flows``. ``to_html`` writes the viewer's graph
    page (Jupyter shows it inline).

    Args:
        cfg (dict): The graph's configuration: ``n_layers``, ``n_heads``,
                    ``n_kv_heads`` (or None), ``d_model``, ``qkv`` and
                    ``parallel_attn_mlp``; its nodes and ``E`` edges are those
                    of :attr:`graph`.
        flows (ndarray): ``(E,)`` float64: each edge's flow, summed over
                    positions, in the graph's edge order.
        tokens (list[str]): ``T`` prompt tokens (text, or ids as text).
        input_flows (ndarray): ``(T,)`` float64: the flow out of ``input``
                    at each position.
        counterfactual (dict): The path's start: ``kind`` (``"prompt"``,
                    ``"subject_noise"``, ``"pad"``, ``"mean"`` or
                    ``"tensor"``); for a prompt its ``tokens``, for a noised
                    subject its ``subject``, ``positions``, ``noise_scale``,
                    ``noise_std`` and ``seed``.
        settings (dict): ``method``, ``n_steps``, ``target_kind``,
                    ``target``, ``foil``, ``position``, ``model`` (and
                    ``pruned``, on a pruned graph).
        m_prompt (float): ``m`` on the prompt.
        m_base (float): ``m`` at the path's start.
        position_flows (ndarray, optional): ``(E, T)`` float64: each edge's
                    flow by the position where its sender wrote it (where
                    asked). Default: None
        pair_flows (ndarray, optional): ``(E, T, T)`` float64, ``[e, s, t]``:
                    each edge's flow by the position ``s`` where its sender
                    wrote it and the position ``t`` of the receiver's output
                    (a head at ``t`` reads every ``s ≤ t``, an MLP its own
                    position, ``logits`` the attributed one); it adds up over
                    ``t`` to ``position_flows`` (where asked). Default: None
        in_graph (ndarray, optional): ``(E,)`` bool: the circuit, the edges
                    kept by :meth:`prune`. Default: None (every edge)
        effects (ndarray, optional): ``(E,)`` float64: each edge's own effect
                    to first order, from the same walk: the sender's whole
                    change times the receiver's gradient averaged over the
                    grid, ``E(u→w) = Δz_u · mean_k ρ_w`` (EAP-IG's product form
                    on the flow's grid). What patching one edge alone would
                    change, where the flow is what each edge carried of
                    ``Δm``; the effects do not add up to ``Δm``. Default: None
    """

    KIND = "flow_graph"

    cfg: Dict[str, Any]
    flows: np.ndarray
    tokens: List[str]
    input_flows: np.ndarray
    counterfactual: Dict[str, Any]
    settings: Dict[str, Any]
    m_prompt: float
    m_base: float
    position_flows: Optional[np.ndarray] = None
    pair_flows: Optional[np.ndarray] = None
    in_graph: Optional[np.ndarray] = None
    effects: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        FLOW_SCHEMA.check({f.name: getattr(self, f.name) for f in fields(self)})
        if len(self.flows) != self.graph.n_edges:
            raise ValueError(
                f"flows: {len(self.flows)} edges, but the graph of cfg "
                f"({self.graph.describe()}) has {self.graph.n_edges}"
            )
        position = self.settings.get("position")
        if position is not None and not (
            isinstance(position, int) and 0 <= position < len(self.tokens)
        ):
            raise ValueError(
                f"settings.position: expected an int in [0, {len(self.tokens)}), "
                f"got {position!r}"
            )
        self._check_sums()

    def _check_sums(self) -> None:
        """The flows against each other: by position against the totals, and
        with an exact estimator, completeness and conservation."""
        exact = self.settings.get("method") in EXACT_METHODS
        # the plain terms are the model's float32 products, summed two ways
        scale = float(np.abs(self.flows).sum()) + abs(self.delta_m) + 1e-300
        scale *= EXACT_RTOL if exact else PLAIN_RTOL
        if self.position_flows is not None:
            _close("position_flows", self.position_flows.sum(-1), self.flows, scale)
        if self.pair_flows is not None:
            if self.position_flows is None:
                raise ValueError(
                    "pair_flows: given without position_flows, which they add up to"
                )
            _close("pair_flows", self.pair_flows.sum(-1), self.position_flows, scale)
        out_of_input = self.flows[self.graph.edge_senders == 0].sum()
        _close("input_flows", self.input_flows.sum(), out_of_input, scale)
        if not exact:
            return
        if self.completeness_error > scale:
            into = self._node_sums[0][-1]
            raise ValueError(
                f"m_prompt, m_base, flows: the flows into logits add up to "
                f"{into:.6g}, not Δm = m_prompt - m_base = {self.delta_m:.6g}; "
                "the file is inconsistent"
            )
        if self.conservation_error > scale:
            into, out = self._node_sums
            worst = 1 + int(np.abs(into - out)[1:-1].argmax())
            raise ValueError(
                f"flows: not conserved at {self.nodes[worst]} (in {into[worst]:.6g}, "
                f"out {out[worst]:.6g}); the file is inconsistent"
            )

    # ---------------------------------------------------------- the graph

    @property
    def graph(self) -> ModelGraph:
        """The :class:`ModelGraph` of ``cfg``."""
        return graph_of(self.cfg)

    @property
    def nodes(self) -> List[str]:
        """``N`` node names, ``input`` first, ``logits`` last."""
        return self.graph.nodes

    @property
    def edges(self) -> List[str]:
        """``E`` edge names, in the order of ``flows``."""
        return self.graph.edges

    @property
    def kept(self) -> np.ndarray:
        """The indices of the edges in the circuit (every edge, unpruned)."""
        if self.in_graph is None:
            return np.arange(len(self.flows))
        return np.flatnonzero(self.in_graph)

    @property
    def delta_m(self) -> float:
        """``Δm = m_prompt − m_base``."""
        return self.m_prompt - self.m_base

    @cached_property
    def _node_sums(self) -> Tuple[np.ndarray, np.ndarray]:
        """Per node, the inflow and the outflow over every edge."""
        graph, n = self.graph, len(self.graph.nodes)
        receiver = graph.receiver_node[graph.edge_receivers]
        into = np.bincount(receiver, weights=self.flows, minlength=n)
        out = np.bincount(graph.edge_senders, weights=self.flows, minlength=n)
        return into, out

    @property
    def completeness_error(self) -> float:
        """``|Σ_u F(u→logits) − Δm|`` over every edge."""
        return abs(float(self._node_sums[0][-1]) - self.delta_m)

    @property
    def conservation_error(self) -> float:
        """The largest ``|inflow − outflow|`` over the nodes but ``input``
        and ``logits``, over every edge."""
        into, out = self._node_sums
        return float(np.abs(into - out)[1:-1].max(initial=0.0))

    @property
    def kept_into_logits(self) -> Optional[float]:
        """``Σ F(u→logits)`` over the kept edges of a pruned graph (how much of
        ``Δm`` its circuit carries into the logits); None unpruned, where it is
        ``Δm`` to within :attr:`completeness_error`."""
        if self.in_graph is None:
            return None
        graph = self.graph
        into_logits = graph.receiver_node[graph.edge_receivers] == len(graph.nodes) - 1
        return float(self.flows[into_logits & self.in_graph].sum())

    # ------------------------------------------------------------- plain data

    def edge_scores(self) -> Dict[str, float]:
        r"""
        The flow of each kept edge, summed over positions, keyed by its
        EAP-IG/MIB name: the plain dictionary a circuit harness ranks and
        patches (``|F|`` ranks edges as EAP-IG's scores do).

        Returns:
            *dict[str, float]*: ``{"{sender}->{receiver}": flow}``.

        Examples::

            >>> scores = graph.edge_scores()
            >>> scores["a3.h1->logits"], scores["input->a0.h2<v>"]
        """
        edges = self.edges
        return {edges[i]: float(self.flows[i]) for i in self.kept}

    def node_flows(self) -> Dict[str, Tuple[float, float]]:
        r"""
        Returns:
            *dict[str, tuple[float, float]]*: per node, its inflow and outflow
            over the kept edges.
        """
        graph, kept = self.graph, self.kept
        n, flows = len(graph.nodes), self.flows[kept]
        receiver = graph.receiver_node[graph.edge_receivers[kept]]
        into = np.bincount(receiver, weights=flows, minlength=n)
        out = np.bincount(graph.edge_senders[kept], weights=flows, minlength=n)
        return {
            node: (float(into[i]), float(out[i])) for i, node in enumerate(graph.nodes)
        }

    def edges_table(self) -> List[Dict[str, Any]]:
        r"""
        One row per kept edge, largest ``|flow|`` first: ``edge``, ``sender``,
        ``receiver`` (the receiving node or head read), ``flow`` and
        ``share`` (of the kept edges' total ``|flow|``), and ``effect`` where
        the graph has ``effects``.

        Returns:
            *list[dict]*.
        """
        return edge_rows(self.graph, self.flows, self.kept, self.effects)

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
        return pair_rows(self.pair_flows, self.kept, self.edges, self.tokens, top)

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
        if pairs:
            write_csv(path, self.pairs_table(), PAIR_COLUMNS)
        else:
            extra = () if self.effects is None else ("effect",)
            write_csv(path, self.edges_table(), EDGE_COLUMNS + extra)

    def page_data(self) -> Dict[str, Any]:
        r"""The data of this graph's viewer page, which :meth:`to_html` writes
        (see :func:`~captum_iglens.viewer._graph.graph_page`): layers as
        columns, edges drawn by ``|flow|``, a slider for the share kept."""
        return graph_page(self)

    def route(self) -> Optional[Route]:
        r"""
        The route that carries the most of ``Δm``: of the paths from ``input``
        to ``logits`` over the kept edges, node to node (a head's reads summed),
        the one whose smallest flow in ``Δm``'s direction is largest; of those,
        the one of fewest hops, then the first in node order
        (:func:`~captum_iglens.attr.flow.route.widest_path`).

        Returns:
            *Route* or None: its ``nodes``, its hops' ``flows`` and its signed
            ``bottleneck``; None where no kept edges join ``input`` to ``logits``.

        Examples::

            >>> route = graph.route()
            >>> " -> ".join(route.nodes), route.bottleneck
        """
        return best_route(self.graph, self.flows, self.kept, self.delta_m)

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
        graph, kept = self.graph, self.kept
        sender = graph.node_depth[graph.edge_senders[kept]]
        receiver = graph.node_depth[graph.receiver_node[graph.edge_receivers[kept]]]
        blocks = graph.node_depth[
            [graph.node_index[f"m{i}"] for i in range(graph.n_layers)]
        ]
        cuts = np.concatenate([[0.0], np.sort(blocks)])[:, None]  # (L + 1, 1)
        crossing = (sender[None] <= cuts) & (receiver[None] > cuts)  # (L + 1, E)
        return crossing.astype(np.float64) @ self.position_flows[kept]

    # ---------------------------------------------------------------- pruning

    def prune(self, keep: float, by: str = "share") -> "FlowGraph":
        r"""
        The circuit of the edges with the largest ``|flow|``: the same graph
        (its arrays shared, not copied) with an ``in_graph`` mask.

        Args:
            keep (float): With ``by="share"``, the share of the total ``|flow|``
                    to keep, in ``(0, 1]``: the smallest set of edges (the
                    largest ``|flow|`` first, ties in the graph's order) that
                    carries it. With ``by="top"``, the percentage of edges to
                    keep, in ``(0, 100]`` (at least one edge).
            by (str, optional): ``"share"`` or ``"top"``. Default: ``"share"``

        Returns:
            *FlowGraph*: with ``in_graph`` set; ``settings["pruned"]`` records
            ``keep`` and ``by``. The errors stay those of the whole graph;
            :attr:`kept_into_logits` is what the kept edges carry.

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
        mask = np.zeros(len(order), dtype=bool)
        mask[order[: min(count, len(order))]] = True
        return replace(
            self,
            in_graph=mask,
            settings={**self.settings, "pruned": {"keep": keep, "by": by}},
        )

    def to_eap_json(self, path: Union[str, Path], score: str = "flow") -> None:
        r"""
        Writes the graph as EAP-IG's graph file (:mod:`~captum_iglens.graph.eap_json`),
        atomically: each edge's flow (or effect) as its ``score``, the circuit
        (or every edge) as ``in_graph``. MIB's circuit evaluation and EAP-IG's
        ``Graph.from_json`` read it.

        Args:
            path (str or Path): The file to write.
            score (str, optional): ``"flow"`` or ``"effect"`` (``effects``).
                        Default: ``"flow"``

        Raises:
            ValueError: If the graph's queries, keys and values are not
                separate receivers (EAP-IG's always are), or ``score`` is
                ``"effect"`` on a graph without effects.
        """
        scores = self.scores(score)
        path = check_writable(path, "path")
        document = eap_document(self.graph, self.cfg["d_model"], scores, self.in_graph)
        write_atomic(path, json.dumps(document, allow_nan=False))

    def scores(self, score: str = "flow") -> np.ndarray:
        r"""
        The edges' scores by name.

        Args:
            score (str, optional): ``"flow"`` (``flows``) or ``"effect"``
                        (``effects``). Default: ``"flow"``

        Returns:
            *ndarray*: ``(E,)`` float64, in the graph's edge order.

        Raises:
            ValueError: If ``score`` is unknown, or ``"effect"`` on a graph
                without effects.
        """
        if score not in SCORES:
            raise ValueError(f"score: expected one of {SCORES}, got {score!r}")
        if score == "flow":
            return self.flows
        if self.effects is None:
            raise ValueError(
                "score: this graph has no effects (a file written before they "
                "were computed); recompute the graph"
            )
        return self.effects

    # ------------------------------------------------------------------- files

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dictionary of every field."""
        values = {f.name: plain(getattr(self, f.name)) for f in fields(self)}
        for name in ("position_flows", "pair_flows", "in_graph", "effects"):
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
            lines += pair_lines(self.pairs_table(top))
        lines.append(
            f"completeness: |Σ F(u->logits) - Δm| = {self.completeness_error:.2e}; "
            f"worst conservation error: {self.conservation_error:.2e} "
            f"(over all {len(self.flows)} edges)"
        )
        if self.kept_into_logits is not None:
            lines.append(
                f"the {len(self.kept)} kept edges carry Σ F(u->logits) = "
                f"{self.kept_into_logits:.6g} of Δm = {self.delta_m:.6g} "
                "into logits"
            )
        return "\n".join(lines)


def _close(name: str, found: np.ndarray, expected: np.ndarray, scale: float) -> None:
    """Refuses ``name`` where its sums ``found`` miss ``expected`` by more
    than ``scale``."""
    gap = float(np.abs(np.asarray(found) - expected).max(initial=0.0))
    if gap > scale:
        raise ValueError(
            f"{name}: its sums miss the flows they add up to by {gap:.3g}; the "
            "file is inconsistent"
        )
