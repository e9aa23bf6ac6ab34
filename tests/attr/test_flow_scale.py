"""Probability flow at scale on tiny random models: the path points and the
receivers of a step chosen from the memory budget (the same flows whatever the
budget), an explicit batch checked against it, a bfloat16 model (flows summed
in float64: exact; edges near the float32 model's), and ROME's subject noise
as the path's start (``corrupt_subject``)."""

import pytest
import torch

from captum_iglens.attr.subject_noise import NOISE_SCALE, noise_draw
from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.attr.flow.budget import point_bytes, points_at_once
from captum_iglens.attr.flow.engine import first_block_inputs
from captum_iglens.graph.model_graph import model_graph
from captum_iglens.attr.flow.subject_start import noised_start, subject_positions
from captum_iglens.studies.validation.options import StudyOptions
from tests.tiny_models import tiny_model, tiny_tokenizer

IDS = torch.tensor([[1, 5, 9, 17, 33, 7, 40]])
OTHER = torch.tensor([[1, 5, 10, 18, 33, 7, 41]])
TEXT = "t5 t9 t40 t41 t7 t42"  # with BOS: 1 5 9 40 41 7 42


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _check_exact(graph, tol=1e-6):
    assert graph.completeness_error <= tol and graph.conservation_error <= tol
    into = sum(f for e, f in graph.edge_scores().items() if e.endswith("->logits"))
    assert abs(into - graph.delta_m) <= tol


def test_points_at_once_from_the_budget():
    assert points_at_once(100, 17, None, 1000) == 10
    assert points_at_once(100, 5, None, 1000) == 5
    assert points_at_once(5000, 17, None, 1000) == 1  # one point is the floor
    assert points_at_once(5000, 17, 1, 1000) == 1
    assert points_at_once(100, 17, 3, 1000) == 3  # an explicit batch wins
    with pytest.raises(ValueError, match="internal_batch_size: 11 path points"):
        points_at_once(100, 17, 11, 1000)


def test_point_bytes_grow_with_the_prompt(llama):
    parts = ProbabilityFlow(llama).parts
    layout = model_graph(len(parts.blocks), 4, qkv=True)
    short, long = point_bytes(parts, layout, 10), point_bytes(parts, layout, 1000)
    assert long > 100 * short  # the attention's T × T arrays: faster than T
    # by receiver position, every receiver's gradient is kept T times
    receivers = (len(layout.receivers) - 1) * 10 * llama.config.hidden_size * 4
    paired = point_bytes(parts, layout, 10, pairs=True)
    assert paired >= short + 9 * receivers


@pytest.mark.parametrize("method", ["exact", "first_order"])
def test_same_flows_whatever_the_budget(llama, method):
    flow = ProbabilityFlow(llama)
    common = dict(counterfactual=OTHER, n_steps=5, qkv=True, per_position=True)
    wide = flow.attribute(IDS, method=method, **common)
    tight = flow.attribute(IDS, method=method, max_chunk_bytes=1, **common)
    # float32 rounding of forwards batched differently, nothing more
    assert abs(wide.flows - tight.flows).max() <= 1e-6
    assert abs(wide.position_flows - tight.position_flows).max() <= 1e-6
    if method == "exact":
        _check_exact(tight)


@pytest.mark.parametrize(
    "kwargs, error, named",
    [
        (dict(internal_batch_size=4, max_chunk_bytes=1), ValueError, "internal_batch"),
        (dict(max_chunk_bytes=0), ValueError, "max_chunk_bytes: expected an int"),
        (dict(max_chunk_bytes=1.5), TypeError, "max_chunk_bytes: expected an int"),
        (dict(internal_batch_size=2.0), TypeError, "internal_batch_size"),
    ],
)
def test_budget_arguments_refused_before_the_model_runs(llama, kwargs, error, named):
    calls = []
    handle = llama.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match=named):
            ProbabilityFlow(llama).attribute(IDS, counterfactual=OTHER, **kwargs)
    finally:
        handle.remove()
    assert calls == []


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_bfloat16_model(family):
    """Writes and gradients in bfloat16, terms in float32, flows summed in
    float64: completeness and conservation hold to float64 rounding; the edges
    are the float32 model's within bfloat16's precision (measured: 1.4 % and
    2.2 % of the largest edge)."""
    half = tiny_model(family).to(torch.bfloat16)
    full = tiny_model(family)
    common = dict(counterfactual=OTHER, n_steps=4, qkv=True, target=11)
    graph = ProbabilityFlow(half).attribute(IDS, **common)
    reference = ProbabilityFlow(full).attribute(IDS, **common)
    assert graph.flows.dtype == reference.flows.dtype
    assert abs(graph.delta_m) > 1e-4
    _check_exact(graph, tol=1e-9)
    largest = abs(reference.flows).max()
    assert abs(graph.flows - reference.flows).max() <= 0.05 * largest


def test_corrupt_subject_noises_exactly_the_subject():
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    flow = ProbabilityFlow(model, tokenizer)
    graph = flow.attribute(TEXT, corrupt_subject="t40 t41", n_steps=3, target=11)
    _check_exact(graph)
    assert abs(graph.delta_m) > 1e-4
    assert graph.counterfactual["kind"] == "subject_noise"
    assert graph.counterfactual["positions"] == [3, 4]
    assert graph.counterfactual["subject"] == "t40 t41"
    assert graph.counterfactual["noise_scale"] == NOISE_SCALE
    assert (graph.input_flows[[0, 1, 2, 5, 6]] == 0).all()  # only the subject moves
    assert (graph.input_flows[[3, 4]] != 0).all()
    mask = subject_positions(tokenizer, TEXT, "t40 t41", 7)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    start, record = noised_start(flow.parts, ids, mask, NOISE_SCALE, 0)
    draw = noise_draw(torch.ones_like(ids), mask[None], 0, 32, record["noise_std"])
    assert torch.allclose(start - first_block_inputs(flow.parts, ids), draw)
    again = flow.attribute(TEXT, corrupt_subject="t40 t41", n_steps=3, target=11)
    assert (again.flows == graph.flows).all()  # the seed fixes the draw
    other = flow.attribute(
        TEXT, corrupt_subject="t40 t41", noise_seed=1, n_steps=3, target=11
    )
    assert (other.flows != graph.flows).any()


def test_the_study_and_the_flow_share_the_noise():
    assert StudyOptions().noise_scale == NOISE_SCALE


@pytest.mark.parametrize(
    "prompt, kwargs, error, named",
    [
        (TEXT, dict(corrupt_subject="t99"), ValueError, "'t99' is not in the prompt"),
        (TEXT, dict(corrupt_subject=" "), ValueError, "corrupt_subject: expected"),
        (IDS, dict(corrupt_subject="t40"), ValueError, "needs the prompt as text"),
        (
            TEXT,
            dict(corrupt_subject="t40", counterfactual=TEXT),
            ValueError,
            "not both",
        ),
        (TEXT, dict(corrupt_subject="t40", noise_seed=-1), ValueError, "noise_seed"),
        (TEXT, dict(corrupt_subject="t40", noise_seed="0"), TypeError, "noise_seed"),
    ],
)
def test_corrupt_subject_refused_before_the_model_runs(prompt, kwargs, error, named):
    model = tiny_model("llama")
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match=named):
            ProbabilityFlow(model, tiny_tokenizer()).attribute(prompt, **kwargs)
    finally:
        handle.remove()
    assert calls == []
