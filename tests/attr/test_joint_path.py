"""The joint path: every column's update scaled together along h_base -> h_final.
Credits add up to Δp at every granularity, each block's columns add up to the
block's credit, the credits converge to the integral computed here with the
test's own autograd, and the order of the blocks does not matter."""

import json

import pytest
import torch
from torch import nn

from captum_iglens import IGLensResult, LayerIGLens, Readout, Settings
from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.attr.granularities.neurons import NeuronComponents
from captum_iglens.attr.granularities.source_terms import SourceComponents
from captum_iglens.columns import parse_columns
from captum_iglens.readout.translators import Translators
from tests.helpers import block_states, left_padded
from tests.tiny_models import ARCHITECTURES, VOCAB, tiny_model

FP32_TOL = 1e-6
# one of each kind of block: sequential, post-norm, parallel, mixture of experts
KINDS = ["llama", "gemma3_text", "gptj", "qwen2_moe"]


def per_block(result: IGLensResult, blocks: list) -> torch.Tensor:
    """The credits of ``result``'s columns summed per block of ``blocks`` (the
    ``"input"`` column with the first block, as the block map's first column
    starts at the baseline)."""
    out = torch.zeros(*result.attributions.shape[:2], len(blocks))
    for j, column in enumerate(parse_columns(result.layer_names)):
        block = 0 if column.block is None else blocks.index(str(column.block))
        out[..., block] += result.attributions[..., j]
    return out


def granularity_maps(lens, ids, mask, **kwargs):
    """Every granularity the lens offers, as ``{name: result}``; the others must
    be refused naming the granularity."""
    maps = {}
    for name in GRANULARITIES:
        try:
            maps[name] = lens.attribute_map(
                ids, additional_forward_args=(mask,), granularity=name, **kwargs
            )
        except ValueError as err:
            assert str(err).startswith("granularity:"), err
    return maps


def check_exact_and_nested(maps):
    blocks = maps["block"]
    change = blocks.model_prob - blocks.base_prob
    for name, result in maps.items():
        real = result.mask
        assert result.path == "joint"
        assert (result.total - change)[real].abs().max() <= FP32_TOL, name
        nested = per_block(result, blocks.layer_names) - blocks.attributions
        assert nested[real].abs().max() <= FP32_TOL, name


@pytest.mark.parametrize("arch", KINDS)
def test_every_granularity_adds_up_and_nests_in_its_blocks(arch):
    torch.manual_seed(0)
    model = tiny_model(arch)
    ids, mask = left_padded([7, 5], VOCAB)
    maps = granularity_maps(LayerIGLens.from_model(model), ids, mask, path="joint")
    assert {"block", "head", "source", "source_head"} <= set(maps)
    check_exact_and_nested(maps)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_every_granularity(arch):
    torch.manual_seed(0)
    ids, mask = left_padded([6, 4], VOCAB)
    lens = LayerIGLens.from_model(tiny_model(arch))
    check_exact_and_nested(granularity_maps(lens, ids, mask, path="joint"))


@pytest.mark.parametrize(
    "arch, granularity, factored",
    [
        ("llama", "neuron", NeuronComponents),
        ("qwen2_moe", "expert", NeuronComponents),
        ("llama", "source", SourceComponents),
    ],
)
def test_factored_components_give_the_dense_credits(
    arch, granularity, factored, monkeypatch
):
    """The joint columns read neurons, experts and sources through their own
    products and norms; built densely, they give the same credits."""
    torch.manual_seed(0)
    lens = LayerIGLens.from_model(tiny_model(arch))
    ids, mask = left_padded([6, 4], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), granularity=granularity)
    read = lens.attribute_map(ids, path="joint", n_steps=8, **kwargs)
    monkeypatch.delattr(factored, "dots")
    monkeypatch.delattr(factored, "norms")
    built = lens.attribute_map(ids, path="joint", n_steps=8, **kwargs)
    real = read.mask
    torch.testing.assert_close(read.attributions, built.attributions, atol=1e-6, rtol=0)
    change = read.model_prob - read.base_prob
    assert (read.total - change)[real].abs().max() <= FP32_TOL


def test_the_joint_path_takes_its_own_default_steps(llama):
    result = LayerIGLens.from_model(llama).attribute_map(
        torch.tensor([[3, 9]]), path="joint"
    )
    assert result.n_steps == Settings(path="joint").steps == 128
    assert Settings().steps == 50
    assert Settings().replace(path="joint").steps == 128


@pytest.mark.parametrize("n_steps", [1, 3])
def test_exact_at_any_steps(llama, n_steps):
    ids = torch.tensor([[3, 9, 27, 81, 4]])
    result = LayerIGLens.from_model(llama).attribute_map(
        ids, path="joint", n_steps=n_steps, granularity="head"
    )
    change = result.model_prob - result.base_prob
    assert (result.total - change).abs().max() <= FP32_TOL


def _reference(model, ids, steps=4000):
    """``∫ ∇f(γ(α))·Δ_l dα`` per block at the last position, by the midpoint
    rule in float64 with the test's own hooks and autograd; ``f`` is the
    probability of the model's top token under its final norm and head."""
    states, logits = block_states(model, ids, torch.ones_like(ids))
    target = int(logits[0, -1].argmax())
    h = torch.stack([s[0, -1] for s in states]).double()  # (L + 1, d)
    updates = h.diff(dim=0)
    norm = model.model.norm.double()
    head = model.lm_head.double()
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    points = (h[0] + alphas[:, None] * (h[-1] - h[0])).requires_grad_()
    probs = head(norm(points)).softmax(-1)[:, target]
    (grads,) = torch.autograd.grad(probs.sum(), points)
    model.float()
    return updates @ grads.mean(0)


def test_converges_to_the_integral_of_the_joint_path(llama):
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    lens = LayerIGLens.from_model(llama)
    expected = _reference(llama, ids).float()
    for method, n_steps in [("prediction_aware", 256), ("gausslegendre", 64)]:
        result = lens.attribute_map(
            ids, path="joint", positions=[-1], method=method, n_steps=n_steps
        )
        found = result.attributions[0, 0]
        torch.testing.assert_close(found, expected, atol=2e-6, rtol=1e-4)
    telescoping = lens.attribute_map(ids, positions=[-1]).attributions[0, 0]
    assert (telescoping - expected).abs().max() > 1e-4  # another path


def test_the_order_of_the_blocks_does_not_matter():
    """Blocks that add fixed vectors: swapping them swaps their joint credits
    (and changes their telescoping ones)."""

    class Add(nn.Module):
        def __init__(self, v):
            super().__init__()
            self.v = nn.Parameter(torch.tensor(v), requires_grad=False)

        def forward(self, h):
            return h + self.v

    class Toy(nn.Module):
        def __init__(self, vectors):
            super().__init__()
            self.blocks = nn.ModuleList([Add(v) for v in vectors])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    head = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    vectors = [[1.5, 0.0, -0.5], [0.0, 2.0, 0.3]]
    found = {}
    for order in (vectors, vectors[::-1]):
        toy = Toy(order)
        lens = LayerIGLens(toy, list(toy.blocks), readout=Readout(head=head))
        x = torch.zeros(1, 1, 3)
        for path in ("joint", "telescoping"):
            result = lens.attribute_map(x, target=1, path=path)
            found[path, len(found)] = result.attributions[0, 0]
    joint = [v for (p, _), v in found.items() if p == "joint"]
    telescoping = [v for (p, _), v in found.items() if p == "telescoping"]
    torch.testing.assert_close(joint[0], joint[1].flip(0), atol=1e-7, rtol=0)
    assert not torch.allclose(telescoping[0], telescoping[1].flip(0), atol=1e-3)


def test_per_dimension_attributions_are_captum_shaped_and_add_up(llama):
    ids, mask = left_padded([6, 4], VOCAB)
    lens = LayerIGLens.from_model(llama)
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=(mask,),
        path="joint",
        return_convergence_delta=True,
    )
    result = lens.attribute_map(ids, additional_forward_args=(mask,), path="joint")
    assert len(attrs) == 2 and attrs[0].shape == (2, ids.shape[1], 32)
    per_block_sums = torch.stack([a.sum(-1) for a in attrs], -1)
    assert (per_block_sums - result.attributions).abs().max() <= FP32_TOL
    assert delta.abs().max() <= FP32_TOL
    again = lens.compute_convergence_delta(
        attrs, None, ids, additional_forward_args=(mask,), path="joint"
    )
    torch.testing.assert_close(again, delta, atol=FP32_TOL, rtol=0)


def test_a_baseline_is_its_own_input_column_or_refused(llama):
    ids = torch.tensor([[5, 6, 7, 8]])
    lens = LayerIGLens.from_model(llama)
    with pytest.raises(ValueError, match="^baselines: path='joint'.*'block'"):
        lens.attribute_map(ids, path="joint", baselines=0.0)
    with pytest.raises(ValueError, match="^baselines:"):
        Settings(path="joint", baselines="mean")
    Settings(path="joint", baselines="mean", granularity="head")
    result = lens.attribute_map(ids, path="joint", baselines=0.0, granularity="head")
    change = result.model_prob - result.base_prob
    assert (result.total - change).abs().max() <= FP32_TOL
    assert result.layer_names[0] == "input"
    assert result.attributions[..., 0].abs().max() > 0  # h_0 - 0 is credited there
    default = lens.attribute_map(ids, path="joint", granularity="head")
    assert default.attributions[..., 0].abs().max() == 0  # h_0 - h_0


def test_what_has_no_joint_path_is_refused_before_any_forward(llama):
    ids = torch.tensor([[5, 6, 7]])
    plain = LayerIGLens.from_model(llama)
    unmultiplied = LayerIGLens(
        plain.forward_func,
        plain.layers,
        readout=plain.readout,
        multiply_by_inputs=False,
    )
    with pytest.raises(ValueError, match="^multiply_by_inputs: path='joint'"):
        unmultiplied.attribute(ids, path="joint", method="gausslegendre")
    translators = Translators.identity(2, 32)
    with torch.no_grad():
        translators.weight[0].add_(0.01)
    learned = LayerIGLens.from_model(llama, lens=translators)
    with pytest.raises(ValueError, match="^path: 'joint' is not available"):
        learned.attribute_map(ids, path="joint")
    with pytest.raises(ValueError, match="^path: expected one of"):
        LayerIGLens.from_model(llama).attribute_map(ids, path="straight")
    with pytest.raises(ValueError, match="^path: expected one of"):
        Settings(path="straight")


def test_result_files_keep_the_path_and_refuse_an_inconsistent_one(llama, tmp_path):
    ids = torch.tensor([[5, 6, 7]])
    lens = LayerIGLens.from_model(llama)
    # the telescoping path's estimator, so that only the path differs below
    joint = lens.attribute_map(ids, path="joint", method="prediction_aware", n_steps=50)
    joint.save(tmp_path / "joint.json")
    assert IGLensResult.load(tmp_path / "joint.json").path == "joint"
    telescoping = lens.attribute_map(ids)
    assert "path" not in telescoping.to_dict()  # files as before the joint path
    text = (tmp_path / "joint.json").read_text()
    data = json.loads(text)
    assert '"path": "joint"' in text
    data["metadata"] = {"settings": {"path": "telescoping"}}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="path: 'joint' differs from metadata"):
        IGLensResult.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="path"):
        IGLensResult.cat([telescoping, joint])
