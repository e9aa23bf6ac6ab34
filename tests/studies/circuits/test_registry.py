"""The scorer registry: one record per scorer, read-only but through
``register``, which refuses bad names and records; the command line's
methods parsed from the records."""

import pytest

import importlib

from captum_iglens.studies.circuits import methods, scorers
from captum_iglens.studies.circuits.scorers import SCORERS, Scorer, register
from captum_iglens.studies.circuits.study import parse_method


def _constant(context):
    return {}


def test_the_registry_is_read_only_and_register_refuses_bad_entries(monkeypatch):
    with pytest.raises(TypeError):
        SCORERS["mine"] = Scorer(_constant, "mine")  # type: ignore[index]
    with pytest.raises(ValueError, match="name: a scorer 'eap' is already"):
        register("eap", Scorer(_constant, "again"))
    for bad in ("", "a:b", "a,b"):
        with pytest.raises(ValueError, match="name: expected a name without"):
            register(bad, Scorer(_constant, "bad"))
    with pytest.raises(TypeError, match="scorer: expected a Scorer, got function"):
        register("mine", _constant)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps: expected a positive int or None"):
        Scorer(_constant, "mine", steps=0)
    with pytest.raises(ValueError, match="steps: a scorer that reads a file"):
        Scorer(_constant, "mine", steps=3, reads_file=True)
    for other in (dict(steps=3), dict(reads_file=True)):
        with pytest.raises(ValueError, match="averages: a scorer of other methods"):
            Scorer(_constant, "mine", averages=True, **other)
        with pytest.raises(ValueError, match="searches: a scorer of other methods"):
            Scorer(_constant, "mine", searches=True, **other)
    with pytest.raises(ValueError, match="searches: a scorer either averages or"):
        Scorer(_constant, "mine", averages=True, searches=True)
    with pytest.raises(TypeError, match="truth: expected a callable"):
        Scorer(_constant, "mine", truth=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="check_steps: expected a callable"):
        Scorer(_constant, "mine", check_steps=3)  # type: ignore[arg-type]
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(methods, "SCORERS", methods.MappingProxyType(methods._REGISTRY))
    register("mine", Scorer(_constant, "mine", steps=7))
    assert methods.SCORERS["mine"].steps == 7 and "mine" not in SCORERS


def test_the_torch_free_registry_is_the_scorers_and_names_real_functions():
    """One registry: the scorers' module re-exports the torch-free one, and
    each shipped record's function and truth, imported on first call, exist."""
    assert scorers.SCORERS is methods.SCORERS and scorers.Scorer is methods.Scorer
    for name, record in SCORERS.items():
        for later in (record.function, record.truth):
            if later is None:
                continue
            module = importlib.import_module(f"{methods.__package__}.{later.module}")
            assert callable(getattr(module, later.name)), (name, later)


def test_methods_are_parsed_from_the_records():
    assert parse_method("eap-ig-inputs") == dict(
        name="eap-ig-inputs", scorer="eap-ig-inputs", steps=5, path=None, parts=[]
    )
    assert parse_method("eap")["steps"] == 0
    assert parse_method("eap-json:C:/runs/a:b.json")["path"] == "C:/runs/a:b.json"
    assert [n for n, s in SCORERS.items() if s.truth] == [
        "patching",
        "patching-nodes",
        "patching-nodes-denoising",
    ]
    with pytest.raises(ValueError, match="--methods: eap takes no step count"):
        parse_method("eap:3")
    with pytest.raises(ValueError, match="--methods: expected a positive step"):
        parse_method("flow:x")
