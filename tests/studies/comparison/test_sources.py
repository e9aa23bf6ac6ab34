"""The source-token methods (LayerIntegratedGradients on the embeddings,
attention rollout, IG-Lens's per-source credits) and their rank agreement."""

import pytest
import torch

from captum_iglens.studies.comparison import (
    SOURCE_METHODS,
    ComparisonResult,
    MethodResult,
    compare,
    format_source_agreement,
    source_rank_agreement,
)
from captum_iglens.studies.comparison.compare import method_names
from captum_iglens.studies.methods.source_runners import rollout
from tests.tiny_models import VOCAB, tiny_model

POSITIONS = [-3, -1]


@pytest.fixture(scope="module")
def run():
    model = tiny_model("llama")
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (1, 6))
    result = compare(
        model, ids, positions=POSITIONS, methods=SOURCE_METHODS, n_steps=16
    )
    return model, ids, result


def test_source_methods_score_every_visible_source(run):
    model, ids, result = run
    assert list(result.methods) == list(SOURCE_METHODS)
    positions = result.positions.tolist()
    assert positions == [3, 5]
    for name, entry in result.methods.items():
        assert entry.scores.shape == (1, 2, 6) and len(entry.layer_names) == 6
        # A token sees only the sources up to its own position (causal).
        assert (entry.scores[0, 0, 4:] == 0).all(), name
        assert entry.scores[0, 0, :4].abs().sum() > 0, name
    shares = result.methods["attention_rollout"].scores[0]
    torch.testing.assert_close(shares.sum(-1), torch.ones(2))
    assert (shares >= 0).all()


def test_lig_embeddings_adds_up_to_the_change_in_probability(run):
    """By hand: p(target) of the ids and of the baseline ids (token 0, the tiny
    config's pad token) from the model's own logits."""
    model, ids, result = run
    entry = result.methods["lig_embeddings"]
    baseline = torch.zeros_like(ids)
    with torch.no_grad():
        probs = [model(x).logits.softmax(-1) for x in (ids, baseline)]
    for p, position in enumerate(result.positions.tolist()):
        target = int(result.targets[0, p])
        change = float(probs[0][0, position, target] - probs[1][0, position, target])
        total = float(entry.scores[0, p].sum())
        assert abs(total - change) <= abs(float(entry.delta[0, p])) + 1e-5


def test_rollout_by_hand():
    # One head attending only to source 0, twice: Ã = [[1, 0], [0.5, 0.5]],
    # Ã·Ã = [[1, 0], [0.75, 0.25]].
    a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]], dtype=torch.float64)
    expected = torch.tensor([[[1.0, 0.0], [0.75, 0.25]]], dtype=torch.float64)
    torch.testing.assert_close(rollout([a, a]), expected)
    # Heads are averaged first: one to source 0, one to itself.
    two = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]]])
    half = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    torch.testing.assert_close(rollout([two.double()]), half.double())


def _hand_result(reference, other, position):
    names = [f"s{j}" for j in range(len(reference))]

    def method(scores, name):
        scores = torch.tensor([[scores]])
        zeros = torch.zeros(1, 1)
        cost = [0] * 7
        return MethodResult(scores, names, zeros, zeros, "probability", name, *cost)

    return ComparisonResult(
        {
            "ig_lens_sources": method(reference, "ig"),
            "lig_embeddings": method(other, "lig"),
        },
        torch.tensor([[7]]),
        torch.tensor([position]),
        torch.ones(1, 1, dtype=torch.bool),
        ["0"],
    )


def test_rank_agreement_by_hand():
    # Same order of |score| over sources 0..3 -> 1, whatever comes after the
    # token (a source it cannot see is not ranked).
    same = _hand_result([0.4, -0.3, 0.2, 0.1, 0.0], [4.0, 3.0, -2.0, 1.0, 99.0], 3)
    assert source_rank_agreement(same)["lig_embeddings"][0, 0] == pytest.approx(1.0)
    # Reversed order -> -1.
    reverse = _hand_result([0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], 3)
    assert source_rank_agreement(reverse)["lig_embeddings"][0, 0] == pytest.approx(-1.0)
    # Ranks (1, 2, 3, 4) against (2, 1, 3, 4): 1 - 6·2 / 60.
    swap = _hand_result([0.4, 0.3, 0.2, 0.1], [0.3, 0.4, 0.2, 0.1], 3)
    rho = source_rank_agreement(swap)["lig_embeddings"][0, 0]
    assert rho == pytest.approx(1 - 12 / 60)
    text = format_source_agreement(swap, top=2)
    assert "ρ(lig_embeddings) = +0.800" in text
    assert "\n  s0 " in text and "\n  s1 " in text and "\n  s2 " not in text


def test_agreement_on_a_model_and_its_table(run):
    *_, result = run
    rho = source_rank_agreement(result)
    assert set(rho) == {"lig_embeddings", "attention_rollout"}
    for value in rho.values():
        assert value.shape == (1, 2) and ((value >= -1) & (value <= 1)).all()
    text = format_source_agreement(result)
    assert text.count("ρ(attention_rollout)") == 2
    page = result.page_data()
    assert set(page["sequences"][0]["agreement"]) == set(rho)
    assert page["reference"] == "ig_lens_sources"


def test_agreement_needs_ig_lens_sources(run):
    *_, result = run
    only = ComparisonResult(
        {"lig_embeddings": result.methods["lig_embeddings"]},
        result.targets,
        result.positions,
        result.mask,
        result.layer_names,
    )
    with pytest.raises(ValueError, match="ig_lens_sources"):
        source_rank_agreement(only)
    assert only.page_data()["sequences"][0]["agreement"] == {}


def test_ig_lens_sources_refused_before_any_work_without_the_granularity(
    monkeypatch,
):
    from captum_iglens.studies.methods import source_runners

    monkeypatch.delitem(source_runners.GRANULARITIES, "source")
    with pytest.raises(ValueError, match="methods: ig_lens_sources needs"):
        method_names(["lig_embeddings", "ig_lens_sources"])
    assert method_names(["lig_embeddings"]) == ["lig_embeddings"]


def test_source_comparison_saves_and_loads(run, tmp_path):
    *_, result = run
    result.save(tmp_path / "c.json")
    loaded = ComparisonResult.load(tmp_path / "c.json")
    assert loaded.methods["attention_rollout"].unit == "share"
    for name, entry in result.methods.items():
        torch.testing.assert_close(loaded.methods[name].scores, entry.scores)
        assert loaded.methods[name].layer_names == entry.layer_names
