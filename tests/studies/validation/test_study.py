"""The validation study end to end."""

import json
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch

from captum_iglens import IGLensResult, LayerIGLens
from captum_iglens.hf import model_parts
from captum_iglens.studies.validation import (
    SCORED_METHODS,
    STUDY_SETTINGS,
    Fact,
    StudyOptions,
    ValidationResult,
    load_facts,
    run_validation,
)
from captum_iglens.studies.validation.study import CausalTest, score_prompts

matplotlib.use("Agg")

FP32_TOL = 1e-6


class CharTokenizer:
    """A tokenizer of characters, enough for the runner."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = 2

    def __call__(self, text, return_tensors=None):
        return SimpleNamespace(
            input_ids=torch.tensor([[3 + ord(c) % 120 for c in text]])
        )

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + int(i) % 26) if int(i) > 2 else "" for i in ids)

    def get_vocab(self):
        return {}


@pytest.mark.slow
def test_runner_end_to_end(llama4, tmp_path):
    prompts = [Fact("a", "r", "abc", "x"), Fact("b", "r", "hello", "y"), "a prompt"]
    for mode in ("skip", "mean"):
        result = run_validation(
            llama4,
            CharTokenizer(),
            prompts,
            mode=mode,
            progress=False,
            study=StudyOptions(
                n_bootstrap=30, batch_size=2, conductance_prompts=1, conductance_steps=2
            ),
        )
        assert result.methods == list(SCORED_METHODS)
        assert result.drops.shape == (3, 4) and result.trajectory.shape == (3, 5)
        assert result.correct[2] is None and isinstance(result.correct[0], bool)
        assert result.groups["conductance_subset"].sum() == 1
        assert result.summary["all"]["layer_conductance"]["top1"]["n"] == 1
        assert result.summary["all"]["ig_lens"]["top1"]["n"] == 3
        assert result.settings["max_gap_lens_vs_ablation_clean_prob"] <= FP32_TOL
        assert np.array_equal(
            result.scores["ig_lens_abs"], np.abs(result.scores["ig_lens"])
        )
        # The trajectory ends at the model's probability; the credits are its steps.
        assert np.abs(result.trajectory[:, -1] - result.model_prob).max() <= FP32_TOL
        assert (
            np.abs(np.diff(result.trajectory) - result.scores["ig_lens"]).max() <= 1e-5
        )
    table = result.format_table()
    for method in SCORED_METHODS:
        assert method in table
    assert "[conductance_subset]" in table
    path = tmp_path / "v.json"
    result.save(path)
    data = json.loads(path.read_text())
    json.dumps(data, allow_nan=False)
    assert data["mode"] == "mean" and len(data["tokens"]) == 3
    loaded = ValidationResult.load(path)
    assert loaded.format_table() == table
    for name, scores in result.scores.items():
        np.testing.assert_allclose(loaded.scores[name], scores, atol=1e-6)
    np.testing.assert_allclose(loaded.drops, result.drops, atol=1e-6)
    with pytest.raises(
        ValueError, match="holds a ValidationResult; expected a IGLensResult"
    ):
        IGLensResult.load(path)
    fig, axes = result.plot()
    assert {"spearman", "top1", "example 0"} <= set(axes)
    fig.savefig(tmp_path / "v.png")
    with pytest.raises(ValueError, match="methods"):
        run_validation(llama4, CharTokenizer(), prompts, methods=["nope"])


@pytest.mark.real_model
def test_real_model_two_prompts(default_model):
    model, tokenizer = default_model
    result = run_validation(
        model,
        tokenizer,
        load_facts()[:2],
        methods=["ig_lens", "random"],
        study=StudyOptions(n_bootstrap=20),
        progress=False,
    )
    assert result.correct == [True, True]
    assert result.drops.shape == (2, 30)
    assert result.settings["max_gap_lens_vs_ablation_clean_prob"] <= 1e-5


class _Recorder(CausalTest):
    """A causal test that records what the common loop hands it."""

    desc = "recorder"

    def __init__(self):
        self.batches = []

    def measure(self, rows, ids, mask, work):
        assert set(work.outcomes) >= {"ig_lens", "logit_lens", "logit_lens_diff"}
        self.batches.append((rows.tolist(), ids.shape, work.targets[:, 0].tolist()))


@pytest.mark.slow
def test_common_loop_scores_then_measures_each_batch(llama4):
    tokenizer = CharTokenizer()
    prompts = ["abc", "hello", "a prompt", "zq", "more"]
    encoded = [tokenizer(p).input_ids[0] for p in prompts]
    study = StudyOptions(batch_size=2, conductance_prompts=2, conductance_steps=2)
    methods = list(SCORED_METHODS)
    lens = LayerIGLens.from_model(llama4)
    recorder = _Recorder()
    scored = score_prompts(
        model_parts(llama4),
        lens,
        encoded,
        0,
        methods,
        STUDY_SETTINGS,
        study,
        recorder,
        False,
    )
    assert [rows for rows, _, _ in recorder.batches] == [[0, 1], [2, 3], [4]]
    assert sum((t for _, _, t in recorder.batches), []) == scored.target_ids
    n, k = len(prompts), 4
    assert scored.trajectory.shape == (n, k + 1)
    assert scored.layer_names == ["0", "1", "2", "3"]
    # The seeded draws, in order: the costly methods' subset, then "random".
    rng = np.random.default_rng(study.seed)
    subset = np.zeros(n, bool)
    subset[rng.choice(n, 2, replace=False)] = True
    assert np.array_equal(scored.conductance, subset)
    assert np.array_equal(scored.scores["random"], rng.standard_normal((n, k)))
    computed = ~np.isnan(scored.scores["layer_conductance"]).all(1)
    assert np.array_equal(computed, subset) and len(scored.conductance_delta) == 2
    for m in ("ig_lens", "ig_lens_abs", "logit_lens", "logit_lens_diff", "dla"):
        assert not np.isnan(scored.scores[m]).any(), m
    # The ablation study is this loop with its own test: the same scores.
    result = run_validation(
        llama4, tokenizer, prompts, methods=methods, study=study, progress=False
    )
    for m in methods:
        assert np.array_equal(result.scores[m], scored.scores[m], equal_nan=True), m
    assert np.array_equal(result.trajectory, scored.trajectory)
