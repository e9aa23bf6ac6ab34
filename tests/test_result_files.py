"""Every result kind's file, tampered with field by field: each mutation is refused
on load by a ValueError naming the field, or the file renders, tables, saves and
reloads. Plus the whole-file checks: the kind key, nesting depth, lone surrogates."""

import copy
import json

import pytest
import torch

from captum_iglens import IGLensResult
from captum_iglens.studies.circuits.study import CircuitsResult
from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens._utils.serialization import JsonDocument
from captum_iglens.studies.comparison import ComparisonResult, compare
from captum_iglens.studies.validation import (
    Fact,
    RestorationResult,
    StudyOptions,
    ValidationResult,
    run_restoration,
    run_validation,
)
from captum_iglens.studies.validation import facts as facts_module
from tests.helpers import left_padded, word_tokenizer
from tests.tiny_models import VOCAB, tiny_model
from tests.test_flow_graph import _graph
from tests.viewer.synthetic import synthetic_result


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """A small saved document of every kind, as JSON objects."""
    model, tokenizer = tiny_model("llama", num_hidden_layers=3), word_tokenizer(VOCAB)
    patterns = dict(facts_module.SUBJECT_PATTERNS)
    facts_module.SUBJECT_PATTERNS["tiny"] = r"^w4 (?P<subject>.+) w5 w6$"
    facts = [
        Fact("t0", "tiny", "w4 w10 w11 w5 w6", "a0", ("b0",)),
        Fact("t1", "tiny", "w4 w20 w21 w5 w6", "a1"),
        Fact("t2", "tiny", "w4 w30 w5 w6"),
    ]
    study = StudyOptions(n_bootstrap=10, batch_size=3, min_effect=1e-9, noise_seeds=1)
    try:
        results = [
            synthetic_result(positions=3, layers=2, batch=2, top_k=2),
            run_validation(
                model,
                tokenizer,
                facts,
                methods=["ig_lens", "random"],
                study=study,
                progress=False,
            ),
            run_restoration(
                model,
                tokenizer,
                facts,
                methods=("ig_lens", "dla"),
                study=study,
                progress=False,
            ),
            compare(
                model,
                *left_padded([5, 4], VOCAB),
                positions=[-2, -1],
                n_steps=4,
                methods=("dla", "ig_lens", "layer_integrated_gradients"),
            ),
        ]
    finally:
        facts_module.SUBJECT_PATTERNS.clear()
        facts_module.SUBJECT_PATTERNS.update(patterns)
    results += [_graph(), _circuits(tmp_path_factory.mktemp("circuits"))]
    return {
        type(r): {"kind": r.KIND, "format": 1, **json.loads(json.dumps(r.to_dict()))}
        for r in results
    }


def _circuits(folder):
    """A circuits result of the command line on the tiny Llama saved as a
    model folder, on a pair with three foils."""
    from captum_iglens.cli import main
    from tests.tiny_models import tiny_tokenizer

    model = tiny_model("llama")
    model.save_pretrained(folder / "model")
    tiny_tokenizer().save_pretrained(folder / "model")
    pair = {"clean": "t5 t6 t7 t8", "counterfactual": "t5 t9 t7 t8"}
    pair.update(answer="t4", foil="t9")
    rows = [json.dumps(dict(pair, foil=foil)) for foil in ("t9", "t8", "t7")]
    (folder / "task.jsonl").write_text("\n".join(rows))
    args = ["circuits", "--task", str(folder / "task.jsonl"), "--pairs", "3"]
    args += ["--model", str(folder / "model"), "--methods", "random,eap"]
    args += ["--bootstrap", "5", "--json", str(folder / "c.json")]
    assert main(args) == 0
    return CircuitsResult.load(folder / "c.json")


KINDS = (
    IGLensResult,
    ValidationResult,
    RestorationResult,
    ComparisonResult,
    FlowGraph,
    CircuitsResult,
)


def test_every_kind_is_fuzzed():
    def subclasses(cls):
        return {s for c in cls.__subclasses__() for s in (c, *subclasses(c))}

    assert subclasses(JsonDocument) == set(KINDS)


def _paths(value, path=()):
    """Every key of every object, and the first and last item of every list."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,)
            yield from _paths(item, path + (key,))
    elif isinstance(value, list) and value:
        for index in sorted({0, len(value) - 1}):
            yield path + (index,)
            yield from _paths(value[index], path + (index,))


def _other(value):
    """A value of another JSON type."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return {"0": value[0]} if value else "x"
    if isinstance(value, dict):
        return list(value.values())
    return []


def _mutate(value, how):
    """``value`` dropped (None: remove it), truncated, extended or retyped."""
    if how == "retype":
        return _other(value)
    if isinstance(value, (list, str)):
        if how == "truncate":
            return value[:-1]
        filler = ["x"] if isinstance(value, list) else "x"
        return value + (value[-1:] or filler)
    if isinstance(value, dict):
        keys = list(value)
        if how == "truncate":
            return {k: value[k] for k in keys[:-1]}
        return {**value, "extra": value[keys[-1]] if keys else 0}
    if isinstance(value, bool):
        return not value if how == "extend" else value
    if isinstance(value, (int, float)):
        return value + 1 if how == "extend" else value - 1
    return "x" if how == "extend" else value


def _mutated(document, path, how):
    data = copy.deepcopy(document)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if how == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = _mutate(parent[path[-1]], how)
    return data


def _use(result, tmp_path):
    """Everything a loaded result offers: page, tables, save and reload."""
    result.to_html(tmp_path / "page.html")
    result.format_table()
    if isinstance(result, IGLensResult):
        result.to_csv(tmp_path / "table.csv")
        if result.has_views:
            result.format_views()
    result.save(tmp_path / "again.json")
    again = type(result).load(tmp_path / "again.json")
    assert again.format_table() == result.format_table()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_mutation_is_refused_by_name_or_works(kind, documents, tmp_path):
    document = documents[kind]
    path = tmp_path / "doc.json"
    refused, accepted = 0, 0
    for field in _paths(document):
        if field in (("kind",), ("format",)):
            continue
        for how in ("drop", "truncate", "extend", "retype"):
            path.write_text(json.dumps(_mutated(document, field, how)))
            try:
                result = kind.load(path)
            except ValueError as error:
                assert field[0] in str(error), (field, how, str(error))
                refused += 1
                continue
            try:
                _use(result, tmp_path)
            except Exception as error:  # noqa: B902 - reported with the mutation
                pytest.fail(f"{field} {how}: loaded, then {error!r}")
            accepted += 1
    assert refused > 50 and accepted > 10, (refused, accepted)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_unknown_keys_and_missing_kind_are_refused(kind, documents, tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({**documents[kind], "surplus": 1}))
    with pytest.raises(ValueError, match="unknown fields.*surplus"):
        kind.load(path)
    bare = dict(documents[kind])
    del bare["kind"]
    path.write_text(json.dumps(bare))
    with pytest.raises(ValueError, match="kind: missing"):
        kind.load(path)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_deep_nesting_is_a_value_error(kind, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested deeper"):
        kind.load(path)
    path.write_text('{"kind": "%s", "metadata": %s}' % (kind.KIND, "[" * 40 + "]" * 40))
    with pytest.raises(ValueError, match="nested deeper than 32"):
        kind.load(path)


def test_lone_surrogates_are_refused_on_load_and_escaped_on_render(documents, tmp_path):
    document = copy.deepcopy(documents[IGLensResult])
    document["tokens"][0][1] = "a\ud800b"
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))  # ASCII, the surrogate as \ud800
    with pytest.raises(ValueError, match=r"tokens\[0\]\[1\]: .*lone surrogate"):
        IGLensResult.load(path)
    fresh = synthetic_result(positions=3, layers=2, tokens=["a", "\udcff", "c"])
    fresh.metadata = {}
    fresh.to_html(tmp_path / "page.html")
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert "\\udcff" in page
    with pytest.raises(ValueError, match=r"tokens\[0\]\[1\]: .*lone surrogate"):
        fresh.save(tmp_path / "fresh.json")
    assert "\\udcff" in fresh.format_table()


def test_empty_and_contrastive_results_round_trip(lens, tmp_path):
    empty = IGLensResult.empty(["0", "1"], "prediction_aware", 5)
    empty.save(tmp_path / "e.json")
    assert IGLensResult.load(tmp_path / "e.json").attributions.shape == (1, 0, 2)
    ids, mask = left_padded([5, 4], VOCAB)
    sets = lens.attribute_map(
        ids, additional_forward_args=(mask,), target_tokens={3, 4}, foil={7}, top_k=2
    )
    sets.save(tmp_path / "s.json")
    loaded = IGLensResult.load(tmp_path / "s.json")
    assert torch.equal(loaded.target_sets, sets.target_sets)
    assert torch.equal(loaded.foils, sets.foils)


def test_source_tokens_of_a_source_map_are_checked(lens, tmp_path):
    ids, mask = left_padded([5], VOCAB)
    result = lens.attribute_map(ids, granularity="source")
    result.metadata = {"source_tokens": [[f"w{i}" for i in ids[0].tolist()]]}
    result.save(tmp_path / "s.json")
    IGLensResult.load(tmp_path / "s.json").to_html(tmp_path / "s.html")
    data = json.loads((tmp_path / "s.json").read_text())
    for bad in (7, ["w1"], [[1, 2]]):
        data["metadata"]["source_tokens"] = bad
        (tmp_path / "s.json").write_text(json.dumps(data))
        with pytest.raises(ValueError, match="metadata.source_tokens"):
            IGLensResult.load(tmp_path / "s.json")
