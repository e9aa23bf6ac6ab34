"""The restoration study under a fitted lens: IG-Lens's terms and block parts and
the lens's own levels, checked against readouts computed here; identity
translators give the logit readout's numbers; a lens for another model is
refused before any forward."""

import numpy as np
import pytest
import torch

from captum_iglens.hf import model_parts
from captum_iglens.readout.translators import Translators
from captum_iglens.studies.validation import Fact, StudyOptions, run_restoration
from captum_iglens.studies.validation import facts as facts_module
from tests.helpers import block_states, word_tokenizer
from tests.tiny_models import VOCAB

LEARNED = ("ig_lens_fitted", "ig_lens_fitted_block", "fitted_lens")
STUDY = StudyOptions(n_bootstrap=20, batch_size=3, min_effect=1e-9, noise_seeds=1)


@pytest.fixture
def tiny_facts(monkeypatch):
    monkeypatch.setitem(
        facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
    )
    prompts = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6"]
    return [Fact(f"t{i}", "tiny", p, answer=f"a{i}") for i, p in enumerate(prompts)]


def _random_translators(n_layers: int, d: int, seed: int = 0) -> Translators:
    g = torch.Generator().manual_seed(seed)
    weight = 0.3 * torch.randn(n_layers, d, d, generator=g) / d**0.5
    return Translators(weight, 0.5 * torch.randn(n_layers, d, generator=g))


def _run(model, facts, lens, methods=("ig_lens", "logit_lens", *LEARNED)):
    return run_restoration(
        model,
        word_tokenizer(VOCAB),
        facts,
        corruptions=("counterfactual",),
        methods=methods,
        study=STUDY,
        progress=False,
        lens=lens,
    )


def test_fitted_lens_scores_by_hand(llama4, tiny_facts):
    translators = _random_translators(4, 32)
    result = _run(llama4, tiny_facts, translators)
    readout = model_parts(llama4).readout()
    tokenizer = word_tokenizer(VOCAB)
    for i, fact in enumerate(tiny_facts):
        ids = torch.tensor([tokenizer(fact.prompt)["input_ids"]])
        states, logits = block_states(llama4, ids, torch.ones_like(ids))
        y = int(logits[0, -1].argmax())
        last = [s[0, -1] for s in states]  # h_0 … h_4 at the last position

        def f(state: int, reader: int) -> float:
            h = last[state]
            if reader < 4:
                index = torch.tensor([reader])
                h = translators(h[None], index)[0]
            with torch.no_grad():
                return float(readout(h).softmax(-1)[y])

        levels = np.array([f(j, j) for j in range(5)])  # each state its own readout
        assert levels[-1] == pytest.approx(
            float(logits[0, -1].softmax(-1)[y]), abs=1e-6
        )
        assert np.allclose(result.scores["fitted_lens"][i], levels[1:], atol=1e-6)
        assert np.allclose(
            result.scores["ig_lens_fitted"][i], np.diff(levels), atol=1e-6
        )
        # prediction_aware block part: the mean of the two readouts' changes
        block = [
            0.5 * ((f(j, j) - f(j - 1, j)) + (f(j, j - 1) - f(j - 1, j - 1)))
            for j in range(1, 5)
        ]
        assert np.allclose(result.scores["ig_lens_fitted_block"][i], block, atol=1e-6)
    assert result.settings["readout"]["checksum"] == translators.checksum()
    assert "ig_lens_fitted" in result.format_table()


def test_identity_translators_give_the_logit_readout(llama4, tiny_facts):
    result = _run(llama4, tiny_facts, Translators.identity(4, 32))
    assert np.array_equal(result.scores["ig_lens_fitted"], result.scores["ig_lens"])
    assert np.array_equal(result.scores["fitted_lens"], result.scores["logit_lens"])
    assert np.array_equal(
        result.scores["ig_lens_fitted_block"], result.scores["ig_lens"]
    )


def test_lens_for_another_model_is_refused_before_any_forward(llama4, tiny_facts):
    calls = []
    handle = llama4.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="lens|translator"):
            _run(llama4, tiny_facts, _random_translators(4, 16))
        with pytest.raises(ValueError, match="lens|translator"):
            _run(llama4, tiny_facts, _random_translators(3, 32))
    finally:
        handle.remove()
    assert not calls


def test_learned_methods_need_a_lens(llama4, tiny_facts):
    with pytest.raises(ValueError, match="need a fitted lens"):
        _run(llama4, tiny_facts, None, methods=("ig_lens", "fitted_lens"))


def test_a_lens_adds_its_methods_to_the_defaults(llama4, tiny_facts):
    result = run_restoration(
        llama4,
        word_tokenizer(VOCAB),
        tiny_facts[:2],
        corruptions=("counterfactual",),
        study=StudyOptions(n_bootstrap=10, conductance_prompts=0),
        progress=False,
        lens=Translators.identity(4, 32),
    )
    assert set(LEARNED) <= set(result.methods)


def test_subject_field_is_honoured_and_an_unfound_subject_named(llama4, tmp_path):
    from captum_iglens.studies.validation import load_facts

    path = tmp_path / "facts.jsonl"
    rows = [
        {
            "id": "a",
            "relation": "r",
            "prompt": "w4 w10 w11 w5 w6",
            "subject": "w10 w11",
        },
        {
            "id": "b",
            "relation": "r",
            "prompt": "w4 w20 w21 w5 w6",
            "subject": "w20 w21",
        },
        {"id": "c", "relation": "r", "prompt": "w4 w30 w5 w6", "subject": "w99"},
        {"id": "d", "relation": "capital", "prompt": "The capital of x is"},
    ]
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    facts = load_facts(path)
    assert facts[0].subject_span() == (3, 10)  # no pattern for relation "r"
    assert facts[2].subject_span() is None
    assert facts[3].subject_span() == (15, 16)  # the shipped pattern
    result = run_restoration(
        llama4,
        word_tokenizer(VOCAB),
        facts[:3],
        corruptions=("counterfactual",),
        methods=("ig_lens", "random"),
        study=STUDY,
        progress=False,
    )
    assert [f.id for f in result.facts] == ["a", "b"]
    assert result.settings["subjects_not_found"] == ["c"]
    assert "1 facts left out, their subject not found in the prompt: c" in (
        result.format_table()
    )
    assert result.facts[0].subject == "w10 w11"
    saved = tmp_path / "r.json"
    result.save(saved)
    from captum_iglens.studies.validation import RestorationResult

    assert RestorationResult.load(saved).facts[0].subject == "w10 w11"
