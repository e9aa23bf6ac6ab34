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
from captum_iglens.attr.flow.nodes import FlowLayout

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


def _point(model, h0: torch.Tensor, y: int) -> Tuple[float, Dict, Dict, torch.Tensor]:
    """m, writes {sender: (T, d)}, reads {receiver: (T, d)} and ∇f at one point."""
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // n_heads
    eps = cfg.rms_norm_eps
    inv_freq = model.model.rotary_emb.inv_freq.float()
    causal = torch.full((h0.shape[0], h0.shape[0]), -math.inf).triu(1)
    writes: Dict[str, torch.Tensor] = {"input": h0}
    reads: Dict[str, torch.Tensor] = {}
    h = h0.clone().requires_grad_(True)
    for layer, block in enumerate(model.model.layers):
        att = block.self_attn
        z_heads = []
        for head in range(n_heads):
            group = head // (n_heads // n_kv)
            copies = {k: h.clone() for k in "qkv"}
            for k, copy in copies.items():
                reads[f"a{layer}.h{head}<{k}>"] = copy
            w = block.input_layernorm.weight
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
            z = (weights @ v) @ att.o_proj.weight[:, head * dh : (head + 1) * dh].T
            writes[f"a{layer}.h{head}"] = z
            z_heads.append(z)
        h = h + sum(z_heads)
        copy = h.clone()
        reads[f"m{layer}"] = copy
        x = _rms(copy, block.post_attention_layernorm.weight, eps)
        mlp = block.mlp
        z = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
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


def _reference_flow(model, n_steps: int, y: int) -> Dict[str, float]:
    emb = model.get_input_embeddings()
    with torch.no_grad():
        x, x0 = emb(IDS)[0], emb(OTHER)[0]
    points = [
        _point(model, x0 + (x - x0) * (s / n_steps), y) for s in range(n_steps + 1)
    ]
    flows: Dict[str, float] = {}
    for (m0, z0, r0, g0), (m1, z1, r1, g1) in zip(points, points[1:]):
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
        nodes = sorted({r.split("<")[0] for r in r0}, key=_order, reverse=True)
        for node in nodes:
            rows = [r for r in r0 if r.split("<")[0] == node]
            pairs = [(u, r) for r in rows for u in senders if _order(u) < _order(node)]
            terms = [float(((r0[r] + r1[r]) / 2 * dz[u]).sum()) for u, r in pairs]
            for (u, r), f in zip(pairs, _reference_split(outflow[node], terms)):
                step[f"{u}->{r}"] = f
                outflow[u] += f
        for edge, f in step.items():
            flows[edge] = flows.get(edge, 0.0) + f
    return flows


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
    expected = _reference_flow(llama, n_steps, y)
    got = graph.edge_scores()
    assert set(got) == set(expected)
    scale = max(abs(v) for v in expected.values())
    worst = max(abs(got[e] - expected[e]) for e in expected)
    assert worst <= 1e-4 * scale, worst
    assert graph.settings["n_steps"] == n_steps


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


def test_exact_step_by_hand():
    """One block, one head, one position. Senders input, a0.h0, m0; receivers
    a0.h0 (reads input), m0 (reads input, a0.h0). δm = 0.5; direct terms
    (0.1, 0.2, 0.1): all positive, so the logits' in-flows are 0.5 · t / 0.4 =
    (0.125, 0.25, 0.125). m0 sends 0.125 and splits it over its terms
    (input 0.3, a0.h0 0.2): (0.075, 0.05). a0.h0 sends 0.25 + 0.05 = 0.3 and
    takes it all from input."""
    layout = FlowLayout(n_layers=1, n_heads=1)
    edges = torch.tensor([[0.7, 0.0, 0.0], [0.3, 0.2, 0.0]], dtype=torch.float64)
    direct = torch.tensor([[0.1], [0.2], [0.1]], dtype=torch.float64)
    flows, out = exact_step(StepTerms(edges, direct, 0.5), layout, layout.allowed())
    assert out[:, 0].tolist() == pytest.approx([0.125, 0.25, 0.125], abs=1e-15)
    assert flows[1].tolist() == pytest.approx([0.075, 0.05, 0.0], abs=1e-15)
    assert flows[0].tolist() == pytest.approx([0.3, 0.0, 0.0], abs=1e-15)
