"""Exact credits under a learned readout per layer: block parts plus lens-change
parts add up to Δp; identity translators give today's numbers."""

import pytest
import torch
from captum_iglens import IGLensResult, LayerIGLens
from captum_iglens.attr.granularities import GRANULARITIES, Blocks
from captum_iglens.hf import model_parts
from captum_iglens.readout.layer_readout import LayerReadout
from captum_iglens.readout.translators import Translators
from tests.helpers import block_states
from tests.tiny_models import ARCHITECTURES, HIDDEN, VOCAB, tiny_model

TOL = 1e-6


def _ids(batch=2, length=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def _random(n_layers, d=HIDDEN, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    return Translators(
        scale * torch.randn(n_layers, d, d, generator=g),
        scale * torch.randn(n_layers, d, generator=g),
    )


def _n_blocks(model):
    return len(model_parts(model).blocks)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", num_hidden_layers=3)


@pytest.mark.parametrize("method", ["prediction_aware", "gausslegendre"])
@pytest.mark.parametrize("granularity", ["block", "sublayer"])
def test_identity_translators_give_todays_map_exactly(llama, method, granularity):
    ids = _ids()
    today = LayerIGLens.from_model(llama).attribute_map(
        ids, method=method, granularity=granularity, n_steps=4, top_k=3
    )
    lens = LayerIGLens.from_model(llama, lens=Translators.identity(3, HIDDEN))
    found = lens.attribute_map(
        ids, method=method, granularity=granularity, n_steps=4, top_k=3
    )
    for name in ("attributions", "levels", "base_prob", "delta", "kl", "top_probs"):
        assert torch.equal(getattr(found, name), getattr(today, name)), name
    assert torch.equal(found.lens_change, torch.zeros_like(found.attributions))
    assert found.readout_kind == "tuned" and today.readout_kind == "logit"
    assert found.readout_checksum == Translators.identity(3, HIDDEN).checksum()


def test_identity_translators_give_todays_attributions_exactly(llama):
    ids = _ids()
    today, d0 = LayerIGLens.from_model(llama).attribute(
        ids, method="riemann_middle", n_steps=3, return_convergence_delta=True
    )
    lens = LayerIGLens.from_model(llama, lens=Translators.identity(3, HIDDEN))
    found, d1 = lens.attribute(
        ids, method="riemann_middle", n_steps=3, return_convergence_delta=True
    )
    assert all(torch.equal(a, b) for a, b in zip(found, today)) and torch.equal(d0, d1)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_credits_add_up_under_random_translators_on_every_architecture(name):
    model = tiny_model(name)
    lens = LayerIGLens.from_model(model, lens=_random(_n_blocks(model)))
    ids = _ids()
    for n_steps in (1, 7):
        result = lens.attribute_map(ids, n_steps=n_steps)
        change = result.model_prob - result.base_prob
        parts = result.block_part.sum(-1) + result.lens_change.sum(-1)
        assert (parts - change).abs().max() <= TOL
        assert (result.attributions.sum(-1) - change).abs().max() <= TOL
        assert result.lens_change.abs().max() > 1e-3  # the readouts differ
    if lens.sublayers is not None:  # the block part split per sub-layer
        result = lens.attribute_map(ids, granularity="sublayer", n_steps=3)
        change = result.model_prob - result.base_prob
        assert (result.attributions.sum(-1) - change).abs().max() <= TOL


def test_each_term_is_the_readouts_change_and_the_split_is_the_mean_order(llama):
    """Checked against the test's own hooks and translators: translator i reads
    hidden state i (0: the first block's input), the last block the model's."""
    t = _random(3, seed=1)
    lens = LayerIGLens.from_model(llama, lens=t)
    ids = _ids(1, 5)
    result = lens.attribute_map(ids)
    states, logits = block_states(llama, ids, torch.ones_like(ids))
    readout = model_parts(llama).readout()
    y = logits[0].argmax(-1)

    def f(i, h):  # f_i(h) at every position, i = 3 the model's own
        x = h[0] if i == 3 else t(h[0], torch.full((h.shape[1],), i))
        return torch.softmax(readout(x).double(), -1)[torch.arange(5), y]

    for j in range(3):
        a, b = j, j + 1
        s, e = states[j], states[j + 1]
        term = f(b, e) - f(a, s)
        lens_part = ((f(b, s) - f(a, s)) + (f(b, e) - f(a, e))) / 2
        torch.testing.assert_close(
            result.attributions[0, :, j].double(), term, atol=2e-6, rtol=0
        )
        torch.testing.assert_close(
            result.lens_change[0, :, j].double(), lens_part, atol=2e-6, rtol=0
        )
    torch.testing.assert_close(
        result.base_prob[0].double(), f(0, states[0]), atol=2e-6, rtol=0
    )


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_captum_rules_report_their_error_in_delta(llama, method):
    lens = LayerIGLens.from_model(llama, lens=_random(3))
    ids = _ids()
    result = lens.attribute_map(ids, method=method, n_steps=3)
    change = result.model_prob - result.base_prob
    torch.testing.assert_close(
        result.attributions.sum(-1) - change, result.delta, atol=TOL, rtol=0
    )
    attrs, delta = lens.attribute(
        ids, method=method, n_steps=3, return_convergence_delta=True
    )
    block = torch.stack(attrs, 2).sum(-1)
    torch.testing.assert_close(block, result.block_part, atol=1e-5, rtol=0)
    torch.testing.assert_close(delta, result.delta, atol=1e-5, rtol=0)
    recomputed = lens.compute_convergence_delta(attrs, None, ids)
    torch.testing.assert_close(recomputed, delta, atol=1e-5, rtol=0)


def test_sublayers_split_the_block_part_and_keep_the_lens_part(llama):
    lens = LayerIGLens.from_model(llama, lens=_random(3))
    ids = _ids()
    blocks = lens.attribute_map(ids)
    subs = lens.attribute_map(ids, granularity="sublayer")
    pairs = subs.attributions.view(2, -1, 3, 2).sum(-1)
    torch.testing.assert_close(pairs, blocks.attributions, atol=TOL, rtol=0)
    lens_pairs = subs.lens_change.view(2, -1, 3, 2).sum(-1)
    torch.testing.assert_close(lens_pairs, blocks.lens_change, atol=TOL, rtol=0)
    attrs, delta = lens.attribute(
        ids, granularity="sublayer", n_steps=5, return_convergence_delta=True
    )
    assert delta.abs().max() <= TOL
    per_column = torch.stack(attrs, 2).sum(-1)
    torch.testing.assert_close(per_column, subs.block_part, atol=TOL, rtol=0)


def test_a_subset_of_blocks_telescopes_across_the_skipped_readouts(llama):
    lens = LayerIGLens.from_model(llama, layers=[0], lens=_random(3))
    result = lens.attribute_map(_ids())
    assert result.layer_names == ["0", "2"]
    change = result.model_prob - result.base_prob
    assert (result.attributions.sum(-1) - change).abs().max() <= TOL


def test_a_granularity_without_blocks_is_refused_with_a_learned_readout(
    llama, monkeypatch
):
    class Unplaced(Blocks):  # a granularity no learned readout can split
        name = "unplaced"
        learned_readout = False

    monkeypatch.setitem(GRANULARITIES, Unplaced.name, Unplaced)
    lens = LayerIGLens.from_model(llama, lens=_random(3))
    with pytest.raises(ValueError, match="not available with a learned readout"):
        lens.attribute_map(_ids(), granularity="unplaced")


def test_a_wrong_model_checkpoint_is_refused_before_any_forward(tmp_path, llama):
    calls = []
    handle = llama.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        folder = _random(2).save(tmp_path / "two")
        with pytest.raises(ValueError, match="2 blocks, but this model has"):
            LayerIGLens.from_model(llama, lens=folder)
        other = Translators(
            torch.zeros(3, HIDDEN, HIDDEN), unembed_sha256="0" * 64, base_model="x"
        )
        with pytest.raises(ValueError, match="unembedding differs"):
            LayerIGLens.from_model(llama, lens=other.save(tmp_path / "other"))
    finally:
        handle.remove()
    assert calls == []


def test_a_block_outside_the_readouts_model_is_refused(llama):
    parts = model_parts(llama)
    readout = LayerReadout(parts.readout(), _random(3), parts.blocks)
    stranger = tiny_model("llama", num_hidden_layers=3)
    with pytest.raises(ValueError, match="not one of the blocks"):
        LayerIGLens(stranger, list(model_parts(stranger).blocks), readout=readout)


def test_a_learned_result_saves_loads_and_refuses_inconsistency(tmp_path, llama):
    lens = LayerIGLens.from_model(llama, lens=_random(3))
    result = lens.attribute_map(_ids(), top_k=2)
    result.save(tmp_path / "r.json")
    back = IGLensResult.load(tmp_path / "r.json")
    assert torch.equal(back.lens_change, result.lens_change)
    assert (back.readout_kind, back.readout_checksum) == (
        "tuned",
        result.readout_checksum,
    )
    assert "lens-change part" in result.format_table(0)
    page = result.page_data()["readout"]
    assert page["kind"] == "tuned" and len(page["lens_change"]) == 2
    data = result.to_dict()
    data["lens_change"] = None
    with pytest.raises(ValueError, match="lens_change/readout_checksum"):
        IGLensResult.from_dict(data)
    plain = LayerIGLens.from_model(llama).attribute_map(_ids())
    with pytest.raises(ValueError, match="readout_kind"):
        IGLensResult.cat([plain, result])
