"""The probability flow on a 2-block Llama against an independent reference:
a forward written out here (RMSNorm, rotary embedding, grouped attention,
SwiGLU), with a separate copy of the residual stream for every receiver's
read, so that autograd gives each node-input gradient directly; and the exact
estimator written as a plain loop over steps and nodes. Plus hand-computed
splits of the estimator itself."""

import math
from typing import Dict, List, Tuple

import pytest
import torch

from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.attr.flow.estimator import StepTerms, allocate, exact_step
from captum_iglens.attr.flow.reads import allowed
from captum_iglens.graph.model_graph import model_graph

IDS = torch.tensor([[1, 5, 9, 17, 33, 7]])
OTHER = torch.tensor([[1, 5, 10, 18, 33, 7]])


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    t = torch.arange(x.shape[0], dtype=torch.float32)
    angles = torch.outer(t, inv_freq)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[:, half:], x[:, :half]], -1)
    return x * cos + rotated * sin


def _point(
    model, h0: torch.Tensor, y: int, by_query: bool = False
) -> Tuple[float, Dict, Dict, torch.Tensor]:
    """m, writes {sender: (T, d)}, reads {receiver: (T, d)} and ∇f at one point.
    ``by_query``: a separate read for each position ``t`` of the receiver's
    output, ``"{receiver}@{t}"``, that only its row ``t`` is computed from."""
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // n_heads
    eps = cfg.rms_norm_eps
    inv_freq = model.model.rotary_emb.inv_freq.float()
    length = h0.shape[0]
    causal = torch.full((length, length), -math.inf).triu(1)
    writes: Dict[str, torch.Tensor] = {"input": h0}
    reads: Dict[str, torch.Tensor] = {}
    at = range(length) if by_query else [None]

    def copy(h: torch.Tensor, name: str, t) -> torch.Tensor:
        reads[name if t is None else f"{name}@{t}"] = h.clone()
        return reads[name if t is None else f"{name}@{t}"]

    def rows(z: Dict) -> torch.Tensor:
        return torch.stack([z[t][t] for t in at]) if by_query else z[None]

    h = h0.clone().requires_grad_(True)
    for layer, block in enumerate(model.model.layers):
        att = block.self_attn
        z_heads = []
        for head in range(n_heads):
            group = head // (n_heads // n_kv)
            w = block.input_layernorm.weight
            z_at = {}
            for t in at:
                copies = {k: copy(h, f"a{layer}.h{head}<{k}>", t) for k in "qkv"}
                q = (
                    _rms(copies["q"], w, eps)
                    @ att.q_proj.weight[head * dh : (head + 1) * dh].T
                )
                k = (
                    _rms(copies["k"], w, eps)
                    @ att.k_proj.weight[group * dh : (group + 1) * dh].T
                )
                v = (
                    _rms(copies["v"], w, eps)
                    @ att.v_proj.weight[group * dh : (group + 1) * dh].T
                )
                q, k = _rotate(q, inv_freq), _rotate(k, inv_freq)
                weights = torch.softmax(q @ k.T / math.sqrt(dh) + causal, -1)
                o_proj = att.o_proj.weight[:, head * dh : (head + 1) * dh]
                z_at[t] = (weights @ v) @ o_proj.T
            z = rows(z_at)
            writes[f"a{layer}.h{head}"] = z
            z_heads.append(z)
        h = h + sum(z_heads)
        z_at = {}
        for t in at:
            x = _rms(
                copy(h, f"m{layer}", t), block.post_attention_layernorm.weight, eps
            )
            mlp = block.mlp
            z_at[t] = mlp.down_proj(
                torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
            )
        z = rows(z_at)
        writes[f"m{layer}"] = z
        h = h + z
    final = h.clone()
    logits = model.lm_head(_rms(final, model.model.norm.weight, eps))
    m = torch.softmax(logits[-1], -1)[y]
    grads = torch.autograd.grad(m, [final] + list(reads.values()))
    rho = dict(zip(reads, grads[1:]))
    writes = {k: v.detach() for k, v in writes.items()}
    return float(m.detach()), writes, rho, grads[0]


def _reference_split(amount: float, terms: List[float]) -> List[float]:
    """The documented rule, written out: each part keeps its term; the rest is
    shared in proportion to |term|; equal parts where all terms are zero."""
    size = sum(abs(t) for t in terms)
    rest = amount - sum(terms)
    if size == 0:
        return [amount / len(terms)] * len(terms)
    return [t + rest * abs(t) / size for t in terms]


def _order(name: str) -> int:
    if name == "input":
        return 0
    layer = int(name[1:].split(".")[0])
    return 2 * layer + (1 if name.startswith("a") else 2)


def _summed(rho: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The reads ``"{receiver}@{t}"`` added up over ``t``."""
    out: Dict[str, torch.Tensor] = {}
    for name, grad in rho.items():
        base = name.split("@")[0]
        out[base] = out[base] + grad if base in out else grad
    return out


def _reference_flow(
    model, n_steps: int, y: int, by_query: bool = False
) -> Tuple[Dict[str, float], Dict[str, torch.Tensor]]:
    """The exact flows ``{edge: flow}`` and, with ``by_query``, each edge's
    ``(T, T)`` flows ``[s, t]``: every step's edge flow split over the
    sender's positions by its terms, then each position's over the positions
    ``t`` whose output reads it (a head's ``t ≥ s``, an MLP's ``t = s``,
    the logits' last position)."""
    emb = model.get_input_embeddings()
    with torch.no_grad():
        x, x0 = emb(IDS)[0], emb(OTHER)[0]
    points = [
        _point(model, x0 + (x - x0) * (s / n_steps), y, by_query)
        for s in range(n_steps + 1)
    ]
    length = IDS.shape[1]
    flows: Dict[str, float] = {}
    pairs: Dict[str, torch.Tensor] = {}

    def by_pair(edge: str, flow: float, at: torch.Tensor, terms) -> None:
        """``at``: the edge's terms per sender position; ``terms(s)``: its
        terms at ``s`` per position of the receiver that reads ``s``."""
        into = pairs.setdefault(edge, torch.zeros(length, length, dtype=torch.float64))
        for s, f in enumerate(_reference_split(flow, at.tolist())):
            where, parts = terms(s)
            for t, part in zip(where, _reference_split(f, parts)):
                into[s, t] += part

    for (m0, z0, q0, g0), (m1, z1, q1, g1) in zip(points, points[1:]):
        r0, r1 = _summed(q0), _summed(q1)
        dz = {u: z1[u] - z0[u] for u in z0}
        senders = list(dz)
        grad = (g0 + g1) / 2
        step = {}
        direct = _reference_split(
            m1 - m0, [float((grad * dz[u]).sum()) for u in senders]
        )
        outflow = {u: 0.0 for u in senders}
        for u, f in zip(senders, direct):
            step[f"{u}->logits"] = f
            outflow[u] += f
            if by_query:
                at = (grad * dz[u]).sum(-1)
                by_pair(f"{u}->logits", f, at, lambda s: ([length - 1], [float(at[s])]))
        nodes = sorted({r.split("<")[0] for r in r0}, key=_order, reverse=True)
        for node in nodes:
            rows = [r for r in r0 if r.split("<")[0] == node]
            edges = [(u, r) for r in rows for u in senders if _order(u) < _order(node)]
            terms = [float(((r0[r] + r1[r]) / 2 * dz[u]).sum()) for u, r in edges]
            for (u, r), f in zip(edges, _reference_split(outflow[node], terms)):
                step[f"{u}->{r}"] = f
                outflow[u] += f
                if not by_query:
                    continue

                def reads(s: int, u: str = u, r: str = r) -> Tuple[List[int], List]:
                    where = [t for t in range(length) if t >= s] if r[0] == "a" else [s]
                    mean = [(q0[f"{r}@{t}"] + q1[f"{r}@{t}"]) / 2 for t in where]
                    return where, [float((g[s] * dz[u][s]).sum()) for g in mean]

                by_pair(f"{u}->{r}", f, ((r0[r] + r1[r]) / 2 * dz[u]).sum(-1), reads)
        for edge, f in step.items():
            flows[edge] = flows.get(edge, 0.0) + f
    return flows, pairs


@pytest.mark.parametrize("n_steps, split", [(1, True), (3, True), (1, False)])
def test_edges_match_the_independent_reference(llama, monkeypatch, n_steps, split):
    """``split=False``: the heads' gradients through the whole graph from the
    block's input (the path of attention modules without separate q/k/v
    projections)."""
    if not split:
        monkeypatch.setattr(
            "captum_iglens.attr.flow.capture.projections_of", lambda attention: None
        )
    y = int(llama(IDS).logits[0, -1].argmax())
    graph = ProbabilityFlow(llama).attribute(
        IDS, counterfactual=OTHER, target=y, n_steps=n_steps, qkv=True
    )
    expected, _ = _reference_flow(llama, n_steps, y)
    got = graph.edge_scores()
    assert set(got) == set(expected)
    scale = max(abs(v) for v in expected.values())
    worst = max(abs(got[e] - expected[e]) for e in expected)
    assert worst <= 1e-4 * scale, worst
    assert graph.settings["n_steps"] == n_steps


@pytest.mark.parametrize("n_steps, split", [(1, True), (2, True), (1, False)])
def test_flows_by_receiver_position_match_the_reference(
    llama, monkeypatch, n_steps, split
):
    """Each edge by sender and receiver position ``u@s → w@t``: the gradient
    through one output position of a head or MLP (the reference computes
    that row alone from its own copy of the stream), split as documented."""
    if not split:
        monkeypatch.setattr(
            "captum_iglens.attr.flow.capture.projections_of", lambda attention: None
        )
    y = int(llama(IDS).logits[0, -1].argmax())
    graph = ProbabilityFlow(llama).attribute(
        IDS,
        counterfactual=OTHER,
        target=y,
        n_steps=n_steps,
        qkv=True,
        receiver_positions=True,
    )
    flows, expected = _reference_flow(llama, n_steps, y, by_query=True)
    got = dict(zip(graph.edges, graph.pair_flows))
    assert set(got) == set(expected)
    scale = max(abs(v) for v in flows.values())
    worst = max(float(abs(torch.from_numpy(got[e]) - expected[e]).max()) for e in got)
    assert worst <= 1e-4 * scale, worst
    # a head reads back (s ≤ t), where the mask lets it, and not only at s = t
    heads = [i for i, e in enumerate(graph.edges) if "->a1." in e]
    below = torch.ones(IDS.shape[1], IDS.shape[1], dtype=torch.bool).tril(-1)
    assert (graph.pair_flows[heads][:, below] == 0).all()
    off_diagonal = graph.pair_flows[heads][:, below.T]
    assert abs(off_diagonal).max() > 1e-3 * scale


def test_split_rule_by_hand():
    # one sign: in proportion to the terms, 0.6 · (1, 2) / 3
    parts = allocate(
        torch.tensor(0.6, dtype=torch.float64),
        torch.tensor([1.0, 2.0], dtype=torch.float64),
        torch.tensor([True, True]),
    )
    assert parts.tolist() == pytest.approx([0.2, 0.4], abs=1e-15)
    # both signs: terms (3, -2) sum to 1; the rest 0.5 - 1 = -0.5 goes 3:2
    parts = allocate(
        torch.tensor(0.5, dtype=torch.float64),
        torch.tensor([3.0, -2.0, 7.0], dtype=torch.float64),
        torch.tensor([True, True, False]),
    )
    assert parts.tolist() == pytest.approx([2.7, -2.2, 0.0], abs=1e-15)
    # all zero: equal parts among the allowed entries
    parts = allocate(
        torch.tensor(0.9, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
        torch.tensor([True, False, True]),
    )
    assert parts.tolist() == pytest.approx([0.45, 0.0, 0.45], abs=1e-15)
    # rows apart: one in proportion, one all zero
    parts = allocate(
        torch.tensor([0.6, 0.9], dtype=torch.float64),
        torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64),
        torch.tensor([True, True]),
    )
    assert parts.flatten().tolist() == pytest.approx([0.2, 0.4, 0.45, 0.45])


def test_exact_step_by_hand():
    """One block, one head, one position. Senders input, a0.h0, m0; receivers
    a0.h0 (reads input), m0 (reads input, a0.h0). δm = 0.5; direct terms
    (0.1, 0.2, 0.1): all positive, so the logits' in-flows are 0.5 · t / 0.4 =
    (0.125, 0.25, 0.125). m0 sends 0.125 and splits it over its terms
    (input 0.3, a0.h0 0.2): (0.075, 0.05). a0.h0 sends 0.25 + 0.05 = 0.3 and
    takes it all from input."""
    layout = model_graph(n_layers=1, n_heads=1, qkv=False)
    edges = torch.tensor([[0.7, 0.0, 0.0], [0.3, 0.2, 0.0]], dtype=torch.float64)
    direct = torch.tensor([[0.1], [0.2], [0.1]], dtype=torch.float64)
    flows, out = exact_step(StepTerms(edges, direct, 0.5), layout, allowed(layout))
    assert out[:, 0].tolist() == pytest.approx([0.125, 0.25, 0.125], abs=1e-15)
    assert flows[1].tolist() == pytest.approx([0.075, 0.05, 0.0], abs=1e-15)
    assert flows[0].tolist() == pytest.approx([0.3, 0.0, 0.0], abs=1e-15)
