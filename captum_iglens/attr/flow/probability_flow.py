r"""
:class:`ProbabilityFlow`: Captum-style entry point of the probability flow
(docs/flow.md): edges between the embeddings,
attention heads and MLPs whose flows add up exactly to the change of a
token's probability between a counterfactual (or baseline) and the prompt.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union, cast

import torch
from torch import Tensor

from captum_iglens.attr.flow.budget import point_bytes, points_at_once
from captum_iglens.attr.flow.inputs import (
    Prompt,
    TokenSpec,
    check_baselines,
    check_counterfactual,
    check_distinct,
    pair_tokens,
    prompt_ids,
)
from captum_iglens.attr.subject_noise import NOISE_SCALE
from captum_iglens.attr.flow.capture import target_logits
from captum_iglens.attr.flow.engine import (
    FlowTotals,
    first_block_inputs,
    flow_graph_of,
    flow_totals,
)
from captum_iglens.attr.flow.subject_start import noised_start, subject_positions
from captum_iglens.graph.target import Target, check_foil, check_kind, takes_foil
from captum_iglens.attr.flow.graph import FlowGraph, graph_of
from captum_iglens.attr.flow.pair_memory import check_pair_memory
from captum_iglens.attr.flow.options import (
    BASELINES,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_STEPS,
    check_steps,
    FLOW_METHODS,
)
from captum_iglens.graph.model_graph import ModelGraph
from captum_iglens.hf.architectures import model_parts
from captum_iglens.settings import model_name


@dataclass(frozen=True)
class FlowPlan:
    r"""
    A call of :meth:`ProbabilityFlow.attribute`, resolved and checked once
    (:meth:`ProbabilityFlow.plan`).

    Args:
        ids (Tensor): ``(B, T)`` long: the prompts of the ``B`` pairs, on the
                    model's device.
        start (str or Tensor): The paths' start: the counterfactuals' ids
                    ``(B, T)``, a baseline's name or the first block's input
                    ``(1, T, d)`` (every pair's) or ``(B, T, d)``.
        subject (tuple, optional): With ``corrupt_subject`` (one pair): its
                    text, the positions it noises (``(T,)`` bool) and the
                    noise's seed.
        graph (ModelGraph): The graph's nodes and edges.
        target_kind (str): The kind of ``m``.
        tokens (tuple[int, ...], optional): Each pair's target token (None:
                    the greedy predictions).
        foils (tuple[int, ...], optional): Each pair's foil (None: none, or
                    the counterfactuals' predictions).
        position (int): The position whose logits are read, in ``[0, T)``.
        n_steps (int): Steps of the path.
        method (str): The step rule.
        per_position (bool): Keep each edge by its sender's position.
        receiver_positions (bool): Also by the receiver's.
        batch (int): Path points per forward, all pairs together.
        max_chunk_bytes (int): The memory budget.
    """

    ids: Tensor
    start: Union[str, Tensor]
    subject: Optional[Tuple[str, Tensor, int]]
    graph: ModelGraph
    target_kind: str
    tokens: Optional[Tuple[int, ...]]
    foils: Optional[Tuple[int, ...]]
    position: int
    n_steps: int
    method: str
    per_position: bool
    receiver_positions: bool
    batch: int
    max_chunk_bytes: int


class ProbabilityFlow:
    r"""
    Probability flow through a decoder-only transformer, in Captum's style.

    The whole model runs at every point of the straight path of its first
    block's input from a counterfactual prompt (or a baseline) to the prompt;
    edge ``u→w`` is credited ``∫ ρ_w · dz_u``, where ``z_u`` is the sender's
    write to the residual stream and ``ρ_w`` the gradient of the target through
    the receiver alone. With the exact estimator (``"exact"``)
    the flows into ``logits`` add up to ``Δm = m(prompt) − m(base)`` and flow is
    conserved at every node, to float rounding, at any ``n_steps``.

    Heads of post-norm families (Gemma 2/3, whose blocks normalise the
    attention output before adding it): a head's write is its slice of the
    output projection times the norm's per-position factor, held at its real
    value, so the heads' writes add up to the block's attention write; the
    gradient into a head's query, key or value goes through that norm.
    Grouped key-value heads are split per query head without ungrouping the
    model (each query head's gradient of its group's keys and values is its
    own).

    A batch of ``B`` pairs of one token length, ``(B, T)`` prompts and
    counterfactuals, gives one graph per pair, each the graph the pair gives
    alone (the pairs' points share the model's forwards where the memory
    budget holds their whole paths).

    Args:
        model (nn.Module): A Hugging Face causal LM with sequential blocks
                    split into heads and one MLP (Llama, Qwen, Mistral, Gemma
                    1/2/3 families, ...).
        tokenizer (PreTrainedTokenizerBase, optional): For text prompts,
                    token texts and the graph's ``tokens``. Default: None

    Examples::

        >>> flow = ProbabilityFlow(model, tokenizer)
        >>> prompt = "When Mary and John went to the store, John gave a drink to"
        >>> other = "When Mary and John went to the store, Mary gave a drink to"
        >>> graph = flow.attribute(prompt, counterfactual=other, target=" Mary",
        ...                        target_kind="prob_diff", foil=" John")
        >>> graph.edge_scores()["a9.h6->logits"]
        >>> # a batch: (B, T) ids, one target and foil per pair
        >>> graphs = flow.attribute(ids, counterfactual=other_ids,
        ...                         target=[mary, john], target_kind="prob_diff",
        ...                         foil=[john, mary])
        >>> len(graphs)
        2
    """

    def __init__(self, model: Any, tokenizer: Any = None) -> None:
        self.parts = model_parts(model)
        flow_graph_of(self.parts, qkv=False)  # refuses an unsupported model
        self.tokenizer = tokenizer

    def attribute(
        self,
        inputs: Prompt,
        *,
        counterfactual: Optional[Prompt] = None,
        corrupt_subject: Optional[str] = None,
        noise_seed: int = 0,
        baselines: Union[str, Tensor] = "mean",
        target: TokenSpec = None,
        target_kind: str = "prob",
        foil: TokenSpec = None,
        position: int = -1,
        n_steps: int = DEFAULT_STEPS,
        method: str = "exact",
        qkv: bool = False,
        per_position: bool = False,
        receiver_positions: bool = False,
        internal_batch_size: Optional[int] = None,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> Union[FlowGraph, List[FlowGraph]]:
        r"""
        Args:
            inputs (str or Tensor): The prompt: text (with a tokenizer) or
                        token ids ``(1, T)``; or a batch of ``B`` prompts of
                        one token length, ``(B, T)`` (a padded batch is not
                        supported: every position of every row is read).
            counterfactual (str or Tensor, optional): The path's start: a
                        prompt of the same token length ``T``, one per prompt
                        (``(B, T)`` for a batch). Default: None
            corrupt_subject (str, optional): The path's start instead of a
                        counterfactual: the prompt with ROME's noise (the
                        restoration study's: Gaussian, of
                        :data:`~captum_iglens.attr.subject_noise.NOISE_SCALE`
                        times the embeddings' standard deviation) added to the
                        embeddings of the tokens that overlap the last
                        occurrence of this text in the prompt (one text
                        prompt, not a batch). ``baselines`` is then not used.
                        Default: None
            noise_seed (int, optional): The seed of ``corrupt_subject``'s
                        draw (the study's first draw is seed 0). Default: 0
            baselines (str or Tensor, optional): The path's start where there
                        is no counterfactual: ``"pad"`` (the pad token's
                        embedding), ``"mean"`` (the embedding module's mean
                        output over the vocabulary) or the first block's input
                        itself, ``(1, T, d)`` (every pair's) or ``(B, T, d)``.
                        Positions holding the model's BOS token keep their
                        embedding. Default: ``"mean"``
            target (int, str, sequence or Tensor, optional): The token ``y``
                        (id or one-token text), for every pair, or one per
                        pair (a sequence of ``B`` ids or texts, or a
                        ``(B,)`` integer tensor). Default: the model's greedy
                        prediction at ``position`` on each prompt.
            target_kind (str, optional): ``"prob"`` (``p(y)``), ``"prob_diff"``
                        (``p(y) − p(foil)``) or ``"logit_diff"``
                        (``logit(y) − logit(foil)``). Default: ``"prob"``
            foil (int, str, sequence or Tensor, optional): The foil token of
                        the differences, for every pair or one per pair (as
                        ``target``). Default: the greedy prediction on each
                        counterfactual.
            position (int, optional): The position whose logits are read, in
                        every pair. Default: -1
            n_steps (int, optional): Steps of the path; it costs
                        ``n_steps + 1`` forward and backward passes.
                        Default: :data:`~captum_iglens.attr.flow.options.DEFAULT_STEPS`
            method (str, optional): ``"exact"`` (exact at any
                        ``n_steps``) or ``"first_order"`` (the
                        first-order terms; the input's outflows are Captum's
                        ``LayerIntegratedGradients`` on the embeddings).
                        Default: ``"exact"``
            qkv (bool, optional): Separate receivers for each head's query,
                        key and value reads. Default: False
            per_position (bool, optional): Keep each edge's flow by its
                        sender's position. Default: False
            receiver_positions (bool, optional): Also split each of those by
                        the receiver's position, ``u@s → w@t`` (implies
                        ``per_position``): the heads' gradients are taken
                        through one query position at a time, so each point's
                        gradients and the result grow by ``T``; meant for
                        short prompts, and refused before the model runs where
                        it would not fit the memory available. Default: False
            internal_batch_size (int, optional): Path points per forward,
                        all pairs together; more than one must fit
                        ``max_chunk_bytes``. Default: None (as many as fit
                        it)
            max_chunk_bytes (int, optional): The memory budget of one
                        forward's path points (each holds every node's write
                        and every receiver's gradient, ``(S + R) · T · d``, and
                        the forward's activations; one point may exceed it)
                        and of a step's terms. Default: 256 MiB, the layer
                        maps' readout chunk

        Returns:
            *FlowGraph* of one pair (text, or ids ``(1, T)``), or for a batch
            (``B > 1``) *list[FlowGraph]*, one per pair in order
            (:meth:`plan` then :meth:`run_batch` always gives a list, for
            callers typed on one).

        Raises:
            ValueError: If an argument is invalid (checked before the model
                runs), naming it.
            TypeError: Naming an argument of the wrong type (see :meth:`plan`).
        """
        graphs = self.run_batch(
            self.plan(
                inputs,
                counterfactual=counterfactual,
                corrupt_subject=corrupt_subject,
                noise_seed=noise_seed,
                baselines=baselines,
                target=target,
                target_kind=target_kind,
                foil=foil,
                position=position,
                n_steps=n_steps,
                method=method,
                qkv=qkv,
                per_position=per_position,
                receiver_positions=receiver_positions,
                internal_batch_size=internal_batch_size,
                max_chunk_bytes=max_chunk_bytes,
            )
        )
        return graphs[0] if len(graphs) == 1 else graphs

    def plan(
        self,
        inputs: Prompt,
        *,
        counterfactual: Optional[Prompt] = None,
        corrupt_subject: Optional[str] = None,
        noise_seed: int = 0,
        baselines: Union[str, Tensor] = "mean",
        target: TokenSpec = None,
        target_kind: str = "prob",
        foil: TokenSpec = None,
        position: int = -1,
        n_steps: int = DEFAULT_STEPS,
        method: str = "exact",
        qkv: bool = False,
        per_position: bool = False,
        receiver_positions: bool = False,
        internal_batch_size: Optional[int] = None,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> "FlowPlan":
        r"""
        Every argument of :meth:`attribute` resolved and checked once, without
        running the model: the prompts' ids, the paths' start, the graph, each
        pair's target tokens and the position, the step rule and the path
        points per forward from the memory budget (for all the pairs of a
        batch). :meth:`run_batch` computes the graphs; the command line plans
        before its job, so that a bad argument is refused at once.

        Returns:
            *FlowPlan*.

        Raises:
            ValueError: If an argument is invalid, naming it: a batch's
                counterfactuals, baselines, targets or foils that are not one
                per prompt, prompts of unequal lengths, ``corrupt_subject``
                with a batch.
            TypeError: Naming ``noise_seed``, ``internal_batch_size`` or
                ``max_chunk_bytes`` where it is not an int, ``target`` or
                ``foil`` where it is a tensor of floats.
        """
        ids = self._ids(inputs, "inputs")
        n_pairs, length = ids.shape
        start = self._start(counterfactual, baselines, ids)
        subject = self._subject(inputs, corrupt_subject, counterfactual, noise_seed)
        flags = dict(
            qkv=qkv, per_position=per_position, receiver_positions=receiver_positions
        )
        _check_settings(
            target_kind, n_steps, method, flags, internal_batch_size, max_chunk_bytes
        )
        graph = flow_graph_of(self.parts, qkv)
        point = point_bytes(self.parts, graph, length, receiver_positions)
        batch = points_at_once(
            point, (n_steps + 1) * n_pairs, internal_batch_size, max_chunk_bytes
        )
        if receiver_positions:
            check_pair_memory(graph, length, 2 * batch * point, n_pairs)
        tokens = self._tokens(target, "target", n_pairs)
        foils = self._tokens(foil, "foil", n_pairs)
        prompt_start = isinstance(start, Tensor) and not start.is_floating_point()
        check_foil(target_kind, foils is not None, prompt_start)
        check_distinct(tokens, foils)
        return FlowPlan(
            ids=ids,
            start=start,
            subject=None
            if subject is None or corrupt_subject is None
            else (corrupt_subject, subject, noise_seed),
            graph=graph,
            target_kind=target_kind,
            tokens=tokens,
            foils=foils,
            position=_position(position, length),
            n_steps=n_steps,
            method=method,
            per_position=per_position,
            receiver_positions=receiver_positions,
            batch=batch,
            max_chunk_bytes=max_chunk_bytes,
        )

    def run(self, plan: "FlowPlan") -> FlowGraph:
        r"""
        The graph of a :meth:`plan` of one pair (:meth:`run_batch` for a
        batch).

        Args:
            plan (FlowPlan): From :meth:`plan`, on this model, of one pair.

        Returns:
            *FlowGraph*.

        Raises:
            ValueError: Naming ``plan``, if it holds several pairs.
        """
        if len(plan.ids) != 1:
            raise ValueError(
                f"plan: holds {len(plan.ids)} pairs; run_batch returns a graph for each"
            )
        return self.run_batch(plan)[0]

    def run_batch(self, plan: "FlowPlan") -> List[FlowGraph]:
        r"""
        The graphs of a :meth:`plan`, one per pair: the paths' start, the
        targets (the greedy predictions where no token was given), the flows.
        Each pair's graph is the one it gives alone (its own first moving
        position, steps and sums; its points share the model's forwards with
        other pairs' where ``plan.batch`` holds whole paths).

        Args:
            plan (FlowPlan): From :meth:`plan`, on this model.

        Returns:
            *list[FlowGraph]*, one per pair in order (one for one pair).
        """
        ids, start = plan.ids, plan.start
        if plan.subject is None:
            base = self._base_inputs(ids, start)
            origins = [self._origin(start, b) for b in range(len(ids))]
        else:
            text, positions, seed = plan.subject
            base, origin = noised_start(self.parts, ids, positions, NOISE_SCALE, seed)
            origins = [{**origin, "subject": text}]
        tokens = plan.tokens or self._greedy(ids, plan.position)
        foils: Tuple[Optional[int], ...] = (None,) * len(ids)
        if plan.foils is not None:
            foils = plan.foils
        elif takes_foil(plan.target_kind):
            assert isinstance(start, Tensor)
            foils = self._greedy(start, plan.position)
        goals = [
            Target(plan.target_kind, token, plan.position, foil)
            for token, foil in zip(tokens, foils)
        ]
        totals = flow_totals(
            self.parts,
            ids,
            base,
            goals,
            plan.graph,
            n_steps=plan.n_steps,
            method=plan.method,
            per_position=plan.per_position,
            receiver_positions=plan.receiver_positions,
            internal_batch_size=plan.batch,
            max_chunk_bytes=plan.max_chunk_bytes,
        )
        graph = plan.graph
        cfg = dict(
            n_layers=graph.n_layers,
            n_heads=graph.n_heads,
            n_kv_heads=graph.n_kv_heads,
            d_model=self._embeddings().embedding_dim,
            qkv=graph.qkv,
            parallel_attn_mlp=graph.parallel,
        )
        graphs = []
        for row, goal in enumerate(goals):
            settings = self._settings(goal, method=plan.method, n_steps=plan.n_steps)
            sums = totals.pop(0)  # let go once its graph holds them
            texts = self._texts(ids[row])
            graphs.append(build_graph(sums, cfg, texts, origins[row], settings))
        return graphs

    def _settings(self, goal: Target, **run: Any) -> dict:
        """The graph's ``settings``: the run's, the target's and the model's."""
        return dict(
            **run,
            target_kind=goal.kind,
            target=goal.token,
            foil=goal.foil,
            position=goal.position,
            model=model_name(getattr(self.parts.model.config, "_name_or_path", "")),
            target_text=self._describe(goal),
        )

    # ------------------------------------------------------------ arguments

    def _subject(
        self,
        inputs: Prompt,
        subject: Optional[str],
        counterfactual: Optional[Prompt],
        seed: int,
    ) -> Optional[Tensor]:
        """The positions ``corrupt_subject`` noises, checked; None without it."""
        if subject is None:
            return None
        if counterfactual is not None:
            raise ValueError(
                "corrupt_subject: give either counterfactual or corrupt_subject, "
                "not both"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"noise_seed: expected an int, got {type(seed).__name__}")
        if not 0 <= seed < 2**63:
            raise ValueError(f"noise_seed: expected an int in [0, 2**63), got {seed}")
        ids = self._ids(inputs, "inputs")
        if len(ids) > 1:
            raise ValueError(
                f"corrupt_subject: takes one text prompt, not a batch of {len(ids)}; "
                "run each pair alone, or pass each prompt's noised start as "
                "baselines (B, T, d)"
            )
        return subject_positions(self.tokenizer, inputs, subject, ids.shape[1])

    def _ids(self, prompt: Prompt, name: str) -> Tensor:
        vocab = self._embeddings().num_embeddings
        ids = prompt_ids(prompt, name, self.tokenizer, vocab)
        return ids.to(next(self.parts.model.parameters()).device)

    def _start(
        self,
        counterfactual: Optional[Prompt],
        baselines: Union[str, Tensor],
        prompts: Tensor,
    ) -> Union[str, Tensor]:
        if counterfactual is not None:
            ids = self._ids(counterfactual, "counterfactual")
            check_counterfactual(ids, prompts)
            return ids
        if isinstance(baselines, str):
            if baselines not in BASELINES:
                raise ValueError(
                    f"baselines: expected one of {BASELINES} or a tensor, "
                    f"got {baselines!r}"
                )
            if baselines == "pad" and self._pad_id() is None:
                raise ValueError(
                    "baselines: 'pad' needs the model's pad_token_id; use 'mean'"
                )
            return baselines
        d = self._embeddings().embedding_dim
        check_baselines(baselines, len(prompts), prompts.shape[1], d)
        return baselines

    def _tokens(
        self, token: TokenSpec, name: str, n_pairs: int
    ) -> Optional[Tuple[int, ...]]:
        vocab = self._embeddings().num_embeddings
        return pair_tokens(token, name, n_pairs, self.tokenizer, vocab)

    # ------------------------------------------------------------ the model

    def _embeddings(self) -> Any:
        """The model's input embedding module."""
        return cast(Any, self.parts.model).get_input_embeddings()

    def _pad_id(self) -> Optional[int]:
        pad = getattr(self.parts.model.config, "pad_token_id", None)
        if pad is None and self.tokenizer is not None:
            pad = self.tokenizer.pad_token_id
        return None if pad is None else int(pad)

    @torch.no_grad()
    def _greedy(self, ids: Tensor, position: int) -> Tuple[int, ...]:
        """Each row's greedy prediction at ``position``."""
        return tuple(target_logits(self.parts, ids, position).argmax(-1).tolist())

    @torch.no_grad()
    def _base_inputs(self, ids: Tensor, start: Union[str, Tensor]) -> Tensor:
        """The first block's input at each path's start, ``(B, T, d)``."""
        if isinstance(start, Tensor) and start.dtype.is_floating_point:
            return start.to(ids.device).expand(len(ids), -1, -1)
        if isinstance(start, Tensor):
            return first_block_inputs(self.parts, start)
        prompt = first_block_inputs(self.parts, ids)
        if start == "pad":
            pad = self._pad_id()
            assert pad is not None
            base = first_block_inputs(self.parts, torch.full_like(ids, pad))
        else:
            embed = self._embeddings()
            total = torch.zeros(
                prompt.shape[-1], dtype=torch.float64, device=ids.device
            )
            for first in range(0, embed.num_embeddings, 8192):
                rows = torch.arange(
                    first, min(first + 8192, embed.num_embeddings), device=ids.device
                )
                total += embed(rows).double().sum(0)
            mean = (total / embed.num_embeddings).to(prompt.dtype)
            base = mean.expand_as(prompt).clone()
        bos = getattr(self.parts.model.config, "bos_token_id", None)
        keep = (
            (ids == bos).unsqueeze(-1)
            if isinstance(bos, int)
            else torch.zeros_like(prompt, dtype=torch.bool)
        )
        return torch.where(keep, prompt, base)

    # ------------------------------------------------------------ text

    def _texts(self, ids: Tensor) -> list:
        """The texts of the tokens ``ids`` ``(T,)``."""
        if self.tokenizer is None:
            return [str(int(i)) for i in ids]
        return [self.tokenizer.decode([int(i)]) for i in ids]

    def _origin(self, start: Union[str, Tensor], row: int) -> dict:
        """The graph's ``counterfactual`` record of pair ``row``'s start."""
        if isinstance(start, str):
            return {"kind": start}
        if start.dtype.is_floating_point:
            return {"kind": "tensor"}
        return {"kind": "prompt", "tokens": self._texts(start[row])}

    def _describe(self, goal: Target) -> str:
        if self.tokenizer is None:
            return goal.describe(str)
        return goal.describe(lambda token: repr(self.tokenizer.decode([token])))


def _position(position: int, length: int) -> int:
    if (
        isinstance(position, bool)
        or not isinstance(position, int)
        or not -length <= position < length
    ):
        raise ValueError(
            f"position: expected an int in [-{length}, {length}), got {position!r}"
        )
    return position % length


def _check_settings(
    target_kind: str,
    n_steps: int,
    method: str,
    flags: dict,
    batch: Optional[int],
    max_chunk_bytes: int,
) -> None:
    check_kind(target_kind)
    check_steps(n_steps, "n_steps")
    if method not in FLOW_METHODS:
        raise ValueError(f"method: expected one of {FLOW_METHODS}, got {method!r}")
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: expected a bool, got {flag!r}")
    if batch is not None:
        _check_count("internal_batch_size", batch)
    _check_count("max_chunk_bytes", max_chunk_bytes)


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


def build_graph(
    totals: FlowTotals,
    cfg: dict,
    tokens: list,
    counterfactual: dict,
    settings: dict,
) -> FlowGraph:
    r"""
    The :class:`~captum_iglens.attr.flow.graph.FlowGraph` of summed flows
    (which checks, on its own, that they add up).

    Args:
        totals (FlowTotals): The engine's sums, receivers in the order of
                    the graph of ``cfg``.
        cfg (dict): The graph's configuration
                    (:data:`~captum_iglens.attr.flow.graph.GRAPH_CFG`).
        tokens (list[str]): The prompt's tokens.
        counterfactual (dict): The path's start.
        settings (dict): The run's settings.

    Returns:
        *FlowGraph*.
    """
    graph = graph_of(cfg)
    senders = torch.from_numpy(graph.edge_senders)
    receivers = torch.from_numpy(graph.edge_receivers)

    def by_edge(edges: Tensor, direct: Tensor) -> Tensor:
        """``(E, ...)``: the receiver × sender ``edges`` and the ``direct``
        flows into ``logits`` (the last receiver), in the graph's edge order."""
        matrix = torch.cat([edges.transpose(0, 1), direct.unsqueeze(1)], 1)
        return matrix[senders, receivers]

    flows = by_edge(totals.edges, totals.direct.sum(-1))
    by_position = None
    if totals.by_position is not None:
        by_position = by_edge(totals.by_position, totals.direct).numpy()
    by_pair = None
    if totals.by_pair is not None:  # logits reads the target's position
        direct = torch.zeros(*totals.direct.shape, len(tokens), dtype=torch.float64)
        direct[..., settings["position"]] = totals.direct
        by_pair = by_edge(totals.by_pair, direct).numpy()
    input_flows = totals.input_edges.sum(0) + totals.direct[0]
    effects = None
    if totals.effects is not None and totals.direct_effects is not None:
        effects = by_edge(totals.effects, totals.direct_effects).numpy()
    return FlowGraph(
        cfg=cfg,
        flows=flows.numpy(),
        effects=effects,
        tokens=tokens,
        input_flows=input_flows.numpy(),
        position_flows=by_position,
        pair_flows=by_pair,
        counterfactual=counterfactual,
        settings=settings,
        m_prompt=float(totals.m[-1]),
        m_base=float(totals.m[0]),
    )
