"""IGLensResult: checked on construction and on load, sliced, concatenated."""

import json
import re
from dataclasses import replace

from pathlib import Path

import pytest
import torch

from captum_iglens import IGLensResult
from tests.helpers import left_padded
from tests.tiny_models import VOCAB


@pytest.fixture
def result(lens):
    torch.manual_seed(0)
    ids, mask = left_padded([6, 4, 5], VOCAB)
    res = lens.attribute_map(ids, additional_forward_args=(mask,))
    res.tokens = [[f"t{b}{p}" for p in range(res.positions.numel())] for b in range(3)]
    res.metadata = {"note": "test"}
    return res


def _same(a: IGLensResult, b: IGLensResult) -> None:
    for name in ("attributions", "levels", "base_prob", "model_prob", "delta"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    for name in ("targets", "positions", "mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.layer_names, a.method, a.n_steps, a.tokens, a.metadata) == (
        b.layer_names,
        b.method,
        b.n_steps,
        b.tokens,
        b.metadata,
    )


def test_save_load_round_trip(result, tmp_path):
    path = tmp_path / "r.json"
    result.save(path)
    _same(IGLensResult.load(path), result)
    assert json.loads(path.read_text())["kind"] == "IGLensResult"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no partial file


def test_select_and_cat(result):
    one = result.select(batch=1, positions=[0, 2])
    assert one.attributions.shape == (1, 2, result.attributions.shape[-1])
    assert torch.equal(one.attributions[0], result.attributions[1, [0, 2]])
    assert torch.equal(one.positions, result.positions[[0, 2]])
    assert one.tokens == [["t10", "t12"]]
    _same(
        IGLensResult.cat([result.select(batch=[0]), result.select(batch=[1, 2])]),
        result,
    )
    _same(result.select(batch=slice(None), positions=slice(None)), result)
    empty = result.select(batch=[0], positions=[])
    assert empty.attributions.shape == (1, 0, len(result.layer_names))
    with pytest.raises(ValueError, match="batch"):
        result.select(batch=3)
    with pytest.raises(ValueError, match="positions differ"):
        IGLensResult.cat([result.select(positions=[0]), result.select(positions=[1])])
    with pytest.raises(ValueError, match="method"):
        IGLensResult.cat([result, replace(result, method="riemann_left")])


def test_a_new_method_and_readout_kind_round_trip(result, tmp_path, monkeypatch):
    # a new estimator or readout is one file: results take any name for it, and
    # load it once it is registered
    from captum_iglens.attr.estimators import ESTIMATORS

    monkeypatch.setitem(ESTIMATORS, "my_estimator", ESTIMATORS["prediction_aware"])
    new = replace(
        result,
        method="my_estimator",
        readout_kind="scaled",
        readout_checksum="c0ffee",
        lens_change=torch.full_like(result.attributions, 0.25) * result.mask[..., None],
    )
    new.save(tmp_path / "new.json")
    loaded = IGLensResult.load(tmp_path / "new.json")
    _same(loaded, new)
    assert (loaded.method, loaded.readout_kind, loaded.readout_checksum) == (
        "my_estimator",
        "scaled",
        "c0ffee",
    )
    assert torch.equal(loaded.lens_change, new.lens_change)


def test_empty_answer_result_round_trips(tmp_path):
    empty = IGLensResult.empty(["0", "1"], "prediction_aware", 50)
    empty.save(tmp_path / "e.json")
    loaded = IGLensResult.load(tmp_path / "e.json")
    assert loaded.attributions.shape == (1, 0, 2) and loaded.layer_names == ["0", "1"]
    assert "completeness" in loaded.format_table()


def _corrupt(data, field, value):
    data = json.loads(json.dumps(data))
    if callable(value):
        value(data)
    else:
        data[field] = value
    return data


@pytest.mark.parametrize(
    "field, value",
    [
        ("layer_names", lambda d: d["layer_names"].pop()),
        (
            "attributions",
            lambda d: [row.pop() for seq in d["attributions"] for row in seq],
        ),
        ("model_prob", lambda d: d["model_prob"][0].__setitem__(-1, 1.5)),
        ("targets", lambda d: d["targets"][0].__setitem__(0, -3)),
        ("targets", lambda d: d["targets"][0].__setitem__(0, 2.5)),
        ("mask", lambda d: d["mask"][0].__setitem__(0, 1)),
        ("method", ""),
        ("readout_kind", ""),
        ("n_steps", 2.5),
        ("delta", lambda d: d["delta"][0].__setitem__(-1, 0.5)),
        ("lens", lambda d: d["lens"][0][0].__setitem__(0, None)),
        ("positions", "0,1"),
        ("tokens", [["a"]]),
        # Issue 48: names outside the registries, a column named twice.
        ("method", "foo"),
        ("path", "foo"),
        ("layer_names", lambda d: d["layer_names"].__setitem__(1, d["layer_names"][0])),
    ],
)
def test_inconsistent_file_is_refused_naming_the_field(result, tmp_path, field, value):
    path = tmp_path / "bad.json"
    data = _corrupt({"kind": "IGLensResult", **result.to_dict()}, field, value)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=field):
        IGLensResult.load(path)


def test_non_finite_and_foreign_files_are_refused(result, tmp_path):
    path = tmp_path / "bad.json"
    text = json.dumps(result.to_dict()).replace("0.0", "NaN", 1)
    path.write_text(text)
    with pytest.raises(ValueError, match="NaN"):
        IGLensResult.load(path)
    path.write_text(json.dumps({"kind": "ComparisonResult", **result.to_dict()}))
    with pytest.raises(ValueError, match="holds a ComparisonResult"):
        IGLensResult.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        IGLensResult.load(path)


def test_construction_checks_shapes(result):
    with pytest.raises(ValueError, match="levels: expected size along k"):
        replace(result, levels=result.levels[..., :-1])
    with pytest.raises(TypeError, match="mask"):
        replace(result, mask=result.mask.long())


def test_save_into_a_missing_folder_fails_first(result, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        result.save(tmp_path / "missing" / "r.json")
    with pytest.raises(ValueError, match="does not exist"):
        result.to_csv(tmp_path / "missing" / "r.csv")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_refuses_files_fails_first(result):
    # os.access grants root write access to /proc; creating a file there fails.
    for write in (result.save, result.to_csv, result.to_html):
        with pytest.raises(ValueError, match="cannot write in the folder /proc"):
            write("/proc/r.out")


def test_with_tokens_attaches_the_targets_text(result):
    from tests.helpers import word_tokenizer

    bare = replace(result, tokens=None)
    assert "#" in bare.format_table()
    vocab = {i: t for t, i in word_tokenizer(VOCAB).get_vocab().items()}
    named = bare.with_tokens(word_tokenizer(VOCAB))
    assert named.tokens == [[vocab[int(t)] for t in row] for row in result.targets]
    assert bare.tokens is None and vocab[int(result.targets[0, -1])] in (
        named.format_table()
    )


# ------------------------------------------------------------ views and token sets


@pytest.fixture
def viewed(lens):
    torch.manual_seed(0)
    ids, mask = left_padded([6, 4], VOCAB)
    res = lens.attribute_map(ids, additional_forward_args=(mask,), top_k=3, foil={7, 8})
    b, p, k, top = res.top_ids.shape
    res.top_tokens = [
        [[[f"w{i}" for i in layer] for layer in pos] for pos in seq]
        for seq in res.top_ids.tolist()
    ]
    return res


_OPTIONAL = ("top_ids", "top_probs", "entropy", "kl", "rank", "foils")


def test_views_round_trip_slice_and_join(viewed, tmp_path):
    viewed.save(tmp_path / "r.json")
    loaded = IGLensResult.load(tmp_path / "r.json")
    for name in _OPTIONAL:
        assert torch.equal(getattr(loaded, name), getattr(viewed, name)), name
    assert loaded.top_tokens == viewed.top_tokens and loaded.target_sets is None
    part = viewed.select(1, [0, 2])
    assert torch.equal(part.top_ids, viewed.top_ids[1:2][:, [0, 2]])
    assert part.top_tokens == [[viewed.top_tokens[1][0], viewed.top_tokens[1][2]]]
    joined = IGLensResult.cat([viewed, viewed])
    for name in _OPTIONAL:
        assert torch.equal(
            getattr(joined, name), torch.cat([getattr(viewed, name)] * 2)
        )
    assert joined.top_tokens == viewed.top_tokens * 2
    with pytest.raises(ValueError, match="given for some results only"):
        IGLensResult.cat(
            [
                viewed,
                replace(
                    viewed,
                    top_ids=None,
                    top_probs=None,
                    entropy=None,
                    kl=None,
                    rank=None,
                    top_tokens=None,
                ),
            ]
        )


def test_csv_carries_views_and_foils(viewed, tmp_path):
    import csv

    viewed.to_csv(tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == int(viewed.mask.sum()) * len(viewed.layer_names)
    first = rows[0]
    b, p = 0, int(viewed.mask[0].nonzero()[0, 0])
    assert json.loads(first["top_ids"]) == viewed.top_ids[b, p, 0].tolist()
    assert json.loads(first["top_tokens"]) == viewed.top_tokens[b][p][0]
    assert json.loads(first["foils"]) == [7, 8]
    assert int(first["rank"]) == int(viewed.rank[b, p, 0])
    assert float(first["kl"]) == pytest.approx(float(viewed.kl[b, p, 0]))


def test_views_are_checked(viewed):
    with pytest.raises(ValueError, match="expected all or none"):
        replace(viewed, kl=None)
    with pytest.raises(ValueError, match="top_probs: expected size along K"):
        replace(viewed, top_probs=viewed.top_probs[..., :2])
    with pytest.raises(TypeError, match="rank: expected dtype"):
        replace(viewed, rank=viewed.rank.float())
    with pytest.raises(ValueError, match="top_tokens: expected"):
        replace(viewed, top_tokens=[[["x"]]])
    with pytest.raises(ValueError, match="entropy: expected values >= 0"):
        replace(viewed, entropy=-viewed.entropy - 1)
    with pytest.raises(ValueError, match="foils: expected values >= -1"):
        replace(viewed, foils=viewed.foils - 10)


def test_negative_scores_only_for_contrastive_results(viewed):
    assert (viewed.model_prob < 0).any()  # p(y) - p(7) - p(8) on a random model
    with pytest.raises(ValueError, match=r"probabilities must lie in \[0, 1\]"):
        replace(viewed, foils=None)


def test_files_written_atomically_keep_the_usual_permissions(
    result, tmp_path, monkeypatch
):
    import os
    import stat

    mask = os.umask(0o022)
    try:
        # Reading the umask means setting it, for every thread: never done.
        with monkeypatch.context() as patched:
            patched.setattr(os, "umask", lambda *a: pytest.fail("umask changed"))
            result.save(tmp_path / "r.json")
            result.to_csv(tmp_path / "r.csv")
    finally:
        os.umask(mask)
    for name in ("r.json", "r.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def test_every_field_is_declared_in_the_file_schema():
    from dataclasses import fields as dataclass_fields

    from captum_iglens.result import IGLENS_SCHEMA

    declared = set(IGLENS_SCHEMA.fields)
    assert declared == {f.name for f in dataclass_fields(IGLensResult)}


def test_loaded_file_has_the_declared_types(result, tmp_path):
    data = {"kind": "IGLensResult", **result.to_dict()}
    for field, value, message in (
        ("layer_names", [], "at least one string"),
        ("tokens", [["a"] * 3] * 2 + [[1, 2, 3]], "expected strings"),
        ("metadata", [1], "expected an object"),
        ("top_ids", [[[[True]]]], "top_ids: expected integers"),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(ValueError, match=message):
            IGLensResult.load(tmp_path / "bad.json")


def test_levels_are_saved_under_their_file_key(result, tmp_path):
    data = result.to_dict()
    assert "lens" in data and "levels" not in data
    assert list(data)[:3] == ["attributions", "lens", "base_prob"]  # file order
    assert data["lens"] == result.levels.tolist()
    renamed = {"kind": "IGLensResult", **data, "levels": data.pop("lens")}
    (tmp_path / "r.json").write_text(json.dumps(renamed))
    with pytest.raises(ValueError, match=r"unknown fields \['levels'\]"):
        IGLensResult.load(tmp_path / "r.json")


def test_construction_runs_the_file_schema(result):
    # One declaration: what a file is refused for, a call is refused for too.
    with pytest.raises(TypeError, match="attributions: expected dtype torch.float32"):
        replace(result, attributions=result.attributions.double())
    with pytest.raises(TypeError, match="targets: expected a tensor, got list"):
        replace(result, targets=result.targets.tolist())
    with pytest.raises(ValueError, match="positions: expected values >= 0"):
        replace(result, positions=result.positions - 100)
    with pytest.raises(ValueError, match="tokens: expected size along B of 3"):
        replace(result, tokens=result.tokens[:2])
    with pytest.raises(ValueError, match="metadata.source_tokens"):
        replace(result, metadata={"source_tokens": [["a"]]})
    with pytest.raises(ValueError, match="levels: expected finite"):
        replace(result, levels=result.levels * float("nan"))
    with pytest.raises(ValueError, match=r"levels \(stored as 'lens'\): prob"):
        replace(result, levels=result.levels + 2)


def test_selected_and_joined_sources_keep_their_sequences(lens, tmp_path):
    ids, mask = left_padded([5, 5], VOCAB)
    result = lens.attribute_map(ids, granularity="source")
    sources = [[f"w{i}" for i in row] for row in ids.tolist()]
    result = replace(result, metadata={"source_tokens": sources})
    second = result.select(batch=[1])
    assert second.metadata["source_tokens"] == [sources[1]]
    second.save(tmp_path / "s.json")
    assert IGLensResult.load(tmp_path / "s.json").metadata == second.metadata
    joined = IGLensResult.cat([second, result])
    assert joined.metadata["source_tokens"] == [sources[1], *sources]
    with pytest.raises(ValueError, match="results.1.: metadata.source_tokens"):
        IGLensResult.cat([second, replace(result, metadata={})])


def test_the_table_calls_neuron_columns_columns(result):
    # Issue 48: "showing 3 of 46110 layers" at neuron granularity; they are columns.
    blocks = result.format_table(width=40)
    assert re.search(r"showing \d+ of \d+ layers", blocks)
    names = [f"0.mlp.n{i}" for i in range(len(result.layer_names))]
    neurons = replace(result, layer_names=names).format_table(width=40)
    assert re.search(r"showing \d+ of \d+ columns, .*Σ includes all columns", neurons)
    assert " layers" not in neurons


def test_lens_change_parts_only_on_the_default_path(result):
    learned = dict(readout_kind="tuned", readout_checksum="c0ffee")
    zeros = torch.zeros_like(result.attributions)
    assert replace(result, path="joint", lens_change=zeros, **learned).path == "joint"
    parts = torch.full_like(result.attributions, 0.25) * result.mask[..., None]
    with pytest.raises(ValueError, match="path: 'joint' has no lens-change parts"):
        replace(result, path="joint", lens_change=parts, **learned)
