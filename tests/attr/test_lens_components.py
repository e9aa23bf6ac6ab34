"""Learned readouts per layer with columns that are components of a block's
segments (heads, neurons, experts, sources): each block's part splits into its
components, the lens-change part sits on the block's first and last columns,
and everything adds up to Δp."""

import pytest
import torch
from captum_iglens import LayerIGLens
from captum_iglens.readout.translators import Translators
from tests.attr.test_lens_change import _ids, _n_blocks, _random
from tests.tiny_models import HIDDEN, tiny_model

TOL = 1e-6
#: A sequential, a post-norm and a parallel family.
FAMILIES = ["llama", "gemma2", "gptj"]


@pytest.fixture(scope="module")
def lenses():
    torch.manual_seed(0)
    found = {}
    for name in FAMILIES + ["mixtral"]:
        model = tiny_model(name)
        found[name] = LayerIGLens.from_model(model, lens=_random(_n_blocks(model)))
    return found


def _block_of(name):
    return None if name == "input" else name.split(".")[0]


def _per_block(result, names, field):
    """Sum a field's columns per block name (``"input"`` into the first)."""
    values = getattr(result, field)
    blocks = []
    for name in names:
        block = _block_of(name)
        if block is not None and block not in blocks:
            blocks.append(block)
    sums = torch.zeros(*values.shape[:2], len(blocks), dtype=torch.float64)
    for c, name in enumerate(names):
        block = _block_of(name) or blocks[0]
        sums[..., blocks.index(block)] += values[..., c].double()
    return sums


def _check_against_blocks(lens, granularity, method, n_steps):
    ids = _ids()
    found = lens.attribute_map(
        ids, granularity=granularity, method=method, n_steps=n_steps
    )
    blocks = lens.attribute_map(
        ids, granularity="block", method=method, n_steps=n_steps
    )
    change = (found.model_prob - found.base_prob).double()
    total = found.block_part.double().sum(-1) + found.lens_change.double().sum(-1)
    assert (total - change).abs().max() <= TOL
    assert found.delta.abs().max() <= (TOL if method == "prediction_aware" else 1.0)
    if method == "prediction_aware":
        assert (found.attributions.double().sum(-1) - change).abs().max() <= TOL
    names = found.layer_names
    lens_blocks = _per_block(found, names, "lens_change")
    torch.testing.assert_close(
        lens_blocks, blocks.lens_change.double(), atol=TOL, rtol=0
    )
    assert blocks.lens_change.abs().max() > 1e-3  # the readouts differ
    parts = _per_block(found, names, "attributions") - lens_blocks
    torch.testing.assert_close(parts, blocks.block_part.double(), atol=TOL, rtol=0)
    return found


@pytest.mark.parametrize("n_steps", [1, 6])
@pytest.mark.parametrize("name", FAMILIES)
def test_heads_add_up_to_the_block_parts_on_each_family(lenses, name, n_steps):
    found = _check_against_blocks(lenses[name], "head", "prediction_aware", n_steps)
    blocks = lenses[name].attribute_map(_ids(), top_k=2)
    views = lenses[name].attribute_map(_ids(), granularity="head", top_k=2)
    ends = [views.layer_names.index(f"{b}.mlp") for b in blocks.layer_names]
    for field in ("levels", "kl", "top_probs"):  # a block's end: f_b(h_e)
        torch.testing.assert_close(
            getattr(views, field)[:, :, ends], getattr(blocks, field)
        )
    assert found.lens_change[..., 0].abs().max() > 1e-4  # f_0 vs f_1 at h_base
    heads = [c for c, n in enumerate(found.layer_names) if ".attn.h" in n]
    middle = [c for c in heads if not found.layer_names[c].endswith(".h0")]
    assert found.lens_change[..., middle].abs().max() == 0


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_captum_rules_split_their_block_credit_into_heads(lenses, method):
    lens = lenses["llama"]
    ids = _ids()
    heads = lens.attribute_map(ids, granularity="head", method=method, n_steps=5)
    subs = lens.attribute_map(ids, granularity="sublayer", method=method, n_steps=5)
    names = heads.layer_names
    for j, name in enumerate(subs.layer_names):
        block, part = name.split(".")
        if part == "attn":
            cols = [c for c, n in enumerate(names) if n.startswith(f"{block}.attn.")]
            if j == 0:
                cols = [0] + cols  # "input": a zero segment, its lens part
        else:
            cols = [names.index(name)]
        torch.testing.assert_close(
            heads.attributions[..., cols].double().sum(-1),
            subs.attributions[..., j].double(),
            atol=TOL,
            rtol=0,
        )
    torch.testing.assert_close(heads.delta, subs.delta, atol=TOL, rtol=0)


@pytest.mark.parametrize("granularity", ["neuron", "source", "source_head"])
def test_neurons_and_sources_add_up_to_the_block_parts(lenses, granularity):
    for n_steps in (1, 4):
        _check_against_blocks(lenses["llama"], granularity, "prediction_aware", n_steps)


def test_experts_add_up_to_the_block_parts(lenses):
    _check_against_blocks(lenses["mixtral"], "expert", "prediction_aware", 3)


@pytest.mark.parametrize("name", ["llama", "gptj"])
def test_head_attributions_per_dimension_sum_to_the_block_parts(lenses, name):
    lens = lenses[name]
    ids = _ids()
    attrs, delta = lens.attribute(
        ids,
        granularity="head",
        method="prediction_aware",
        n_steps=3,
        return_convergence_delta=True,
    )
    assert delta.abs().max() <= TOL
    found = lens.attribute_map(
        ids, granularity="head", method="prediction_aware", n_steps=3
    )
    per_column = torch.stack(list(attrs), 2).double().sum(-1)
    torch.testing.assert_close(per_column, found.block_part.double(), atol=TOL, rtol=0)


@pytest.mark.parametrize("granularity", ["head", "neuron", "source"])
def test_identity_translators_give_todays_components_exactly(granularity):
    model = tiny_model("llama", num_hidden_layers=3)
    ids = _ids()
    kwargs = dict(granularity=granularity, method="gausslegendre", n_steps=3)
    today = LayerIGLens.from_model(model).attribute_map(ids, top_k=2, **kwargs)
    lens = LayerIGLens.from_model(model, lens=Translators.identity(3, HIDDEN))
    found = lens.attribute_map(ids, top_k=2, **kwargs)
    for name in ("attributions", "levels", "base_prob", "delta", "top_probs"):
        assert torch.equal(getattr(found, name), getattr(today, name)), name
    assert torch.equal(found.lens_change, torch.zeros_like(found.attributions))
