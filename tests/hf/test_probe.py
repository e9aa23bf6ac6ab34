"""The structural probe: an unregistered model type is used only once verified."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from captum_iglens import LayerIGLens
from captum_iglens.hf import architectures, model_parts, table
from captum_iglens.hf.architectures import architecture
from captum_iglens.hf.probe import propose_parts
from captum_iglens.hf.table import REFUSED
from captum_iglens.readout import Softcap
from tests.helpers import block_states, hook_snapshot, left_padded
from tests.tiny_models import VOCAB, tiny_model

FP32_TOL = 1e-6


@pytest.fixture
def unregistered(monkeypatch):
    """Removes a built-in model type from the table for one test."""

    def remove(model_type: str) -> None:
        monkeypatch.delitem(architectures._REGISTRY, model_type)
        monkeypatch.delitem(table.BUILT_IN, model_type)

    return remove


class PlantedConfig(LlamaConfig):
    model_type = "planted_llama"


class Planted(LlamaForCausalLM):
    """A Llama under a new name whose forward adds a transform that nothing in its
    module tree or config names: logits ** 3 / 10."""

    config_class = PlantedConfig

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits**3 / 10
        return out


class Renamed(LlamaForCausalLM):
    """A plain Llama under a model type the table does not know."""

    config_class = PlantedConfig


def _from_llama(cls):
    fields = tiny_model("llama").config.to_dict()
    fields.pop("model_type")
    config = PlantedConfig(**fields)
    model = cls(config).eval()
    model.load_state_dict(tiny_model("llama").state_dict())
    return model


@pytest.mark.parametrize("arch", ["llama", "gemma2", "granite", "gpt2", "mixtral"])
def test_probe_accepts_a_known_structure_under_an_unknown_type(arch, unregistered):
    model = tiny_model(arch)
    unregistered(model.config.model_type)
    ids, mask = left_padded([6, 4], VOCAB)
    states, logits = block_states(model, ids, mask)
    with torch.no_grad():
        read = model_parts(model).readout()(states[-1])
    torch.testing.assert_close(read, logits, atol=1e-5, rtol=0)
    result = LayerIGLens.from_model(model).attribute_map(
        ids, additional_forward_args=(mask,)
    )
    expected = logits.softmax(-1).gather(-1, result.targets[..., None])[..., 0]
    real = result.mask
    assert (result.model_prob - expected)[real].abs().max() <= FP32_TOL
    change = result.model_prob - result.base_prob
    assert (result.total - change)[real].abs().max() <= FP32_TOL
    # The probe proposes no mid-block module: the sub-layer split is refused.
    with pytest.raises(ValueError, match="mid="):
        LayerIGLens.from_model(model).attribute_map(ids, granularity="sublayer")


def test_probe_reads_the_transform_from_the_config(unregistered):
    model = tiny_model("gemma2")
    unregistered("gemma2")
    post = model_parts(model).post
    assert isinstance(post, Softcap) and post.cap == 2.0
    # The no-transform proposal comes after it and would not reproduce the logits.
    names = [p.post_name for p in propose_parts(model)]
    assert names.index("Softcap(2.0)") < names.index("none")


def test_probe_accepts_a_renamed_llama():
    model = _from_llama(Renamed)
    assert model.config.model_type not in architectures.supported_model_types()
    entry = architecture(model)
    assert (entry.layers, entry.norm, entry.head) == (
        "model.layers",
        ("model.norm",),
        ("lm_head",),
    )
    assert entry.norm_kind == "rms" and entry.mid(model.config) is None
    assert architecture(model) is entry  # verified once per model


def test_probe_refuses_parts_that_do_not_reproduce_the_logits():
    model = _from_llama(Planted)
    model.train()
    hooks = hook_snapshot(model)
    for build in (LayerIGLens.from_model, model_parts):
        with pytest.raises(ValueError) as caught:
            build(model)
        message = str(caught.value)
        assert "planted_llama" in message
        assert "register_architecture('planted_llama', layers='model.layers'" in message
    # Nothing stays behind: hooks, train mode.
    assert hook_snapshot(model) == hooks
    assert all(m.training for m in model.modules())


def test_a_model_without_head_or_blocks_is_refused_with_the_registration():
    toy = nn.Linear(3, 3)
    toy.config = SimpleNamespace(model_type="toy", vocab_size=3)
    with pytest.raises(ValueError, match="register_architecture\\('toy'"):
        architecture(toy)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_types_say_why(model_type):
    stub = nn.Module()
    stub.config = SimpleNamespace(model_type=model_type)
    with pytest.raises(ValueError, match="AltUp"):
        architecture(stub)
