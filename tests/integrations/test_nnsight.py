"""IG-Lens on an nnsight LanguageModel wrapping a tiny local model."""

import warnings

import pytest
import torch

from captum_iglens import LayerIGLens, attribute_text
from captum_iglens.integrations import unwrap_model
from tests.helpers import assert_heads_add_up_to_blocks
from tests.tiny_models import VOCAB, tiny_model, tiny_tokenizer

pytest.importorskip("nnsight")
from nnsight import LanguageModel  # noqa: E402

FP32_TOL = 1e-6


@pytest.fixture(scope="module")
def lm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel's deprecation notice
        return LanguageModel(tiny_model("qwen3_moe"), tokenizer=tiny_tokenizer())


def test_exact_against_the_traced_logits(lm):
    assert unwrap_model(lm) is lm._module
    ids = torch.randint(3, VOCAB, (2, 6))
    with lm.trace(ids):
        logits = lm.output.logits.save()
    with torch.inference_mode(False), torch.no_grad():
        probs = logits.clone().softmax(-1)  # traced in inference mode
    lens, maps = LayerIGLens.from_model(lm), {}
    for granularity in ("block", "sublayer", "head"):
        result = maps[granularity] = lens.attribute_map(ids, granularity=granularity)
        p_traced = probs.gather(-1, result.targets[..., None])[..., 0]
        assert (result.model_prob - p_traced).abs().max() <= FP32_TOL
        assert (result.targets == probs.argmax(-1)).all()
        change = result.model_prob - result.base_prob
        assert (result.total - change).abs().max() <= FP32_TOL
    assert_heads_add_up_to_blocks(maps["head"], maps["block"])


def test_attribute_text_on_a_language_model(lm):
    result = attribute_text(lm, lm.tokenizer, "t5 t6 t7", answer="t8 t9", chat=False)
    assert result.delta.abs().max() <= FP32_TOL
    assert torch.isfinite(result.attributions).all()
