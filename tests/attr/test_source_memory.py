"""The source split's memory side: the capture runs the eager attention over
chunks of query rows (never the whole T × T weights or mask), and the factored terms
answer the estimators' reads exactly as the terms they stand for."""

import weakref

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr._utils import attention
from captum_iglens.attr.estimators import prediction_aware
from captum_iglens.attr._utils.component_reads import component_dots, component_norms
from captum_iglens.attr.granularities.source_terms import SourceComponents
from captum_iglens.hf.forward import causal_lm_logits
from tests.helpers import left_padded
from tests.tiny_models import VOCAB, tiny_model


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_chunked_capture_gives_the_same_map(arch, monkeypatch):
    model = tiny_model(arch)
    lens = LayerIGLens.from_model(model)
    ids, mask = left_padded([6, 4], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), granularity="source", n_steps=2)
    whole = lens.attribute_map(ids, **kwargs)
    seen = []
    eager = attention._family_eager

    def counting(module):
        function = eager(module)

        def run(module, query, *args, **kw):
            seen.append(query.shape[2])
            return function(module, query, *args, **kw)

        return run

    masks = []
    make_mask = attention.eager_mask

    def mask_rows(**arguments):
        mask = make_mask(**arguments)
        masks.append(tuple(mask.shape))
        return mask

    monkeypatch.setattr(attention, "CHUNK_BYTES", 1)  # one query row a chunk
    monkeypatch.setattr(attention, "_family_eager", counting)
    monkeypatch.setattr(attention, "eager_mask", mask_rows)
    chunked = lens.attribute_map(ids, **kwargs)
    assert set(seen) == {1}
    # the mask too is made a query row at a time: never (B, 1, T, T)
    assert masks and {shape[2] for shape in masks} == {1}
    torch.testing.assert_close(chunked.attributions, whole.attributions)
    torch.testing.assert_close(chunked.delta, whole.delta)


def test_the_split_among_sources_keeps_to_the_budget(monkeypatch):
    """The prediction-aware split holds (rows, n_steps + 1, C) arrays: with
    C = heads × sources, rows are grouped so that they fit the readout's
    budget (a row at a time at least), with the same credits."""
    model = tiny_model("llama")
    ids, mask = left_padded([24, 20], VOCAB)
    kwargs = dict(additional_forward_args=(mask,), granularity="source", n_steps=4)
    wide = LayerIGLens.from_model(model).attribute_map(ids, **kwargs)
    budget = 64 * 2**10
    seen = []
    shares = prediction_aware.residual_shares

    def recording(first_order, *args):
        seen.append(tuple(first_order.shape))
        return shares(first_order, *args)

    monkeypatch.setattr(prediction_aware, "residual_shares", recording)
    lens = LayerIGLens.from_model(model, max_chunk_bytes=budget)
    narrow = lens.attribute_map(ids, **kwargs)
    entry = prediction_aware._SPLIT_ENTRY_BYTES
    assert seen and all(g == 1 or g * (n + 1) * c * entry <= budget for g, n, c in seen)
    assert max(g for g, _, _ in seen) > 1  # rows are still grouped
    torch.testing.assert_close(narrow.attributions, wide.attributions)


def test_a_groups_split_arrays_are_freed_before_the_next_groups_readout(monkeypatch):
    """Only one group's (g, n_steps + 1, C) arrays exist at a time: none is
    alive when the next group's readout and its backward run."""
    model = tiny_model("llama")
    ids, mask = left_padded([24, 20], VOCAB)
    split = []
    shares = prediction_aware.residual_shares
    readout = prediction_aware.values_and_gradients

    def recording(first_order, *args):
        found = shares(first_order, *args)
        split.extend([weakref.ref(first_order), weakref.ref(found)])
        return found

    alive = []

    def reading(*args, **kwargs):
        alive.append(sum(ref() is not None for ref in split))
        return readout(*args, **kwargs)

    monkeypatch.setattr(prediction_aware, "residual_shares", recording)
    monkeypatch.setattr(prediction_aware, "values_and_gradients", reading)
    lens = LayerIGLens.from_model(model, max_chunk_bytes=64 * 2**10)
    lens.attribute_map(
        ids, additional_forward_args=(mask,), granularity="source", n_steps=4
    )
    assert len(alive) > 1  # several groups
    assert alive == [0] * len(alive)


def _factored(factor: bool, bias: bool, extra: bool) -> SourceComponents:
    torch.manual_seed(0)
    b, p, k, h, h_kv, t, e, d = 2, 3, 2, 4, 2, 5, 3, 7
    rows = b * p * k
    weights = torch.rand(rows, h, t)
    values = [torch.randn(b, h_kv, t, e) for _ in range(k)]
    projections = [torch.randn(d, h * e) for _ in range(k)]
    return SourceComponents(
        weights,
        values,
        projections,
        1.0 if factor else 0.5,
        torch.randn(k, d) if bias else None,
        (rows,),
        p * k,
        factor=torch.rand(rows, d) if factor else None,
        extra=torch.randn(rows, d) if extra else None,
    )


@pytest.mark.parametrize("factor", [False, True])
@pytest.mark.parametrize("bias, extra", [(False, False), (True, True)])
def test_factored_reads_match_the_terms(factor, bias, extra):
    found = _factored(factor, bias, extra)
    rows = torch.tensor([0, 3, 4, 11])
    terms = found[rows]  # (g, C, d), built
    grads = torch.randn(len(rows), 6, terms.shape[-1])
    expected = torch.einsum("gsd,gcd->gsc", grads, terms)
    torch.testing.assert_close(found.dots(rows, grads), expected)
    assert torch.equal(component_dots(terms, slice(None), grads), expected)
    parents = found.parents
    norm, square, group = component_norms(found, rows, parents)
    exact = component_norms(terms, slice(None), parents)
    torch.testing.assert_close(norm, exact[0])
    torch.testing.assert_close(square, exact[1])
    torch.testing.assert_close(group, exact[2])


def test_factored_reads_refuse_other_groups():
    found = _factored(False, False, False)
    with pytest.raises(ValueError, match="parents"):
        component_norms(found, slice(0, 2), torch.zeros_like(found.parents))


@pytest.mark.parametrize("factors", ["scalar", "per_row"])
@pytest.mark.parametrize("bias", [False, True])
def test_neuron_reads_match_the_components(factors, bias):
    from captum_iglens.attr.granularities.neurons import NeuronComponents

    torch.manual_seed(0)
    rows, k, n, d = 6, 2, 5, 4
    found = NeuronComponents(
        torch.randn(rows, n),
        list(torch.randn(k, n, d)),
        torch.full((1, 1), 0.5) if factors == "scalar" else torch.rand(rows, d),
        torch.randn(k, d) if bias else None,
    )
    index = torch.tensor([1, 2, 5])
    terms = found[index]
    grads = torch.randn(len(index), 3, d)
    expected = torch.einsum("gsd,gcd->gsc", grads, terms)
    torch.testing.assert_close(component_dots(found, index, grads), expected)
    norm, square, _ = component_norms(found, index, None)
    torch.testing.assert_close(square, terms.square().sum(-1))
    torch.testing.assert_close(norm, terms.norm(dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_neuron_weights_are_read_in_float32_slices(dtype, monkeypatch):
    """A bfloat16 ``W_out`` is read a few neurons at a time in float32 (never
    the whole block's copy), with the same reads; a float32 one is read as it
    is, not copied."""
    from captum_iglens.attr._utils import float32
    from captum_iglens.attr.granularities import neurons

    torch.manual_seed(0)
    rows, k, n, d = 6, 2, 10, 4
    weights = list(torch.randn(k, n, d).to(dtype))
    found = neurons.NeuronComponents(
        torch.randn(rows, n), weights, torch.rand(rows, d), torch.randn(k, d)
    )
    index, grads = torch.tensor([0, 1, 5]), torch.randn(3, 3, d)
    whole = (found[index], found.dots(index, grads), found.norms(index)[0])
    read = []
    parts = neurons.float32_parts

    def spy(weight, dim, device):
        for part, copy in parts(weight, dim, device):
            read.append((copy.numel(), copy.data_ptr() == weight.data_ptr()))
            yield part, copy

    monkeypatch.setattr(float32, "WEIGHT_BYTES", 3 * 4 * d)  # three neurons
    monkeypatch.setattr(neurons, "float32_parts", spy)
    sliced = (found[index], found.dots(index, grads), found.norms(index)[0])
    for a, b in zip(sliced, whole):
        torch.testing.assert_close(a, b)
    if dtype == torch.float32:
        assert read and all(size == n * d and same for size, same in read)
    else:
        assert len(read) > 3 * k and all(size <= 3 * d for size, _ in read)


def _logit_rows(model, lens, ids, granularity):
    """The map, and how many positions' logits each of the model's own
    forwards returned (the readout calls lm_head alone, not the model)."""
    rows = []
    hook = model.register_forward_hook(
        lambda module, args, out: rows.append(out.logits.shape[1])
    )
    try:
        found = lens.attribute_map(ids, positions=[4, 9, 11], granularity=granularity)
    finally:
        hook.remove()
    return found, set(rows)


@pytest.mark.parametrize("granularity", ["block", "head", "source"])
def test_logits_beyond_one_readout_chunk_are_kept_at_the_attributed_positions(
    granularity,
):
    # At T = 16,384 and a 128k vocabulary all the logits are 8 GiB in float32:
    # where they would not fit in one readout chunk, from_model's forward asks
    # transformers for the attributed positions' logits only, and the map is
    # the one a forward returning all of them gives. Where they fit, every
    # logit is read, as a plain forward reads them.
    model = tiny_model("llama")
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    small = LayerIGLens.from_model(model, max_chunk_bytes=4 * 4 * VOCAB)
    assert small.readout.rows_per_chunk() < ids.numel()
    found, rows = _logit_rows(model, small, ids, granularity)
    assert rows == {3}

    def every_logit(input_ids, attention_mask=None):  # a plain Captum forward
        return causal_lm_logits(
            model, input_ids=input_ids, attention_mask=attention_mask
        )

    whole = LayerIGLens(
        every_logit,
        small.layers,
        readout=small.readout,
        input_layer=small.input_layer,
        sublayers=small.sublayers,
        block_parts=small.block_parts,
    )
    expected = whole.attribute_map(ids, positions=[4, 9, 11], granularity=granularity)
    torch.testing.assert_close(found.attributions, expected.attributions)
    torch.testing.assert_close(found.model_prob, expected.model_prob)
    assert found.delta.abs().max() < 1e-6
    default, rows = _logit_rows(model, LayerIGLens.from_model(model), ids, granularity)
    assert rows == {12}
    assert torch.equal(default.model_prob, expected.model_prob)


def test_a_model_without_logits_to_keep_gets_every_logit():
    class Plain(torch.nn.Module):  # a forward that does not take logits_to_keep
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
            )

    from captum_iglens.hf.forward import CausalLMForward

    model = tiny_model("llama")
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    forward = CausalLMForward(Plain(model))
    with forward.keeping(torch.tensor([2, 5])):
        assert forward.kept is None
        assert forward(ids).shape == (1, 8, VOCAB)
    kept = CausalLMForward(model)
    with kept.keeping(torch.tensor([2, 5])):
        torch.testing.assert_close(kept(ids), forward(ids)[:, [2, 5]])
    assert kept.kept is None  # outside the context: every logit again
