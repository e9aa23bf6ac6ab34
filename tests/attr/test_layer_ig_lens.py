import pytest
import torch
from captum.attr import IntegratedGradients
from captum.attr._utils.approximation_methods import SUPPORTED_METHODS
from torch import nn

from captum_iglens import IGLensResult, LayerIGLens, Readout
from captum_iglens.attr._utils.path_math import split_weights
from captum_iglens.hf import model_parts
from tests.helpers import block_states, left_padded
from tests.tiny_models import ARCHITECTURES, VOCAB, tiny_model

FP32_TOL = 1e-6


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(0)
    return left_padded([7, 4], VOCAB)


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("n_steps", [1, 2, 7, 50])
def test_completeness_map_and_per_dimension(lens, batch, n_steps):
    ids, mask = batch
    result = lens.attribute_map(ids, additional_forward_args=(mask,), n_steps=n_steps)
    real = result.mask
    change = result.model_prob - result.base_prob
    assert (result.total - change)[real].abs().max() <= FP32_TOL
    assert result.delta[real].abs().max() <= FP32_TOL
    attrs, delta = lens.attribute(
        ids,
        additional_forward_args=(mask,),
        n_steps=n_steps,
        return_convergence_delta=True,
    )
    per_layer = torch.stack([a.sum(-1) for a in attrs], dim=-1)
    assert delta.shape == (2, ids.shape[1])
    assert delta.abs().max() <= FP32_TOL
    assert (per_layer - result.attributions).abs().max() <= FP32_TOL
    # Padding is attributed nothing.
    assert not result.mask[1, :3].any() and (per_layer[1, :3] == 0).all()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_exact_top_and_completeness_every_architecture(arch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids = torch.randint(0, VOCAB, (2, 6))
    result = lens.attribute_map(ids)
    states, logits = block_states(model, ids, torch.ones_like(ids))
    probs = logits.float().softmax(-1)
    expected = probs.gather(-1, result.targets[..., None])[..., 0]
    with torch.no_grad():
        read = lens.readout(states[-1]).float().softmax(-1)
    top = read.gather(-1, result.targets[..., None])[..., 0]
    assert (top - expected).abs().max() <= FP32_TOL  # f(h_final) = p_model
    assert (result.model_prob - expected).abs().max() <= FP32_TOL
    assert (result.levels[..., -1] - expected).abs().max() <= FP32_TOL
    assert result.delta.abs().max() <= FP32_TOL
    assert (result.targets == probs.argmax(-1)).all()


def test_matches_hand_computed_path(llama, batch):
    """Credits equal softmax differences of independently captured states."""
    ids, mask = batch
    states, logits = block_states(llama, ids, mask)
    readout = model_parts(llama).readout()
    lens = LayerIGLens.from_model(llama, layers=[0])
    result = lens.attribute_map(ids, additional_forward_args=(mask,))
    target = logits.argmax(-1)
    with torch.no_grad():
        f = [
            readout(s).float().softmax(-1).gather(-1, target[..., None])[..., 0]
            for s in states
        ]
    expected = torch.stack([f[1] - f[0], f[-1] - f[1]], dim=-1) * mask[..., None]
    assert result.layer_names == ["0", str(len(states) - 2)]
    assert torch.allclose(result.attributions, expected, atol=FP32_TOL)


def test_closed_form_toy_model():
    """Blocks add known vectors and the head is the identity: credits are softmaxes."""

    class Add(nn.Module):
        def __init__(self, v):
            super().__init__()
            self.v = v

        def forward(self, h):
            return h + self.v

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                [Add(torch.tensor([1.0, 0, 0])), Add(torch.tensor([0, 2.0, 0]))]
            )
            self.head = nn.Identity()

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    head = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    toy = Toy()
    toy.head = head
    lens = LayerIGLens(toy, toy.blocks, readout=Readout(head=head))
    x = torch.zeros(1, 1, 3)
    result = lens.attribute_map(x, target=1)
    p = [
        torch.softmax(torch.tensor(v), 0)[1]
        for v in ([0.0, 0, 0], [1.0, 0, 0], [1.0, 2, 0])
    ]
    assert torch.allclose(
        result.attributions[0, 0], torch.stack([p[1] - p[0], p[2] - p[1]])
    )


@pytest.mark.parametrize("method", SUPPORTED_METHODS)
def test_gradient_methods_equal_captum_integrated_gradients(llama, method):
    ids = torch.randint(0, VOCAB, (1, 5))
    mask = torch.ones_like(ids)
    states, logits = block_states(llama, ids, mask)
    readout = model_parts(llama).readout()
    target = logits.argmax(-1)[0]
    lens = LayerIGLens.from_model(llama)
    attrs = lens.attribute(ids, target=target[None], n_steps=8, method=method)
    ig = IntegratedGradients(lambda h: readout(h).float().softmax(-1))
    for j, attr in enumerate(attrs):
        expected = ig.attribute(
            states[j + 1][0],
            baselines=states[j][0],
            target=target.tolist(),
            n_steps=8,
            method=method,
        )
        assert torch.allclose(attr[0], expected, atol=1e-5), (method, j)


@pytest.mark.parametrize("method", SUPPORTED_METHODS)
def test_gradient_methods_converge(lens, batch, method):
    ids, mask = batch
    deltas = [
        lens.attribute(
            ids,
            additional_forward_args=(mask,),
            method=method,
            n_steps=n,
            return_convergence_delta=True,
        )[1]
        .abs()
        .mean()
        for n in (4, 64)
    ]
    assert deltas[1] < deltas[0]


def test_trapezoid_bias_follows_captum_weights(lens, batch):
    """Captum 0.9's trapezoid weights sum to 1 - 1/n; the delta shows that bias."""
    ids, mask = batch
    result = lens.attribute_map(ids, additional_forward_args=(mask,))
    n = 16
    _, delta = lens.attribute(
        ids,
        additional_forward_args=(mask,),
        method="riemann_trapezoid",
        n_steps=n,
        return_convergence_delta=True,
    )
    change = (result.model_prob - result.base_prob) * result.mask
    assert torch.allclose(delta, -change / n, atol=2e-3)


def test_split_weights_handle_zero_gradient():
    grads = torch.tensor([[[3.0, 4.0]], [[0.0, 0.0]], [[0.0, 0.0]]])
    direction = torch.tensor([[[1.0, 1.0]], [[1.0, 3.0]], [[0.0, 0.0]]])
    w = split_weights(grads, direction)
    assert torch.allclose(w[0], torch.tensor([[0.36, 0.64]]))
    assert torch.allclose(w[1], torch.tensor([[0.1, 0.9]]))
    assert (w[2] == 0).all()


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("baselines", [0, 0.5, "mean", "tensor"])
def test_baselines_keep_completeness(lens, batch, baselines):
    ids, mask = batch
    if baselines == "tensor":
        baselines = torch.randn(1, 1, 32)
    result = lens.attribute_map(
        ids, baselines=baselines, additional_forward_args=(mask,)
    )
    assert result.delta.abs().max() <= FP32_TOL
    default = lens.attribute_map(ids, additional_forward_args=(mask,))
    assert not torch.allclose(result.base_prob, default.base_prob)
    assert torch.allclose(result.levels, default.levels)


def test_batch_invariance_and_internal_batch_size(lens, batch):
    ids, mask = batch
    together = lens.attribute(ids, additional_forward_args=(mask,), n_steps=5)
    for row, length in enumerate((7, 4)):
        alone = lens.attribute(ids[row : row + 1, -length:], n_steps=5)
        for a, b in zip(together, alone):
            assert torch.allclose(a[row, -length:], b[0], atol=1e-5)
    for size in (4, 20):
        chunked = lens.attribute(
            ids, additional_forward_args=(mask,), n_steps=5, internal_batch_size=size
        )
        for a, b in zip(together, chunked):
            assert torch.allclose(a, b, atol=1e-6)


def test_positions_and_targets(lens, batch):
    ids, mask = batch
    full = lens.attribute_map(ids, additional_forward_args=(mask,))
    some = lens.attribute_map(ids, additional_forward_args=(mask,), positions=[-1, 3])
    assert some.positions.tolist() == [6, 3]
    assert torch.allclose(
        some.attributions, full.attributions[:, [6, 3]], atol=FP32_TOL
    )
    per_example = lens.attribute_map(
        ids, additional_forward_args=(mask,), target=[5, 9]
    )
    assert (per_example.targets == torch.tensor([[5], [9]])).all()
    per_position = torch.randint(0, VOCAB, (2, 2))
    explicit = lens.attribute_map(
        ids, additional_forward_args=(mask,), positions=[-1, 3], target=per_position
    )
    assert (explicit.targets == per_position).all()
    assert explicit.delta.abs().max() <= FP32_TOL


def test_last_position_logits_and_single_layer(llama):
    blocks = model_parts(llama).blocks
    lens = LayerIGLens(
        lambda ids: llama(ids).logits[:, -1],
        blocks[-1],
        readout=model_parts(llama).readout(),
        input_layer=blocks[0],
    )
    ids = torch.randint(0, VOCAB, (2, 5))
    attr, delta = lens.attribute(ids, return_convergence_delta=True)
    assert isinstance(attr, torch.Tensor) and attr.shape == (2, 1, 32)
    assert delta.abs().max() <= FP32_TOL
    with pytest.raises(ValueError, match="positions"):
        lens.attribute(ids, positions=[0])


def test_module_list_returns_list_and_captum_conventions(llama):
    lens = LayerIGLens(
        lambda ids: llama(ids),
        llama.model.layers,
        readout=model_parts(llama).readout(),
    )
    out = lens.attribute(torch.randint(0, VOCAB, (1, 3)))
    assert isinstance(out, list) and len(out) == len(llama.model.layers)
    assert LayerIGLens.get_name() == "Layer IG-Lens"
    assert lens.has_convergence_delta() and lens.multiplies_by_inputs
    assert hasattr(LayerIGLens.attribute, "__wrapped__")
    with pytest.raises(NotImplementedError):
        lens.attribute_future()


def test_result_round_trip_and_onset(lens, batch, tmp_path):
    ids, mask = batch
    result = lens.attribute_map(ids, additional_forward_args=(mask,))
    result.save(tmp_path / "r.json")
    back = IGLensResult.load(tmp_path / "r.json")
    assert torch.equal(back.attributions, result.attributions)
    assert back.layer_names == result.layer_names and back.mask.dtype == torch.bool
    onset = result.onset(0.5)
    cumulative = result.attributions.abs().cumsum(-1)
    total = cumulative[..., -1]
    for b, p in zip(*torch.nonzero(result.mask, as_tuple=True)):
        j = onset[b, p]
        assert cumulative[b, p, j] >= 0.5 * total[b, p] * (1 - 1e-6)
        assert j == 0 or cumulative[b, p, j - 1] < 0.5 * total[b, p]
    assert (onset[~result.mask] == -1).all()
    assert (result.onset(1.0)[result.mask] <= len(result.layer_names) - 1).all()


# ---------------------------------------------------------------- cost


def test_map_is_one_forward_and_no_backward(lens, batch, monkeypatch):
    ids, mask = batch
    calls = []
    forward = lens.forward_func

    def counting(*args):
        calls.append(1)
        return forward(*args)

    lens_counting = LayerIGLens(
        counting, lens.layers, readout=lens.readout, input_layer=lens.input_layer
    )

    def no_backward(*args, **kwargs):
        raise AssertionError("backward was called")

    monkeypatch.setattr(torch.autograd, "grad", no_backward)
    monkeypatch.setattr(torch.autograd, "backward", no_backward)
    result = lens_counting.attribute_map(ids, additional_forward_args=(mask,))
    assert len(calls) == 1
    assert result.delta.abs().max() <= FP32_TOL


def test_readout_rows_bounded_by_chunk(llama, batch):
    ids, mask = batch
    lens = LayerIGLens.from_model(llama, max_chunk_bytes=VOCAB * 8 * 3)
    seen = []
    handle = lens.readout.register_forward_pre_hook(
        lambda m, a: seen.append(a[0].shape[0])
    )
    try:
        result = lens.attribute_map(ids, additional_forward_args=(mask,))
    finally:
        handle.remove()
    assert max(seen) <= 3
    assert result.delta.abs().max() <= FP32_TOL


@pytest.mark.parametrize("granularity", ["head", "block"])
def test_backward_rows_bounded_by_chunk(llama, batch, granularity):
    # A backward pass keeps the log-softmax and adds two (rows, V) gradients: the
    # budget of 6 forward rows allows 4 rows a backward pass.
    ids, mask = batch
    lens = LayerIGLens.from_model(llama, max_chunk_bytes=VOCAB * 8 * 6)
    assert lens.readout.rows_per_chunk(backward=True) == 4
    seen = []
    handle = lens.readout.register_forward_pre_hook(
        lambda m, a: seen.append(a[0].shape[0]) if torch.is_grad_enabled() else None
    )
    try:
        if granularity == "head":
            lens.attribute_map(ids, None, None, (mask,), granularity="head")
        else:
            lens.attribute(ids, additional_forward_args=(mask,), n_steps=4)
    finally:
        handle.remove()
    assert seen and max(seen) == 4


def test_api_type_errors_name_the_argument(llama):
    # Issue 35: a ValueError or TypeError naming the argument, not torch's
    # IndexError, an AttributeError or silent zeros.
    from captum_iglens import attribute_text
    from tests.helpers import word_tokenizer

    parts = model_parts(llama)
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7], [5, 6, 0]])
    for bad in (VOCAB, -1):
        baselines = torch.tensor([[5, 6, bad], [5, 6, 7]])
        with pytest.raises(ValueError, match=f"baselines: token id {bad} is outside"):
            lens.attribute(ids, target=8, baselines=baselines)
    with pytest.raises(TypeError, match="answer: expected None, a string or token"):
        attribute_text(llama, word_tokenizer(VOCAB), "w5 w6", answer=5)
    with pytest.raises(TypeError, match="lens: expected None"):
        LayerIGLens.from_model(llama, lens=123)
    last = LayerIGLens(
        lambda ids, attention_mask: llama(ids, attention_mask=attention_mask).logits[
            :, -1
        ],
        parts.blocks[-1],
        readout=parts.readout(),
        input_layer=parts.blocks[0],
    )
    right_padded = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match="attention_mask: row 1 ends in padding"):
        last.attribute(ids, target=8, additional_forward_args=(right_padded,))
    left_padded = torch.tensor([[1, 1, 1], [0, 1, 1]])
    credits = last.attribute(ids, target=8, additional_forward_args=(left_padded,))
    assert credits.abs().sum(-1).gt(0).all()
