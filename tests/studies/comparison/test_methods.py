"""The one registry of the methods the studies score, and outcomes run once."""

import pytest
import torch

from captum_iglens import LayerIGLens, Settings
from captum_iglens.hf import model_parts
from captum_iglens.studies.comparison import (
    COMPARED_METHODS,
    METHODS,
    SCORED_METHODS,
    SOURCE_METHODS,
    compare,
)
from captum_iglens.studies.methods.registry import TRACED_METHODS, outcome
from captum_iglens.studies.methods.runners import Work
from captum_iglens.studies.validation.scoring import study_work
from tests.helpers import left_padded
from tests.tiny_models import VOCAB, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(1)
    return left_padded([6, 4], VOCAB)


def test_both_studies_list_methods_from_the_one_registry():
    layers = tuple(n for n, m in METHODS.items() if m.compared and m.axis == "layers")
    assert COMPARED_METHODS == layers
    assert SOURCE_METHODS == tuple(
        n for n, m in METHODS.items() if m.compared and m.axis == "sources"
    )
    assert SOURCE_METHODS == ("ig_lens_sources", "lig_embeddings", "attention_rollout")
    assert SCORED_METHODS == tuple(n for n, m in METHODS.items() if m.scored)
    assert COMPARED_METHODS == (
        "ig_lens",
        "ig_lens_joint",
        "logit_lens",
        "logit_lens_diff",
        "dla",
        "dla_prob",
        "layer_conductance",
        "layer_integrated_gradients",
        "layer_integrated_gradients_multilayer",
    )
    assert SCORED_METHODS == (
        "ig_lens",
        "ig_lens_abs",
        "ig_lens_joint",
        "logit_lens",
        "logit_lens_diff",
        "dla",
        "layer_conductance",
        "random",
    )
    assert all(m.run is not None for n, m in METHODS.items() if m.compared)
    assert [n for n, m in METHODS.items() if m.costly] == ["layer_conductance"]
    assert [n for n, m in METHODS.items() if m.run is None and m.trace is None] == [
        "random"
    ]
    assert TRACED_METHODS == ("ig_lens_flow",)
    assert not any(METHODS[n].scored or METHODS[n].compared for n in TRACED_METHODS)
    assert [n for n, m in METHODS.items() if m.why_not() is not None] == []


def _work(model, batch, settings):
    ids, mask = batch
    lens = LayerIGLens.from_model(model)
    found = lens.attribute_map(ids, additional_forward_args=(mask,), positions=[-1])
    parts = model_parts(model)
    return Work.from_map(parts, lens, ids, mask, found, found.base_prob, settings, 0)


def test_an_outcome_runs_once_per_work(model, batch, monkeypatch):
    work = _work(model, batch, Settings())
    counted = []
    original = work.ig_lens.attribute_map

    def counting(*args, **kwargs):
        counted.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(work.ig_lens, "attribute_map", counting)
    signed = outcome(work, "ig_lens")
    magnitudes = outcome(work, "ig_lens_abs")  # from the same outcome
    assert outcome(work, "ig_lens") is signed
    assert len(counted) == 1
    assert torch.equal(magnitudes.scores, signed.scores.abs())
    with pytest.raises(ValueError, match="random"):
        outcome(work, "random")


def test_ig_lens_joint_is_the_joint_map_whatever_the_work_path(model, batch):
    ids, mask = batch
    for path in ("telescoping", "joint"):
        work = _work(model, batch, Settings(path=path))
        joint = outcome(work, "ig_lens_joint")
        found = work.ig_lens.attribute_map(
            ids, None, work.targets, (mask,), positions=[-1], path="joint"
        )
        assert torch.equal(joint.scores, found.attributions)
        # exact: the blocks' credits add up to Δp = p − f(h_0)
        gap = (joint.scores.sum(-1) - (work.model_prob - work.h0_prob)).abs()
        assert gap.max() <= 1e-6
        assert torch.equal(joint.prob_change, found.model_prob - found.base_prob)
        assert "joint path" in joint.note
        own = outcome(work, "ig_lens")
        assert f"{path} path" in own.note
        assert torch.equal(own.scores, joint.scores) == (path == "joint")


def test_study_work_gives_what_the_runners_give(model, batch):
    """The validation studies read IG-Lens and the logit lens from their own pass:
    the same outcomes as the comparison's runners, bit for bit."""
    ids, mask = batch
    for settings in (
        Settings(),
        Settings(baselines=0.0, method="riemann_trapezoid"),
        Settings(path="joint"),
    ):
        lens = LayerIGLens.from_model(model)
        work, trajectory = study_work(model_parts(model), lens, ids, mask, settings, 0)
        fresh = Work.from_map(
            work.parts,
            lens,
            ids,
            mask,
            lens.attribute_map(ids, None, work.targets, (mask,), positions=[-1]),
            work.h0_prob,
            settings,
            0,
        )
        for name in ("ig_lens", "logit_lens", "logit_lens_diff"):
            seeded, run = work.outcomes[name], METHODS[name].run(fresh)
            assert torch.equal(seeded.scores, run.scores), (name, settings)
            assert torch.equal(seeded.expected, run.expected), (name, settings)
            assert seeded.note == run.note
        assert torch.equal(trajectory[:, 1:], work.outcomes["logit_lens"].scores[:, 0])


def test_compare_measures_each_method_from_scratch(model, batch):
    """Outcomes kept on a study's work are not shared between compare's methods:
    each method's cost is its own."""
    ids, mask = batch
    both = compare(model, ids, mask, methods=("ig_lens", "logit_lens"))
    alone = compare(model, ids, mask, methods=("logit_lens",))
    for key in ("forwards", "forward_sequences", "backwards"):
        assert getattr(both.methods["logit_lens"], key) == getattr(
            alone.methods["logit_lens"], key
        )
    assert both.methods["logit_lens"].forwards >= 1
