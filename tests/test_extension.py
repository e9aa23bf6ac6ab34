"""Extending IG-Lens: a toy estimator, granularity, path and model family, each
defined in this file alone and added to its registry, run through
``attribute_map``; and the file counts of docs/extending.md checked against the
registries they name."""

import importlib
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, GPTBigCodeConfig

from captum_iglens import LayerIGLens, register_architecture
from captum_iglens.attr._utils.capture import PathPoint
from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.attr.estimators import ESTIMATORS, Estimator, Integration
from captum_iglens.attr.granularities import GRANULARITIES, PathGranularity
from captum_iglens.attr.paths import PATHS, IntegrationPath
from captum_iglens.attr.tracing import TracedPath
from captum_iglens.hf import supported_model_types
from captum_iglens.hf.architectures import unregister_architecture
from captum_iglens.readout.scores import TokenScore
from tests.helpers import left_padded

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

    def components(
        self,
        integration: Integration,
        ends: Tensor,
        components: Tensor,
        targets: TokenScore,
        end_values: Tensor,
        layers: Optional[Tensor] = None,
        parents: Optional[Tensor] = None,
    ) -> Tensor:
        shares = _shares(end_values[:, 1] - end_values[:, 0], components).float()
        return shares if integration.per_dimension else shares.sum(-1)


class BlockPairs(PathGranularity):
    """One column per pair of consecutive chosen blocks (the last alone when
    their number is odd)."""

    name = "toy_block_pairs"
    summary = "one credit per pair of blocks"

    def path_points(self) -> Tuple[List[PathPoint], List[str]]:
        ends = list(range(1, len(self.layers), 2))
        if len(self.layers) % 2:
            ends.append(len(self.layers) - 1)
        names = [
            "+".join(self.layer_names[max(0, j - 1 if j % 2 else j) : j + 1])
            for j in ends
        ]
        return [(self.layers[j], False) for j in ends], names


class JointBlocks(IntegrationPath):
    """Every column's update scaled together along one straight line from
    ``h_base`` to ``h_final``, each credited by the estimator's split of it."""

    name = "toy_joint"
    summary = "all updates at once"

    def map_needs_gradients(self, shape: PathGranularity, rule: Estimator) -> bool:
        return True

    def credits(
        self,
        shape: PathGranularity,
        integration: Integration,
        path: TracedPath,
        values: Tensor,
    ) -> Tensor:
        return self._split(integration, path, values)

    def attributions(
        self, shape: PathGranularity, integration: Integration, path: TracedPath
    ) -> Tensor:
        raise NotImplementedError("the toy joint path has a map only")

    def _split(
        self, integration: Integration, path: TracedPath, values: Tensor
    ) -> Tensor:
        b, p, k_plus_1, d = path.points.shape
        points = path.points.flatten(0, 1)
        credits = integration.rule.components(
            integration,
            points[:, [0, -1]],
            points.diff(dim=1).float(),
            path.score.flatten(),
            values.flatten(0, 1)[:, [0, -1]],
        )
        return credits.view(b, p, k_plus_1 - 1) * path.mask[..., None]


@pytest.fixture
def toys(monkeypatch):
    """The toys, each added to its registry for the test only."""
    monkeypatch.setitem(ESTIMATORS, SquaredShares.name, SquaredShares())
    monkeypatch.setitem(GRANULARITIES, BlockPairs.name, BlockPairs)
    monkeypatch.setitem(PATHS, JointBlocks.name, JointBlocks)


def _completeness(result) -> float:
    change = result.model_prob - result.base_prob
    return float((result.total - change)[result.mask].abs().max())


@pytest.mark.parametrize("method", ["toy_squared_shares", "prediction_aware"])
@pytest.mark.parametrize("granularity", ["toy_block_pairs", "block"])
@pytest.mark.parametrize("path", ["toy_joint", "telescoping"])
def test_toys_run_through_attribute_map(toys, llama, method, granularity, path):
    lens = LayerIGLens.from_model(llama)
    ids, mask = left_padded([6, 4], llama.config.vocab_size)
    result = lens.attribute_map(
        ids,
        additional_forward_args=(mask,),
        method=method,
        granularity=granularity,
        path=path,
    )
    names = ["0+1"] if granularity == "toy_block_pairs" else ["0", "1"]
    assert result.layer_names == names
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
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7, 8]])
    joint = lens.attribute_map(ids, path="toy_joint")
    telescoping = lens.attribute_map(ids)
    assert not torch.allclose(joint.attributions, telescoping.attributions)
    torch.testing.assert_close(joint.total, telescoping.total, atol=1e-6, rtol=0)


def test_unknown_names_are_refused_naming_the_registry(llama):
    lens = LayerIGLens.from_model(llama)
    ids = torch.tensor([[5, 6, 7]])
    for kwargs, arg in (
        ({"path": "toy_joint"}, "path"),
        ({"method": "toy_squared_shares"}, "method"),
        ({"granularity": "toy_block_pairs"}, "granularity"),
    ):
        with pytest.raises(ValueError, match=f"{arg}: expected one of"):
            lens.attribute_map(ids, **kwargs)


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
        lens = LayerIGLens.from_model(model)
        ids, mask = left_padded([6, 4], 64)
        for granularity in ("block", "sublayer", "head"):
            result = lens.attribute_map(
                ids, additional_forward_args=(mask,), granularity=granularity
            )
            assert _completeness(result) <= 1e-6
    finally:
        unregister_architecture("gpt_bigcode")


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
