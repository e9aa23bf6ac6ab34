"""Granularities are strategies in one registry; the path is traced once, by
the lens and by the studies alike."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.granularities import (
    GRANULARITIES,
    PathGranularity,
    check_granularity,
)
from captum_iglens.attr.tracing import TracedPath, path_levels
from tests.tiny_models import VOCAB, tiny_model


@pytest.fixture(scope="module")
def lens():
    return LayerIGLens.from_model(tiny_model("llama"))


def test_the_registry_names_each_granularity_once():
    assert list(GRANULARITIES) == [
        "block",
        "sublayer",
        "head",
        "source",
        "source_head",
        "neuron",
        "expert",
    ]
    for name, kind in GRANULARITIES.items():
        assert issubclass(kind, PathGranularity) and kind.name == name
    with pytest.raises(ValueError, match=r"granularity: expected one of \['block'"):
        check_granularity("neurons")


@pytest.mark.parametrize("granularity", ["block", "sublayer", "head", "neuron"])
def test_the_traced_path_is_the_one_the_map_reads(lens, granularity):
    ids = torch.randint(1, VOCAB, (2, 5))
    path = lens.trace_path(ids, granularity=granularity)
    assert isinstance(path, TracedPath)
    assert path.names == lens.segment_names(granularity)
    assert (path.components is not None) == (granularity in ("head", "neuron"))
    found = lens.attribute_map(ids, granularity=granularity)
    levels = path_levels(lens.readout, path, lens.readout.rows_per_chunk())[0]
    shape = lens._granularity(granularity)
    levels = shape.levels(path, levels).float()
    torch.testing.assert_close(levels[..., 0], found.base_prob, rtol=0, atol=0)
    torch.testing.assert_close(levels[..., 1:], found.levels, rtol=0, atol=0)
    assert torch.equal(path.targets, found.targets)


def test_head_without_the_displacement_is_refused_before_the_forward(llama):
    lens = LayerIGLens.from_model(llama)
    unmultiplied = LayerIGLens(
        lens.forward_func,
        lens.layers,
        multiply_by_inputs=False,
        readout=lens.readout,
        input_layer=lens.input_layer,
        sublayers=lens.sublayers,
        block_parts=lens.block_parts,
    )
    calls = []
    handle = llama.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match='granularity="head"'):
            unmultiplied.attribute(
                torch.tensor([[1, 2, 3]]), method="gausslegendre", granularity="head"
            )
    finally:
        handle.remove()
    assert calls == []


def test_help_lists_every_granularity(capsys):
    from captum_iglens.attr.granularities import granularity_help
    from captum_iglens.cli import main

    text = granularity_help()
    for name in GRANULARITIES:
        assert GRANULARITIES.summary(name)
        assert f"{name!r}: {GRANULARITIES.summary(name)}" in text
    with pytest.raises(SystemExit):
        main(["attribute", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for name in GRANULARITIES:
        assert f"'{name}': " in shown


@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_model_columns_are_the_lens_columns_without_the_lens(granularity):
    from captum_iglens.attr.granularities import model_columns
    from captum_iglens.hf import model_parts

    parts = model_parts(tiny_model("llama"))
    lens = LayerIGLens.from_model(parts, [0])
    if granularity == "expert":  # a dense model: refused by both alike
        with pytest.raises(ValueError, match="granularity: 'expert'"):
            model_columns(parts, [0], granularity)
        return
    assert model_columns(parts, [0], granularity) == lens.segment_names(granularity)
