"""Probability flow on the embedded SmolLM2-135M-Instruct (Llama family,
grouped key-value heads) and Gemma 3 270M (post-norm): exact at 1 and 3 steps
(``benchmarks/flow.py exactness`` measures 1, 8 and the default), and the
embeddings' outflows equal Captum's LayerIntegratedGradients. Short prompts and
few steps keep them quick."""

import pytest
import torch
from captum.attr import LayerIntegratedGradients

from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.graph.target import Target

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
OTHER = "The capital of Italy is"


@pytest.mark.parametrize("n_steps", [1, 3])
def test_exact_on_real_models(embedded_model, n_steps):
    name, model, tokenizer = embedded_model
    qkv = name == "gemma3" and n_steps == 1  # SmolLM2 splits its 3 key-value groups
    graph = ProbabilityFlow(model, tokenizer).attribute(
        PROMPT, counterfactual=OTHER, target=" Paris", n_steps=n_steps, qkv=qkv
    )
    assert graph.delta_m > 0.01  # Paris gains probability: the check is not vacuous
    assert graph.completeness_error <= 1e-6
    assert graph.conservation_error <= 1e-6
    into_logits = sum(
        f for e, f in graph.edge_scores().items() if e.endswith("->logits")
    )
    assert into_logits == pytest.approx(graph.delta_m, abs=1e-6)
    with torch.no_grad():
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        probs = torch.softmax(model(ids).logits[0, -1].float(), -1)
    assert graph.m_prompt == pytest.approx(
        float(probs[graph.settings["target"]]), abs=1e-6
    )


def test_embeddings_outflows_are_captum_lig(embedded_model):
    _, model, tokenizer = embedded_model
    n_steps = 2
    graph = ProbabilityFlow(model, tokenizer).attribute(
        PROMPT,
        counterfactual=OTHER,
        target=" Paris",
        n_steps=n_steps,
        method="first_order",
    )
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    other = tokenizer(OTHER, return_tensors="pt").input_ids
    target = Target("prob", graph.settings["target"], ids.shape[1] - 1)
    lig = LayerIntegratedGradients(
        lambda x: target(model(x).logits), model.get_input_embeddings()
    )
    left, right = (
        lig.attribute(ids, baselines=other, n_steps=n_steps, method=rule).sum(-1)[0]
        for rule in ("riemann_left", "riemann_right")
    )
    expected = ((left + right) / 2).double()
    assert expected.abs().max() > 1e-3
    got = torch.from_numpy(graph.input_flows)
    assert (got - expected).abs().max() <= 1e-5


def test_smollm2_graph_as_eap_igs_file(default_model, tmp_path):
    """SmolLM2's 9 query heads over 3 key/value heads: EAP-IG's graph has a
    ``<k>`` and ``<v>`` read per query head (MIB's 123,211 edges), each query
    head's own read of its group's keys and values."""
    from tests.test_eap_json import read_like_eap_ig

    model, tokenizer = default_model
    graph = ProbabilityFlow(model, tokenizer).attribute(
        PROMPT, counterfactual=OTHER, target=" Paris", n_steps=1, qkv=True
    )
    assert graph.cfg["n_kv_heads"] == 3 and graph.cfg["n_heads"] == 9
    graph.to_eap_json(tmp_path / "g.json")
    data = read_like_eap_ig(tmp_path / "g.json")
    assert len(data["edges"]) == 123_211
    assert {n: e["score"] for n, e in data["edges"].items()} == graph.edge_scores()
    assert all(e["in_graph"] for e in data["edges"].values())
