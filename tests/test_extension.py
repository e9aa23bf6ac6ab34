"""Extending IG-Lens: a toy readout, path, granularity, estimator and model
family, each defined in this file alone (and added to its registry, where it has
one), run through ``attribute_map``; and the file counts of docs/extending.md
checked against the registries they name."""

import hashlib
import importlib
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest
import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, GPTBigCodeConfig

from captum_iglens import IGLensResult, LayerIGLens, register_architecture
from captum_iglens._utils.registry import Home, Registry
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.attr.estimators import (
    ESTIMATORS,
    Estimator,
    Integration,
    Segments,
    SplitChains,
)
from captum_iglens.attr.granularities import GRANULARITIES, Blocks, PathGranularity
from captum_iglens.attr.paths import PATHS, IntegrationPath
from captum_iglens.hf import model_parts, supported_model_types
from captum_iglens.hf.architectures import unregister_architecture
from captum_iglens.readout import Readout
from captum_iglens.readout.interface import LayerwiseReadout
from captum_iglens.readout.layer_readout import readout_record
from captum_iglens.readout.scores import TokenScore
from tests.helpers import block_states, left_padded
from tests.tiny_models import VOCAB, tiny_model

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _shares(change: Tensor, parts: Tensor) -> Tensor:
    """``change`` ``(M,)`` split over ``parts`` ``(M, C, d)`` in proportion to
    their squared entries: ``(M, C, d)``, adding up to ``change``."""
    weight = parts.double().square()
    total = weight.sum((1, 2), keepdim=True).clamp_min(1e-300)
    return change.double()[:, None, None] * weight / total


class SquaredShares(Estimator):
    """Each segment's observed change of ``f``, split over dimensions (or
    components) by their squared displacement: exact, gradient-free."""

    name = "toy_squared_shares"
    exact = True
    gradient_free_map = True
    supports_unmultiplied = False

    def attributions(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
    ) -> Tensor:
        values = path_values(
            integration.readout, points, targets, integration.chunk_rows, layers=layers
        )[0]
        values[:, -1] = end_values
        n, k_plus_1, d = points.shape
        steps = points.diff(dim=1).reshape(n * (k_plus_1 - 1), 1, d)
        shares = _shares(values.diff(dim=-1).flatten(), steps)
        return shares.view(n, k_plus_1 - 1, d).to(values.dtype)

    def components(self, integration: Integration, segments: Segments) -> Tensor:
        parts = segments.components[:]  # a tensor, or components built on demand
        change = segments.end_values[:, 1] - segments.end_values[:, 0]
        shares = _shares(change, parts).float()
        return shares if integration.per_dimension else shares.sum(-1)


class BlockPairs(PathGranularity):
    """One column per pair of consecutive chosen blocks (the last alone when
    their number is odd)."""

    name = "toy_block_pairs"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        ends = list(range(1, len(self.layers), 2))
        if len(self.layers) % 2:
            ends.append(len(self.layers) - 1)
        names = [
            "+".join(self.layer_names[max(0, j - 1 if j % 2 else j) : j + 1])
            for j in ends
        ]
        return [(self.layers[j], False) for j in ends], names


class EqualShares(IntegrationPath):
    """A toy path: every column gets the same share of ``f(h_final) -
    f(h_base)`` (exact, and blind to what the blocks did)."""

    name = "toy_equal_shares"

    def segments(
        self,
        integration: Integration,
        points: Tensor,
        targets: TokenScore,
        values: Tensor,
        blocks: Optional[Sequence[int]] = None,
    ) -> Tensor:
        if integration.per_dimension:
            raise NotImplementedError("the toy path has a map only")
        n = points.shape[1] - 1
        return _equal(values, n).expand(-1, n)

    def split_segments(
        self, integration: Integration, chains: SplitChains
    ) -> Tuple[Tensor, Tensor]:
        if integration.per_dimension:
            raise NotImplementedError("the toy path has a map only")
        c, n_split = chains.components.shape[1], len(chains.split)
        share = _equal(chains.values, n_split * c + len(chains.whole))
        parts = share.expand(-1, n_split * c).reshape(-1, c)
        return parts, share.expand(-1, len(chains.whole)).flatten()


def _equal(values: Tensor, n: int) -> Tensor:
    """``(f(end) - f(start)) / n`` per row, ``(N, 1)``."""
    return ((values[:, -1] - values[:, 0]) / n)[:, None]


@pytest.fixture
def toys(monkeypatch):
    """The toys, each added to its registry for the test only."""
    monkeypatch.setitem(ESTIMATORS, SquaredShares.name, SquaredShares())
    monkeypatch.setitem(GRANULARITIES, BlockPairs.name, BlockPairs)
    monkeypatch.setitem(PATHS, EqualShares.name, EqualShares)


@pytest.mark.parametrize("registry", [ESTIMATORS, GRANULARITIES, PATHS])
def test_each_built_in_entry_is_imported_under_its_own_name(registry):
    for name, entry in registry.items():
        assert entry.name == name
    home = Home("blocks:Blocks", "misnamed")
    misnamed = Registry("captum_iglens.attr.granularities", {"whole": home})
    assert list(misnamed) == ["whole"] and misnamed.summary("whole") == "misnamed"
    with pytest.raises(ValueError, match="blocks:Blocks is named 'block', "):
        misnamed["whole"]


@pytest.mark.parametrize("registry", [GRANULARITIES, PATHS])
def test_a_summary_outlives_the_lookup(registry):
    """The help reads the summaries after entries were looked up (a shell
    session, a test run): looking one up must not lose its summary."""
    summaries = {name: registry.summary(name) for name in registry}
    assert all(summaries.values())
    for name in registry:
        registry[name]
    assert {name: registry.summary(name) for name in registry} == summaries


def _completeness(result) -> float:
    change = result.model_prob - result.base_prob
    return float((result.total - change)[result.mask].abs().max())


@pytest.mark.parametrize("method", ["toy_squared_shares", "prediction_aware"])
@pytest.mark.parametrize("granularity", ["toy_block_pairs", "block", "head"])
@pytest.mark.parametrize("path", ["toy_equal_shares", "telescoping", "joint"])
def test_toys_run_through_attribute_map(toys, llama, method, granularity, path):
    ig_lens = LayerIGLens.from_model(llama)
    ids, mask = left_padded([6, 4], llama.config.vocab_size)
    result = ig_lens.attribute_map(
        ids,
        additional_forward_args=(mask,),
        method=method,
        granularity=granularity,
        path=path,
    )
    names = {"toy_block_pairs": ["0+1"], "block": ["0", "1"]}.get(granularity)
    assert names is None or result.layer_names == names
    assert result.method == method
    assert _completeness(result) <= 1e-6
    assert result.attributions[result.mask].abs().sum() > 0
    if granularity == "block" and path == "telescoping":
        # on the telescoping path an exact estimator's block credits are the
        # readout's changes across the blocks
        steps = torch.cat([result.base_prob[..., None], result.levels], -1).diff(dim=-1)
        torch.testing.assert_close(
            result.attributions[result.mask], steps[result.mask], atol=1e-6, rtol=0
        )


def test_a_new_path_changes_the_split_not_the_total(toys, llama):
    ig_lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8]])
    equal = ig_lens.attribute_map(ids, path="toy_equal_shares")
    telescoping = ig_lens.attribute_map(ids)
    assert not torch.allclose(equal.attributions, telescoping.attributions)
    torch.testing.assert_close(equal.total, telescoping.total, atol=1e-6, rtol=0)


def test_unknown_names_are_refused_naming_the_registry(llama):
    ig_lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7]])
    for kwargs, arg in (
        ({"path": "toy_equal_shares"}, "path"),
        ({"method": "toy_squared_shares"}, "method"),
        ({"granularity": "toy_block_pairs"}, "granularity"),
    ):
        with pytest.raises(ValueError, match=f"{arg}: expected one of"):
            ig_lens.attribute_map(ids, **kwargs)


def test_a_model_family_is_one_registration():
    config = GPTBigCodeConfig(
        vocab_size=64, n_embd=32, n_layer=3, n_head=2, n_positions=64
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert "gpt_bigcode" not in supported_model_types()
    register_architecture(
        "gpt_bigcode",
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid="ln_2",
        norm_kind="layer",
        attn_out="attn.c_proj",
    )
    try:
        ig_lens = LayerIGLens.from_model(model)
        ids, mask = left_padded([6, 4], 64)
        for granularity in ("block", "sublayer", "head"):
            result = ig_lens.attribute_map(
                ids, additional_forward_args=(mask,), granularity=granularity
            )
            assert _completeness(result) <= 1e-6
    finally:
        unregister_architecture("gpt_bigcode")


# A readout of a new kind: one object, no registry.

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
def llama3():
    """A tiny Llama with 3 blocks, so that two states can be read alike."""
    return tiny_model("llama", num_hidden_layers=3)


def _scaled(model, temperatures):
    parts = model_parts(model)
    return Scaled(parts.readout(), parts.blocks, temperatures)


def _ids(batch=2, length=6):
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def test_the_logit_readout_is_the_identity_case(llama3):
    readout = model_parts(llama3).readout()
    assert isinstance(readout, LayerwiseReadout)
    assert readout.kind == "logit" and readout.base is readout
    assert readout.checksum() is None and readout.same(0, 3)
    assert readout_record(readout) == {"kind": "logit", "checksum": None}
    scaled = _scaled(llama3, [0.5, 2.0, 2.0, 1.0])
    assert isinstance(scaled, LayerwiseReadout) and not isinstance(scaled, nn.Module)
    assert readout_record(scaled) == {"kind": "scaled", "checksum": scaled.checksum()}


@pytest.mark.parametrize("granularity", ["block", "sublayer", "head"])
def test_a_new_kind_splits_credits_that_add_up(llama3, granularity, tmp_path):
    scaled = _scaled(llama3, [0.5, 2.0, 2.0, 1.0])
    ig_lens = LayerIGLens.from_model(llama3, lens=scaled)
    assert ig_lens.readout is scaled
    ids = _ids()
    result = ig_lens.attribute_map(ids, granularity=granularity)

    # p_model - f_0(h_base), from the test's own hooks and temperatures
    states, logits = block_states(llama3, ids, torch.ones_like(ids))
    y = logits.argmax(-1)
    readout = model_parts(llama3).readout()
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


def test_the_constructor_takes_a_new_kind_and_checks_its_blocks(llama3):
    scaled = _scaled(llama3, [0.5, 2.0, 2.0, 1.0])
    blocks = model_parts(llama3).blocks
    ig_lens = LayerIGLens(llama3, list(blocks), readout=scaled)
    result = ig_lens.attribute_map(_ids(1, 4))
    assert result.readout_kind == "scaled"
    with pytest.raises(ValueError, match="layer: a block the scaled readout"):
        LayerIGLens(llama3, [blocks[0], llama3.lm_head], readout=scaled)
    with pytest.raises(TypeError, match="readout: expected a captum_iglens.Readout"):
        LayerIGLens(llama3, list(blocks), readout=object())


def test_a_granularity_without_blocks_needs_one_readout_along_the_path(
    llama3, monkeypatch
):
    class Unplaced(Blocks):  # a granularity no readout per layer can split
        name = "unplaced"
        learned_readout = False

    monkeypatch.setitem(GRANULARITIES, Unplaced.name, Unplaced)
    ids = _ids(1, 4)
    uniform = LayerIGLens.from_model(llama3, lens=_scaled(llama3, [1.0] * 4))
    today = LayerIGLens.from_model(llama3).attribute_map(ids, granularity="unplaced")
    found = uniform.attribute_map(ids, granularity="unplaced")
    assert torch.equal(found.attributions, today.attributions)
    assert found.readout_kind == "scaled"
    assert torch.equal(found.lens_change, torch.zeros_like(found.attributions))
    varying = LayerIGLens.from_model(llama3, lens=_scaled(llama3, [0.5, 2.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"not available .* per layer \(scaled\)"):
        varying.attribute_map(ids, granularity="unplaced")


KINDS = ("a readout", "a path", "a granularity", "an estimator", "a model family")


def _page_rows() -> dict:
    """The rows of the page's table: what is added -> (the one file, where it is
    registered, other files to touch)."""
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith(("a ", "an ")):
            rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


@pytest.mark.parametrize(
    "what, registry, builtin",
    [
        ("a path", "captum_iglens.attr.paths.PATHS", "telescoping"),
        ("a granularity", "captum_iglens.attr.granularities.GRANULARITIES", "head"),
        ("an estimator", "captum_iglens.attr.estimators.ESTIMATORS", "gausslegendre"),
    ],
)
def test_the_page_names_one_file_and_the_registry(what, registry, builtin):
    one_file, registered, _ = _page_rows()[what]
    assert one_file.count(".py") == 1, one_file
    assert registered == f"`{registry}`"
    module, attr = registry.rsplit(".", 1)
    assert builtin in getattr(importlib.import_module(module), attr)


def test_the_page_counts_one_file_for_each_kind_but_a_study():
    rows = _page_rows()
    assert set(rows) == set(KINDS) | {"a study"}
    for kind in KINDS:
        assert rows[kind][0].count(".py") == 1, (kind, rows[kind])
        assert rows[kind][2] == "none", (kind, rows[kind])
    assert rows["a study"][2] != "none"


def _declared(kind: str) -> List[str]:
    """The names the page's section on ``kind`` lists after "Abstract methods:"
    (or "Protocol members:")."""
    section = PAGE.read_text().split(f"\n## {kind}\n")[1].split("\n## ")[0]
    for line in section.splitlines():
        if line.startswith(("Abstract methods:", "Protocol members:")):
            return sorted(name.strip(" `.") for name in line.split(":")[1].split(","))
    raise AssertionError(f"the section {kind!r} lists no methods")


def _protocol_members(*protocols: type) -> List[str]:
    """The methods and properties a protocol and its bases declare."""
    names = set()
    for protocol in protocols:
        for name, value in vars(protocol).items():
            if (name == "__call__" or not name.startswith("_")) and callable(
                getattr(value, "fget", value)
            ):
                names.add(name)
    return sorted(names)


@pytest.mark.parametrize(
    "kind, base",
    [
        ("A path", IntegrationPath),
        ("A granularity", PathGranularity),
        ("An estimator", Estimator),
    ],
)
def test_the_page_lists_exactly_the_abstract_methods(kind, base):
    assert _declared(kind) == sorted(base.__abstractmethods__)


def test_the_page_lists_exactly_the_readout_protocol():
    from captum_iglens.readout.interface import LayerwiseReadout, PathReadout

    assert _declared("A readout") == _protocol_members(PathReadout, LayerwiseReadout)


def test_a_third_path_runs_through_settings_text_and_the_onset_columns(toys, llama):
    """The toy path as the map's own path (``Settings``, ``attribute_text``, the
    table), and the main job's companion chosen by the declared role: the toy
    has none until it declares it, and then takes over where the joint path
    refuses the settings (the CLI's second onset column)."""
    from captum_iglens import Settings, attribute_text
    from captum_iglens.cli.attribute import companion_settings
    from tests.helpers import word_tokenizer

    tokenizer = word_tokenizer(llama.config.vocab_size)
    settings = Settings(path="toy_equal_shares", chat=False)
    assert settings.estimator == "prediction_aware"  # the path's default_method
    result = attribute_text(
        llama, tokenizer, "w5 w6 w7", answer=" w8 w9", settings=settings
    )
    assert result.path == "toy_equal_shares" and _completeness(result) <= 1e-6
    companion = companion_settings(settings)
    assert companion is not None and companion.path == "telescoping"
    other = attribute_text(
        llama, tokenizer, "w5 w6 w7", answer=" w8 w9", settings=companion
    )
    header = result.format_table(companion=other).splitlines()[0].split()
    assert header[-2:] == ["toy_equal_shares", "telescoping"]
    # joint refuses a number baseline at block granularity: no companion ...
    refused = Settings(baselines=0.5, chat=False)
    assert companion_settings(refused) is None
    # ... until the toy declares the role: then the next path with it is tried
    EqualShares.companion = True
    try:
        assert companion_settings(refused).path == "toy_equal_shares"
    finally:
        del EqualShares.companion
