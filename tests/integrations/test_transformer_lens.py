"""IG-Lens on a TransformerLens 4 bridge around a tiny model (nothing downloaded)."""

import pytest
import torch

from captum_iglens import LayerIGLens, attribute_text
from captum_iglens.hf import model_parts
from captum_iglens.integrations import unwrap_model
from captum_iglens.integrations.transformer_lens import (
    hook_name,
    is_bridge,
    with_hook_names,
)
from tests.helpers import assert_heads_add_up_to_blocks
from tests.tiny_models import VOCAB, tiny_model, tiny_tokenizer

pytest.importorskip("transformer_lens")
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

FP32_TOL = 1e-6


@pytest.fixture(scope="module", params=["llama", "mixtral"])
def bridge(request):
    return TransformerBridge.boot_transformers(
        f"tiny-{request.param}",
        hf_model=tiny_model(request.param),
        tokenizer=tiny_tokenizer(),
    )


def test_exact_against_the_bridges_own_logits(bridge):
    assert is_bridge(bridge) and unwrap_model(bridge) is bridge.original_model
    ids = torch.randint(3, VOCAB, (2, 6))
    lens = LayerIGLens.from_model(bridge)
    with torch.no_grad():
        logits = bridge(ids)  # the bridge's own forward
    maps = {}
    for granularity in ("block", "sublayer", "head"):
        result = maps[granularity] = lens.attribute_map(ids, granularity=granularity)
        p_bridge = logits.softmax(-1).gather(-1, result.targets[..., None])[..., 0]
        assert (result.model_prob - p_bridge).abs().max() <= FP32_TOL
        change = result.model_prob - result.base_prob
        assert (result.total - change).abs().max() <= FP32_TOL
        assert (result.targets == logits.argmax(-1)).all()
    assert_heads_add_up_to_blocks(maps["head"], maps["block"])


def test_hook_names_match_the_bridges_residual_stream(bridge):
    ids = torch.randint(3, VOCAB, (1, 5))
    lens = LayerIGLens.from_model(bridge)
    named = with_hook_names(lens.attribute_map(ids, granularity="sublayer"))
    assert named.layer_names == [
        "blocks.0.hook_resid_mid",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_mid",
        "blocks.1.hook_resid_post",
    ]
    # The final hook point's state, read out, gives the bridge's logits.
    _, cache = bridge.run_with_cache(ids)
    with torch.no_grad():
        read = model_parts(bridge).readout()(cache["blocks.1.hook_resid_post"])
    torch.testing.assert_close(read, bridge(ids), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="segment"):
        hook_name("blocks.1")


def test_attribute_text_on_a_bridge(bridge):
    result = attribute_text(
        bridge, bridge.tokenizer, "t5 t6 t7", answer="t8 t9", chat=False
    )
    assert result.tokens[0][-2:] == ["t8", "t9"]
    assert result.delta.abs().max() <= FP32_TOL


def test_a_bridge_with_other_logits_is_refused():
    bridge = TransformerBridge.boot_transformers(
        "tiny-llama", hf_model=tiny_model("llama"), tokenizer=tiny_tokenizer()
    )
    original = bridge.forward
    bridge.forward = lambda *a, **k: original(*a, **k) * 2.0
    with pytest.raises(ValueError, match="TransformerBridge's logits differ"):
        LayerIGLens.from_model(bridge)
