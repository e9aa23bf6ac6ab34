"""A readout of a new kind is one object: defined here alone, it runs through
LayerIGLens, splits its credits into block and lens-change parts that add up to
p_model - f_0(h_base), and is recorded in results by its own kind and checksum.
The logit readout is the identity case of the same interface."""

import hashlib
from typing import Optional, Sequence

import pytest
import torch
from torch import nn, Tensor

from captum_iglens import IGLensResult, LayerIGLens
from captum_iglens.attr.granularities import GRANULARITIES, Blocks
from captum_iglens.hf import model_parts
from captum_iglens.readout import Readout
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.layer_readout import readout_record
from captum_iglens.readout.scores import TokenScore
from tests.helpers import block_states
from tests.tiny_models import VOCAB, tiny_model

TOL = 1e-6


class Scaled:
    """The model's readout with a temperature per hidden state:
    ``f_i(h) = softmax(R(h) / t_i)``, ``t_L = 1`` (the model's own)."""

    kind = "scaled"

    def __init__(
        self, base: Readout, blocks: Sequence[nn.Module], temperatures: Sequence[float]
    ) -> None:
        assert len(temperatures) == len(blocks) + 1 and temperatures[-1] == 1.0
        self.base = base
        self.blocks = list(blocks)
        self.temperatures = torch.tensor(temperatures, dtype=torch.float64)
        self.max_chunk_bytes = base.max_chunk_bytes

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def rows_per_chunk(self, backward: bool = False) -> int:
        return self.base.rows_per_chunk(backward)

    def __call__(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        logits = self.base(hidden)
        if layer is None:
            return logits
        t = self.temperatures.to(logits.device, logits.dtype)
        return logits / t[layer.to(logits.device)][..., None]

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        return score.of(torch.log_softmax(self(hidden, layer).float(), -1))

    def checksum(self) -> str:
        return hashlib.sha256(self.temperatures.numpy().tobytes()).hexdigest()

    def state_index(self, block: nn.Module) -> int:
        for i, candidate in enumerate(self.blocks):
            if candidate is block:
                return i + 1
        raise ValueError("layer: a block the scaled readout does not read")

    def same(self, i: int, j: int) -> bool:
        return bool(self.temperatures[i] == self.temperatures[j])


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", num_hidden_layers=3)


def _scaled(model, temperatures):
    parts = model_parts(model)
    return Scaled(parts.readout(), parts.blocks, temperatures)


def _ids(batch=2, length=6):
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def test_the_logit_readout_is_the_identity_case(llama):
    readout = model_parts(llama).readout()
    assert isinstance(readout, LayerwiseReadout)
    assert readout.kind == "logit" and readout.base is readout
    assert readout.checksum() is None and readout.same(0, 3)
    assert readout_record(readout) == {"kind": "logit", "checksum": None}
    scaled = _scaled(llama, [0.5, 2.0, 2.0, 1.0])
    assert isinstance(scaled, LayerwiseReadout) and not isinstance(scaled, nn.Module)
    assert readout_record(scaled) == {"kind": "scaled", "checksum": scaled.checksum()}


@pytest.mark.parametrize("granularity", ["block", "sublayer", "head"])
def test_a_new_kind_splits_credits_that_add_up(llama, granularity, tmp_path):
    scaled = _scaled(llama, [0.5, 2.0, 2.0, 1.0])
    lens = LayerIGLens.from_model(llama, lens=scaled)
    assert lens.readout is scaled
    ids = _ids()
    result = lens.attribute_map(ids, granularity=granularity)

    # p_model - f_0(h_base), from the test's own hooks and temperatures
    states, logits = block_states(llama, ids, torch.ones_like(ids))
    y = logits.argmax(-1)
    readout = model_parts(llama).readout()
    model_prob = torch.softmax(logits.double(), -1).gather(-1, y[..., None])[..., 0]
    base_logits = readout(states[0]).double() / 0.5
    base_prob = torch.softmax(base_logits, -1).gather(-1, y[..., None])[..., 0]
    change = model_prob - base_prob

    assert (result.attributions.sum(-1).double() - change).abs().max() <= TOL
    parts = result.block_part.sum(-1) + result.lens_change.sum(-1)
    assert (parts.double() - change).abs().max() <= TOL
    assert result.lens_change.abs().max() > 1e-3  # the temperatures differ
    if granularity == "block":  # states 1 and 2 are read alike
        assert torch.equal(result.lens_change[..., 1], torch.zeros(2, 6))

    assert (result.readout_kind, result.readout_checksum) == (
        "scaled",
        scaled.checksum(),
    )
    result.save(tmp_path / "scaled.json")
    loaded = IGLensResult.load(tmp_path / "scaled.json")
    assert (loaded.readout_kind, loaded.readout_checksum) == (
        "scaled",
        scaled.checksum(),
    )
    assert torch.equal(loaded.lens_change, result.lens_change)
    assert torch.equal(loaded.attributions, result.attributions)


def test_the_constructor_takes_a_new_kind_and_checks_its_blocks(llama):
    scaled = _scaled(llama, [0.5, 2.0, 2.0, 1.0])
    blocks = model_parts(llama).blocks
    lens = LayerIGLens(llama, list(blocks), readout=scaled)
    result = lens.attribute_map(_ids(1, 4))
    assert result.readout_kind == "scaled"
    with pytest.raises(ValueError, match="layer: a block the scaled readout"):
        LayerIGLens(llama, [blocks[0], llama.lm_head], readout=scaled)
    with pytest.raises(TypeError, match="readout: expected a captum_iglens.Readout"):
        LayerIGLens(llama, list(blocks), readout=object())


def test_a_granularity_without_blocks_needs_one_readout_along_the_path(
    llama, monkeypatch
):
    class Unplaced(Blocks):  # a granularity no readout per layer can split
        name = "unplaced"
        learned_readout = False

    monkeypatch.setitem(GRANULARITIES, Unplaced.name, Unplaced)
    ids = _ids(1, 4)
    uniform = LayerIGLens.from_model(llama, lens=_scaled(llama, [1.0] * 4))
    today = LayerIGLens.from_model(llama).attribute_map(ids, granularity="unplaced")
    found = uniform.attribute_map(ids, granularity="unplaced")
    assert torch.equal(found.attributions, today.attributions)
    assert found.readout_kind == "scaled"
    assert torch.equal(found.lens_change, torch.zeros_like(found.attributions))
    varying = LayerIGLens.from_model(llama, lens=_scaled(llama, [0.5, 2.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"not available .* per layer \(scaled\)"):
        varying.attribute_map(ids, granularity="unplaced")
