"""Columns as values: every name a granularity makes reads back as its block,
part, index and kind, and writes back to the same string."""

import pytest

from captum_iglens.columns import Column, parse_columns

# Each name the granularities make (docs/granularities.md), with what it holds.
NAMES = {
    "input": Column("input"),
    "3": Column("block", "3"),
    "model.layers.3": Column("block", "model.layers.3"),
    "blocks.0.hook_resid_post": Column("block", "blocks.0.hook_resid_post"),
    "3.attn": Column("sublayer", "3", "attn"),
    "3.mlp": Column("sublayer", "3", "mlp"),
    "3.attn.h11": Column("head", "3", index=11),
    "3.attn.bias": Column("bias", "3", "attn"),
    "3.mlp.n1535": Column("neuron", "3", index=1535),
    "3.mlp.bias": Column("bias", "3", "mlp"),
    "3.mlp.e0": Column("expert", "3", index=0),
    "3.mlp.shared": Column("shared", "3"),
    "3.attn.s7": Column("source", "3", source=7),
    "3.attn.h2.s7": Column("source", "3", index=2, source=7),
    "3.attn.sources": Column("sources", "3"),
    "model.layers.3.mlp.n4": Column("neuron", "model.layers.3", index=4),
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_name_round_trips(name):
    column = Column.parse(name)
    assert column == NAMES[name]
    assert column.name == name and str(column) == name


def test_fields_of_each_kind():
    neuron = Column.parse("3.mlp.n17")
    assert (neuron.kind, neuron.block, neuron.part, neuron.index) == (
        "neuron",
        "3",
        "mlp",
        17,
    )
    assert Column.parse("3.attn.h2").part == "attn"
    assert Column.parse("3.attn.h2.s5").source == 5
    assert Column.parse("input").block is None


def test_parts_of_a_segment_name_it():
    assert Column.parse("3.mlp.n4").segment == Column.parse("3.mlp")
    assert Column.parse("3.attn.h1.s0").segment == Column.parse("3.attn")
    assert Column.parse("3.attn.bias").segment.name == "3.attn"
    for whole in ("input", "3", "3.attn", "3.mlp"):
        assert Column.parse(whole).segment is None


def test_names_the_granularities_never_make_are_whole_blocks():
    # Numbers written otherwise than str(int) would not write back the same.
    for name in ("3.attn.h07", "3.mlp.n-1", "3.mlp.x", "attn"):
        column = Column.parse(name)
        assert column.kind == "block" and column.name == name


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kind="row", block="3"), "kind: expected one of"),
        (dict(kind="head", block="3"), "index: a 'head' column takes an int"),
        (dict(kind="neuron", block="3", index=True), "index:"),
        (dict(kind="neuron", block="3", index=-1), "index:"),
        (dict(kind="neuron", block="3", part="attn", index=1), "part:"),
        (dict(kind="bias", block="3"), "part: a 'bias' column takes part"),
        (dict(kind="sublayer", block="3", part="attn", index=1), "index:"),
        (dict(kind="source", block="3", index=1), "source:"),
        (dict(kind="input", block="3"), "block:"),
        (dict(kind="head", block=None, index=1), "block:"),
        (dict(kind="block", block="3.attn"), "reads back as another column"),
        (dict(kind="block", block="input"), "reads back as another column"),
    ],
)
def test_what_is_no_column_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Column(**fields)


def test_parse_refuses_what_is_no_name():
    for bad in (None, 3, b"3.attn"):
        with pytest.raises(TypeError, match="name: expected a column name"):
            Column.parse(bad)
    # Any string is a column: a block's name need only be a str.
    assert Column.parse("") == Column("block", "")


def test_parse_columns_keeps_the_order():
    names = ["input", "0.attn.h0", "0.attn.bias", "0.mlp"]
    assert [c.name for c in parse_columns(names)] == names


#: Per granularity, the kinds of its columns on a tiny model (Qwen2-MoE: routed
#: experts and a shared one; the others on Llama, whose projections have no bias).
GRANULARITY_KINDS = {
    "block": ("llama", {"block"}),
    "sublayer": ("llama", {"sublayer"}),
    "head": ("llama", {"input", "head", "sublayer"}),
    "neuron": ("llama", {"sublayer", "neuron"}),
    "expert": ("qwen2_moe", {"sublayer", "expert", "shared"}),
    "source": ("llama", {"input", "source", "sublayer"}),
    "source_head": ("llama", {"input", "source", "sublayer"}),
}


@pytest.mark.parametrize("granularity", sorted(GRANULARITY_KINDS))
def test_the_names_of_every_granularity_round_trip(granularity):
    import torch

    from captum_iglens import LayerIGLens
    from captum_iglens.attr.granularities import GRANULARITIES
    from tests.tiny_models import VOCAB, tiny_model

    assert set(GRANULARITY_KINDS) == set(GRANULARITIES)
    arch, kinds = GRANULARITY_KINDS[granularity]
    torch.manual_seed(0)
    lens = LayerIGLens.from_model(tiny_model(arch))
    result = lens.attribute_map(
        torch.randint(1, VOCAB, (1, 4)), granularity=granularity, n_steps=2
    )
    columns = parse_columns(result.layer_names)
    assert [c.name for c in columns] == result.layer_names
    assert {c.kind for c in columns} == kinds
    blocks = {c.block for c in columns} - {None}
    assert blocks == set(lens.layer_names)
