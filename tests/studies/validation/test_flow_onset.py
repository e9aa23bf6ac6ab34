"""The flow's onset on a restoration study's facts (``ig_lens_flow``), checked
against flows and statistics computed here."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.studies.validation import (
    Fact,
    RestorationResult,
    StudyOptions,
    run_restoration,
    run_validation,
)
from captum_iglens.studies.validation import facts as facts_module
from captum_iglens.studies.validation.flow_onset import FLOW_METHOD, flow_onsets
from captum_iglens.studies.validation.stats import onset_agreement
from tests.helpers import word_tokenizer
from tests.tiny_models import VOCAB

SWAPPED = ["w4 w20 w21 w5 w6", "w4 w10 w11 w5 w6", "w4 w40 w5 w6", "w4 w30 w5 w6"]


@pytest.fixture
def study(llama4, monkeypatch):
    monkeypatch.setitem(
        facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
    )
    prompts = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6", "w4 w40 w5 w6"]
    facts = [Fact(f"t{i}", "tiny", p, answer=f"a{i}") for i, p in enumerate(prompts)]
    tokenizer = word_tokenizer(VOCAB)
    options = StudyOptions(n_bootstrap=50, min_effect=1e-9, noise_seeds=2)
    result = run_restoration(
        llama4,
        tokenizer,
        facts,
        methods=("ig_lens", "dla"),
        study=options,
        progress=False,
    )
    return tokenizer, result


def test_flow_onsets_by_hand(llama4, study):
    tokenizer, result = study
    found = flow_onsets(llama4, tokenizer, result, n_steps=4)
    flow = ProbabilityFlow(llama4, tokenizer)
    for i, fact in enumerate(result.facts):
        ids = torch.tensor([tokenizer(fact.prompt)["input_ids"]])
        other = torch.tensor([tokenizer(SWAPPED[i])["input_ids"]])
        graph = flow.attribute(ids, counterfactual=other, n_steps=4, per_position=True)
        # the flow runs between the study's own clean and corrupted runs
        clean, corrupt = result.probs["counterfactual"][i, :2]
        assert graph.m_prompt == pytest.approx(clean, abs=1e-6)
        assert graph.m_base == pytest.approx(corrupt, abs=1e-6)
        share = graph.crossings()[1:, -1] / graph.delta_m
        assert np.allclose(found.shares["counterfactual"][i], share, atol=1e-12)
        # the noise: the study's draws, pooled as the study pools them
        noised = [
            flow.attribute(
                fact.prompt,
                corrupt_subject=fact.prompt[slice(*fact.subject_span())],
                noise_seed=seed,
                n_steps=4,
                per_position=True,
            )
            for seed in (0, 1)
        ]
        mean_base = np.mean([g.m_base for g in noised])
        assert mean_base == pytest.approx(result.probs["noise"][i, 1], abs=1e-6)
        pooled = sum(g.crossings()[1:, -1] for g in noised) / sum(
            g.delta_m for g in noised
        )
        assert np.allclose(found.shares["noise"][i], pooled, atol=1e-12)
    for c in result.corruptions:
        shares = found.shares[c]
        assert np.allclose(shares[:, -1], 1.0, atol=1e-9)  # exact after the last
        first = [np.flatnonzero(row >= 0.5)[0] for row in shares]
        assert np.array_equal(found.onsets[c], first)
        late = found.onsets[c] - result.causal_onsets[c]
        late = late[~np.isnan(late)]
        assert len(late) >= 2  # tokens both have an onset for
        row = found.summary[c]
        assert row["mean_lateness"]["mean"] == pytest.approx(late.mean())
        assert row["within_2"]["mean"] == pytest.approx(np.mean(abs(late) <= 2))
        expected = onset_agreement(
            found.onsets[c], result.causal_onsets[c], np.full(4, np.nan), 50, 0
        )
        assert row["mean_abs_diff"] == expected["mean_abs_diff"]
        # the share's gains per block against the recovery's, per traced token
        gains = [
            spearmanr(np.diff(shares[i], prepend=0), np.diff(recovery, prepend=0))[0]
            for i, recovery in enumerate(result.recovery(c))
            if not np.isnan(result.causal_onsets[c][i])
        ]
        assert row["gain_spearman"]["mean"] == pytest.approx(np.mean(gains))
    assert found.settings["graphs"] == {"noise": 8, "counterfactual": 4}


def test_the_study_runs_the_flow_as_flow_onsets_does(llama4, study, tmp_path):
    """ig_lens_flow as a method of the study gives the shares, onsets and
    agreement that flow_onsets gives on the study's result after the fact."""
    tokenizer, result = study
    found = flow_onsets(llama4, tokenizer, result, n_steps=4)
    options = StudyOptions(n_bootstrap=50, min_effect=1e-9, noise_seeds=2)
    ran = run_restoration(
        llama4,
        tokenizer,
        result.facts,
        methods=("ig_lens", "dla", FLOW_METHOD),
        study=replace(options, flow_steps=4),
        progress=False,
    )
    assert ran.methods == ["ig_lens", "dla", FLOW_METHOD]
    assert np.array_equal(ran.probs["noise"], result.probs["noise"], equal_nan=True)
    for c in result.corruptions:
        shares = ran.traced_shares[c][FLOW_METHOD]
        assert np.allclose(shares, found.shares[c], atol=1e-12, equal_nan=True)
        onsets = ran.traced_onsets[c][FLOW_METHOD]
        assert np.array_equal(onsets, found.onsets[c], equal_nan=True)
        same = json.dumps  # NaN (an undefined interval) equal to itself
        assert same(ran.summary[c]["all"][FLOW_METHOD]) == same(found.summary[c])
        assert same(ran.summary[c]["all"]["dla"]) == same(
            result.summary[c]["all"]["dla"]
        )
        assert FLOW_METHOD not in ran.rules[c]["abs"]  # no onset rules
    runs = ran.settings["traced_runs"][FLOW_METHOD]
    assert {c: r["runs"] for c, r in runs.items()} == found.settings["graphs"]
    table = ran.format_table()
    assert re.search(rf"^{FLOW_METHOD} +4 ", table, re.M)
    assert f"{FLOW_METHOD} (n_steps=4): noise" in table
    ran.save(tmp_path / "r.json")
    loaded = RestorationResult.load(tmp_path / "r.json")
    assert np.array_equal(
        loaded.traced_onsets["noise"][FLOW_METHOD],
        ran.traced_onsets["noise"][FLOW_METHOD],
        equal_nan=True,
    )
    assert loaded.format_table() == table
    fig, axes = ran.plot(corruption="counterfactual")
    labels = axes["example 0"].get_legend_handles_labels()[1]
    assert f"{FLOW_METHOD}: share" in labels


def test_the_ablation_study_refuses_the_flow(llama4, study):
    tokenizer, result = study
    with pytest.raises(ValueError, match="only run_restoration runs them"):
        run_validation(
            llama4, tokenizer, result.facts, methods=("ig_lens", FLOW_METHOD)
        )


def test_flow_onsets_refuse_a_result_of_another_model(llama4, study):
    tokenizer, result = study
    other = replace(result, target_tokens=["w99"] * len(result.facts))
    with pytest.raises(ValueError, match="greedy token"):
        flow_onsets(llama4, tokenizer, other, n_steps=1)
