"""The ``"adaptive"`` estimator: its quadrature rule, exact sums at any budget,
and error bounds that hold against an independent, converged reference (tiny
models here; the embedded models in the ``real_model`` tests)."""

import math

import numpy as np
import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.estimators.adaptive import gauss_kronrod, logit_range


def test_the_panel_rule_is_the_gauss_kronrod_pair():
    points, kronrod, gauss = gauss_kronrod(3)
    # G3: the roots of P_3, ±sqrt(3/5) and 0, weights 5/9, 8/9, 5/9
    at_gauss = gauss != 0
    expected = torch.tensor([-math.sqrt(0.6), 0.0, math.sqrt(0.6)], dtype=torch.float64)
    torch.testing.assert_close(points[at_gauss], expected)
    torch.testing.assert_close(
        gauss[at_gauss], torch.tensor([5 / 9, 8 / 9, 5 / 9], dtype=torch.float64)
    )
    # K7 integrates x^k exactly to degree 3n + 1 = 10, and not x^12
    for k in range(11):
        exact = (1 - (-1) ** (k + 1)) / (k + 1)
        assert abs(float((kronrod * points**k).sum()) - exact) < 1e-13, k
    assert abs(float((kronrod * points**12).sum()) - 2 / 13) > 1e-6
    assert len(points) == 7 and bool((points.diff() > 0).all())


def test_the_logit_range_leaves_out_little_of_either_end():
    ends = torch.stack([torch.ones(1, 4), 250 * torch.ones(1, 4)], 1)
    low, high = logit_range(ends)[0].tolist()
    # below α = e^low the start dominates; the range reaches further the
    # smaller the start's norm is beside the end's
    assert low == pytest.approx(-14 - math.log(250)) and high == pytest.approx(14)
    flipped = logit_range(ends.flip(1))[0].tolist()
    assert flipped == pytest.approx([-14, 14 + math.log(250)])


@pytest.mark.parametrize("n_steps", [1, 3, 7, 20, 128])
@pytest.mark.parametrize("granularity", ["block", "head", "neuron"])
def test_exact_at_any_budget_and_consistent_across_granularities(
    llama, n_steps, granularity
):
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    kwargs = dict(path="joint", method="adaptive", n_steps=n_steps)
    result = lens.attribute_map(ids, granularity=granularity, **kwargs)
    change = result.model_prob - result.base_prob
    assert (result.total - change).abs().max() <= 1e-6
    assert result.credit_error is not None
    assert result.credit_error.shape == result.attributions.shape
    assert bool((result.credit_error >= 0).all())
    if (
        granularity != "block"
    ):  # the components of a block add up to its credit in the block map
        blocks = lens.attribute_map(ids, **kwargs)
        names = result.layer_names
        for j, block in enumerate(blocks.layer_names):
            mine = [i for i, name in enumerate(names) if name.split(".")[0] == block]
            summed = result.attributions[..., mine].sum(-1)
            torch.testing.assert_close(
                summed, blocks.attributions[..., j], atol=2e-6, rtol=0
            )


def _trace(model, ids):
    """The residual stream at the last position, ``(L + 1, d)``, each
    attention's per-head writes ``(L, H, d)`` (through ``o_proj``, which has no
    bias in these models) and the greedy target."""
    states, heads = [], []

    def keep(module, args, output):
        states.append((output[0] if isinstance(output, tuple) else output)[0, -1])

    def split(module, args):
        z = args[0][0, -1]  # (H · d_head,) at the last position
        n = model.config.num_attention_heads
        w = module.weight.view(module.weight.shape[0], n, -1)  # (d, H, d_head)
        heads.append(torch.einsum("dhk,hk->hd", w, z.view(n, -1)))

    layers = model.model.layers
    hooks = [layer.register_forward_hook(keep) for layer in layers]
    hooks += [
        layer.self_attn.o_proj.register_forward_pre_hook(split) for layer in layers
    ]
    hooks.append(
        layers[0].register_forward_pre_hook(lambda m, a: states.insert(0, a[0][0, -1]))
    )
    try:
        with torch.no_grad():
            target = int(model(ids).logits[0, -1].argmax())
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(states).double(), torch.stack(heads).double(), target


def _integral(model, stream, updates, target, panels: int, nodes: int = 8):
    """``∫ ∇f(γ(α)) · u_c dα`` along ``stream[0] → stream[-1]`` for the rows
    ``u_c`` of ``updates``, by autograd through the model's final norm and
    head, on ``panels`` equal panels of an ``nodes``-point Gauss–Legendre rule
    in ``t`` with ``α = t²`` (which crowds the points where the direction
    turns), in float64 sums."""
    x, w = (torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(nodes))
    t = ((torch.arange(panels)[:, None] + (x[None] + 1) / 2) / panels).flatten()
    weights = (w[None] / 2 / panels).expand(panels, -1).flatten() * 2 * t
    points = stream[0] + (t**2)[:, None] * (stream[-1] - stream[0])
    cap = getattr(model.config, "final_logit_softcapping", None)
    total = torch.zeros(len(updates), dtype=torch.float64)
    for rows in torch.split(torch.arange(len(t)), 256):
        h = points[rows].float().requires_grad_(True)
        logits = model.lm_head(model.model.norm(h))
        if cap:
            logits = torch.tanh(logits / cap) * cap
        (grad,) = torch.autograd.grad(logits.softmax(-1)[:, target].sum(), h)
        total += (grad.double() @ updates.T * weights[rows, None]).sum(0)
    return total


def _reference(model, ids, panels: int):
    """Per-block credits of the joint path at the last position, and the
    target."""
    stream, _, target = _trace(model, ids)
    return _integral(model, stream, stream.diff(dim=0), target, panels), target


def test_the_bound_holds_against_an_independent_reference(llama):
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    coarse, target = _reference(llama, ids, 64)
    fine, _ = _reference(llama, ids, 128)
    assert (coarse - fine).abs().max() < 1e-7  # the reference has converged
    for n_steps in (7, 35, 128):
        result = lens.attribute_map(
            ids, target=target, positions=[-1], path="joint", n_steps=n_steps
        )
        assert result.method == "adaptive"  # the joint path's default
        error = (result.attributions[0, 0].double() - fine).abs()
        assert bool((error <= result.credit_error[0, 0].double() + 1e-7).all())


def test_the_heads_carry_error_bars_that_bound_an_independent_reference(llama):
    """At head granularity every column (``input``, each head, each MLP) has
    its own bar, and it bounds the column's distance from the integral of the
    head's own write, computed here from ``o_proj``'s input."""
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    stream, heads, target = _trace(llama, ids)
    mids = stream[:-1] + heads.sum(1)  # each block's stream after its attention
    columns = [stream[0] * 0]  # "input": h_0 - h_base, zero without a baseline
    for layer in range(len(heads)):
        columns += [*heads[layer], stream[layer + 1] - mids[layer]]
    fine = _integral(llama, stream, torch.stack(columns), target, 128)
    coarse = _integral(llama, stream, torch.stack(columns), target, 64)
    assert (coarse - fine).abs().max() < 1e-7  # the reference has converged
    for n_steps in (7, 35, 128):
        result = lens.attribute_map(
            ids,
            target=target,
            positions=[-1],
            granularity="head",
            path="joint",
            n_steps=n_steps,
        )
        assert len(result.layer_names) == len(columns)
        assert result.credit_error is not None
        assert result.credit_error.shape == result.attributions.shape
        error = (result.attributions[0, 0].double() - fine).abs()
        assert bool((error <= result.credit_error[0, 0].double() + 1e-7).all())
    # at the default budget the bars are tight, not the whole credit
    assert result.credit_error.max() < 1e-3 * result.attributions.abs().max()


@pytest.mark.slow
@pytest.mark.real_model
def test_the_bound_holds_and_the_default_is_within_1e_5_on_real_weights(
    embedded_model,
):
    """At the answer of "The capital of France is" (the joint path's default:
    ``adaptive`` at 128 evaluations), against the reference at 512 and 1,024
    points."""
    name, model, tokenizer = embedded_model
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    coarse, target = _reference(model, ids, 64)
    fine, _ = _reference(model, ids, 128)
    assert (coarse - fine).abs().max() < 1e-6, name  # the reference converged
    lens = LayerIGLens.from_model(model)
    result = lens.attribute_map(ids, target=target, positions=[-1], path="joint")
    error = (result.attributions[0, 0].double() - fine).abs()
    assert error.max() <= 1e-5, (name, float(error.max()))
    assert bool((error <= result.credit_error[0, 0].double() + 1e-6).all()), name


@pytest.mark.parametrize("path", ["telescoping", "joint"])
def test_per_dimension_attributions_add_up_on_both_paths(llama, path):
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    attrs, delta = lens.attribute(
        ids, method="adaptive", n_steps=21, path=path, return_convergence_delta=True
    )
    assert delta.abs().max() <= 1e-6
    # the same credits as the map, summed over the dimensions
    found = torch.stack([a.sum(-1) for a in attrs], -1)
    result = lens.attribute_map(ids, method="adaptive", n_steps=21, path=path)
    torch.testing.assert_close(
        found[:, -1], result.attributions[:, -1], atol=1e-6, rtol=0
    )
