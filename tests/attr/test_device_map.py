"""A model dispatched with accelerate's device_map (CPU-only here): the same map."""

import torch
from accelerate import dispatch_model

from captum_iglens import LayerIGLens
from tests.helpers import hook_snapshot, left_padded
from tests.tiny_models import VOCAB, tiny_model


def test_device_map_model_gives_the_same_map():
    reference = tiny_model("llama")
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.norm": "cpu",
        "lm_head": "cpu",
    }
    # force_hooks: accelerate's device-alignment hooks even on one device, as a
    # real multi-device map installs them.
    sharded = dispatch_model(tiny_model("llama"), device_map, force_hooks=True)
    assert hasattr(sharded.model.layers[0], "_hf_hook")
    ids, mask = left_padded([6, 4], VOCAB)
    expected = LayerIGLens.from_model(reference).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    hooks = hook_snapshot(sharded)
    result = LayerIGLens.from_model(sharded).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    assert hook_snapshot(sharded) == hooks
    assert result.delta.abs().max() <= 1e-6
    assert torch.allclose(result.attributions, expected.attributions, atol=1e-6)
