"""The restoration study end to end on a tiny model, its statistics and its
result, checked against computations written here."""

import matplotlib
import numpy as np
import pytest
import torch

from captum_iglens.studies.validation import (
    Fact,
    RestorationResult,
    StudyOptions,
    load_facts,
    run_restoration,
)
from captum_iglens.studies.validation import facts as facts_module
from captum_iglens.studies.validation.result import closest_rule
from captum_iglens.studies.validation.stats import (
    bootstrap_statistic,
    causal_onset,
    onset_agreement,
    recovery_gains,
)
from tests.helpers import word_tokenizer
from tests.studies.validation.test_restoration import _clean_last_states, _probs
from tests.tiny_models import VOCAB

matplotlib.use("Agg")

FP32_TOL = 1e-6


# ------------------------------------------------------------------- statistics


def test_causal_onset_and_gains():
    recovery = np.array([0.1, 0.3, 0.6, 0.4, 1.0])
    assert causal_onset(recovery) == 2
    assert causal_onset(recovery, 0.95) == 4
    assert causal_onset(np.array([0.1, 0.2])) == -1
    assert np.allclose(recovery_gains(recovery), [0.1, 0.2, 0.3, -0.2, 0.6])


def test_bootstrap_statistic_drops_nan_rows_and_covers_the_value():
    a = np.array([1.0, 2.0, np.nan, 4.0, 5.0])
    b = np.array([2.0, 1.0, 3.0, np.nan, 6.0])
    out = bootstrap_statistic((a, b), lambda x, y: float(np.mean(x - y)), 200, 1)
    assert out["n"] == 3 and out["n_undefined"] == 2
    assert out["mean"] == pytest.approx(((1 - 2) + (2 - 1) + (5 - 6)) / 3)
    assert out["lo"] <= out["mean"] <= out["hi"]


def test_onset_agreement_by_hand():
    onsets = np.array([3.0, 5.0, 1.0, np.nan, 8.0])
    causal = np.array([4.0, 5.0, 4.0, 2.0, np.nan])
    gains = np.array([0.5, -0.1, 0.2, 0.3, np.nan])
    out = onset_agreement(onsets, causal, gains, n_bootstrap=50)
    diff = np.array([1.0, 0.0, 3.0])  # the three tokens with both onsets
    assert out["mean_abs_diff"]["mean"] == pytest.approx(diff.mean())
    assert out["median_abs_diff"]["mean"] == pytest.approx(1.0)
    assert out["within_1"]["mean"] == pytest.approx(2 / 3)
    assert out["within_2"]["mean"] == pytest.approx(2 / 3)
    # onset − causal: 3 − 4, 5 − 5, 1 − 4
    assert out["mean_lateness"]["mean"] == pytest.approx(-4 / 3)
    # ranks of (3, 5, 1) and (4, 5, 4): Pearson of (2, 3, 1) and (1.5, 3, 1.5)
    a, b = np.array([2, 3, 1]) - 2.0, np.array([1.5, 3, 1.5]) - 2.0
    expected = (a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())
    assert out["onset_spearman"]["mean"] == pytest.approx(expected)
    assert out["gain_spearman"]["mean"] == pytest.approx(np.mean([0.5, -0.1, 0.2, 0.3]))


# ---------------------------------------------------------------------- subjects


def test_every_shipped_relation_has_subjects():
    facts = load_facts()
    found = [f for f in facts if f.subject_span()]
    assert len(found) == 182  # all but the eight planets not counted from the Sun
    assert {f.relation for f in found} == {f.relation for f in facts}
    france = facts[0]
    start, end = france.subject_span()
    assert france.prompt[start:end] == "France"
    hamlet = next(f for f in facts if "Hamlet" in f.prompt)
    start, end = hamlet.subject_span()
    assert hamlet.prompt[start:end] == "Hamlet"
    assert Fact("x", "unknown", "The capital of France is").subject_span() is None


# -------------------------------------------------------------------- end to end


@pytest.fixture
def tiny_facts(monkeypatch):
    monkeypatch.setitem(
        facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
    )
    prompts = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6", "w4 w40 w5 w6"]
    return [Fact(f"t{i}", "tiny", p, answer=f"a{i}") for i, p in enumerate(prompts)]


def test_run_restoration_by_hand(llama4, tiny_facts):
    tokenizer = word_tokenizer(VOCAB)
    study = StudyOptions(n_bootstrap=50, batch_size=3, min_effect=1e-9, noise_seeds=2)
    result = run_restoration(
        llama4,
        tokenizer,
        [*tiny_facts, Fact("u", "other", "w7 w8")],  # no subject: left out
        methods=("ig_lens", "random"),
        study=study,
        progress=False,
    )
    assert [f.id for f in result.facts] == ["t0", "t1", "t2", "t3"]
    # Counterfactuals: t0 <-> t1 (two subject tokens), t2 <-> t3 (one).
    swapped = {0: "w4 w20 w21 w5 w6", 1: "w4 w10 w11 w5 w6", 2: "w4 w40 w5 w6"}
    swapped[3] = "w4 w30 w5 w6"
    weight = llama4.get_input_embeddings().weight.detach().double()
    std = 3 * float(weight.std())
    assert result.settings["noise_std"] == pytest.approx(std, rel=1e-9)
    for i, fact in enumerate(tiny_facts):
        ids = torch.tensor([tokenizer(fact.prompt)["input_ids"]])
        mask = torch.ones_like(ids)
        y = int(_probs_all(llama4, ids).argmax())
        assert result.target_tokens[i] == tokenizer.decode([y])
        target = torch.tensor([y])
        states = _clean_last_states(llama4, ids, mask)
        clean = float(_probs(llama4, ids, mask, target))
        other = torch.tensor([tokenizer(swapped[i])["input_ids"]])
        expected = [clean, float(_probs(llama4, other, mask, target))] + [
            float(_probs(llama4, other, mask, target, None, j, states[j]))
            for j in range(4)
        ]
        probs = result.probs["counterfactual"][i]
        assert np.abs(probs - np.array(expected)).max() <= FP32_TOL
        # noise on the subject tokens, seeds 0 and 1, averaged
        subject = torch.zeros_like(ids, dtype=torch.bool)
        subject[0, 1 : ids.shape[1] - 2] = True
        noisy = []
        for seed in (0, 1):
            generator = torch.Generator().manual_seed(seed)
            draw = torch.randn(1, ids.shape[1], weight.shape[1], generator=generator)
            noise = draw * std * subject[..., None]
            noisy.append(
                [float(_probs(llama4, ids, mask, target, noise))]
                + [
                    float(_probs(llama4, ids, mask, target, noise, j, states[j]))
                    for j in range(4)
                ]
            )
        expected = [clean] + np.mean(noisy, 0).tolist()
        assert np.abs(result.probs["noise"][i] - np.array(expected)).max() <= 1e-5
    for c in ("noise", "counterfactual"):
        columns = result.probs[c]
        recovery = (columns[:, 2:] - columns[:, 1:2]) / (
            columns[:, :1] - columns[:, 1:2]
        )
        assert np.allclose(recovery[:, -1], 1.0, atol=1e-4)
        # counted: the corruption lowers p (min_effect is tiny here)
        counted = columns[:, 0] - columns[:, 1] >= 1e-9 * columns[:, 0]
        causal = np.array(
            [np.argmax(r >= 0.5) if ok else np.nan for r, ok in zip(recovery, counted)]
        )
        assert np.array_equal(result.causal_onsets[c], causal, equal_nan=True)
        diff = np.abs(result.onsets["ig_lens"] - causal)[counted]
        summary = result.summary[c]["all"]["ig_lens"]
        assert summary["mean_abs_diff"]["n"] == counted.sum() > 0
        assert summary["mean_abs_diff"]["mean"] == pytest.approx(diff.mean())
        assert summary["within_1"]["mean"] == pytest.approx(np.mean(diff <= 1))
        # Each rule's onsets, from the scores by hand: "positive" is the first
        # block by which half the positive credit is built, "argmax" the largest.
        scores = result.scores["ig_lens"]
        built = np.cumsum(np.clip(scores, 0, None), 1)
        half = [np.argmax(b >= 0.5 * b[-1] * (1 - 1e-6)) for b in built]
        by_hand = {"positive": np.array(half), "argmax": scores.argmax(1)}
        for rule, onsets in by_hand.items():
            late = (onsets - causal)[counted]
            row = result.rules[c][rule]["ig_lens"]
            assert row["mean_lateness"]["mean"] == pytest.approx(late.mean())
            assert row["within_2"]["mean"] == pytest.approx(np.mean(abs(late) <= 2))
        for metric in ("mean_abs_diff", "within_2", "mean_lateness"):
            assert result.rules[c]["abs"]["ig_lens"][metric] == summary[metric]
    assert "corruption: noise" in result.format_table()
    fig, axes = result.plot(examples=[0, 2])
    assert len(axes) == 2 and fig is not None


def _probs_all(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].softmax(-1)


def test_restoration_result_round_trip(llama4, tiny_facts, tmp_path):
    result = run_restoration(
        llama4,
        word_tokenizer(VOCAB),
        tiny_facts,
        corruptions=("counterfactual",),
        methods=("ig_lens", "dla"),
        study=StudyOptions(n_bootstrap=20, min_effect=0.5),
        progress=False,
    )
    path = tmp_path / "r.json"
    result.save(path)
    loaded = RestorationResult.load(path)
    assert loaded.format_table() == result.format_table()
    for m in result.methods:
        assert np.array_equal(loaded.scores[m], result.scores[m], equal_nan=True)
    assert np.array_equal(
        loaded.causal_onsets["counterfactual"],
        result.causal_onsets["counterfactual"],
        equal_nan=True,
    )


def test_run_restoration_refuses_bad_arguments(llama4, tiny_facts):
    tokenizer = word_tokenizer(VOCAB)
    with pytest.raises(ValueError, match="corruptions"):
        run_restoration(llama4, tokenizer, tiny_facts, corruptions=("blur",))
    with pytest.raises(ValueError, match="methods"):
        run_restoration(llama4, tokenizer, tiny_facts, methods=("random",))
    with pytest.raises(ValueError, match="chat"):
        run_restoration(llama4, tokenizer, tiny_facts, chat=True)
    with pytest.raises(ValueError, match="subject"):
        run_restoration(llama4, tokenizer, [Fact("u", "other", "w7 w8")])


def _shares(**by_rule):
    return {
        rule: {"ig_lens_joint": {"within_2": {"mean": share}}}
        for rule, share in by_rule.items()
    }


def test_closest_rule_must_win_on_every_corruption():
    one = _shares(abs=0.4, positive=0.7, argmax=0.6)
    assert closest_rule({"noise": one}, "ig_lens_joint") == "positive"
    other = _shares(abs=0.5, positive=0.6, argmax=0.8)
    assert closest_rule({"noise": one, "counterfactual": other}, "x") is None
    assert (
        closest_rule({"noise": one, "counterfactual": other}, "ig_lens_joint") is None
    )
    same = _shares(abs=0.1, positive=0.9, argmax=0.2)
    assert closest_rule({"noise": one, "counterfactual": same}, "ig_lens_joint") == (
        "positive"
    )
    tied = _shares(abs=0.7, positive=0.7, argmax=0.2)
    assert closest_rule({"noise": tied}, "ig_lens_joint") is None
