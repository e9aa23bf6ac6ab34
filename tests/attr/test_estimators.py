"""The estimators are objects in one registry; readouts see the path point of
every row they read."""

import ast
from pathlib import Path
from typing import List, Optional

import pytest
import torch
from torch import Tensor

import captum_iglens
from captum_iglens import ESTIMATORS
from captum_iglens.attr.paths import Telescoping
from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.attr.estimators import Estimator, Integration, estimator
from captum_iglens.readout import Readout
from captum_iglens.readout.interface import PathReadout
from captum_iglens.readout.scores import TokenScore

PACKAGE = Path(captum_iglens.__file__).parent


def test_the_registry_maps_names_to_estimators_in_order():
    assert list(ESTIMATORS) == [
        "prediction_aware",
        "adaptive",
        "riemann_left",
        "riemann_right",
        "riemann_middle",
        "riemann_trapezoid",
        "gausslegendre",
    ]
    for name, found in ESTIMATORS.items():
        assert isinstance(found, Estimator) and found.name == name
        assert estimator(name) is found
    exact = [name for name, found in ESTIMATORS.items() if found.exact]
    assert exact == ["prediction_aware", "adaptive"]
    assert ESTIMATORS["prediction_aware"].gradient_free_map
    assert not ESTIMATORS["prediction_aware"].supports_unmultiplied
    assert all(found.supports_unmultiplied for found in list(ESTIMATORS.values())[2:])
    assert [found.min_steps for found in ESTIMATORS.values()] == [1, 1, 2, 2, 2, 2, 1]


def test_an_unknown_method_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"method: expected one of \['prediction"):
        estimator("simpson")
    with pytest.raises(ValueError, match="method"):
        estimator(["gausslegendre"])


def test_no_method_name_is_compared_outside_the_estimators():
    """Behaviour that depends on the estimator is an attribute of it."""
    names = set(ESTIMATORS) | {"riemann"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "estimators" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            strings = []
            if isinstance(node, ast.Compare):
                strings = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                "startswith",
                "endswith",
            ):
                strings = list(node.args)
            hits = [
                s.value
                for s in strings
                if isinstance(s, ast.Constant) and s.value in names
            ]
            found += [f"{path.name}:{node.lineno} {h}" for h in hits]
    assert found == []


class _Recording(torch.nn.Module):
    """A readout that records the path point of every row it reads, and reads
    each point through its own scale (a per-layer readout ``f_l``)."""

    def __init__(self, readout: Readout, scales: Tensor) -> None:
        super().__init__()
        self.readout, self.scales = readout, scales
        self.max_chunk_bytes = readout.max_chunk_bytes
        self.seen: List[Tensor] = []

    @property
    def vocab_size(self) -> int:
        return self.readout.vocab_size

    @property
    def device(self) -> torch.device:
        return self.readout.device

    def rows_per_chunk(self, backward: bool = False) -> int:
        return self.readout.rows_per_chunk(backward)

    def forward(self, hidden: Tensor, layer: Optional[Tensor] = None) -> Tensor:
        self.seen.append(layer.detach().clone())
        return self.readout(hidden * self.scales[layer, None])

    def score(
        self, hidden: Tensor, score: TokenScore, layer: Optional[Tensor] = None
    ) -> Tensor:
        return score.of(torch.log_softmax(self(hidden, layer).float(), -1))


def _setup(k: int = 3, n: int = 2, d: int = 4):
    torch.manual_seed(0)
    readout = Readout(head=torch.nn.Linear(d, 5))
    per_layer = _Recording(readout, torch.linspace(0.5, 2.0, k + 1))
    points = torch.randn(n, k + 1, d)
    return readout, per_layer, points, TokenScore.build(torch.tensor([1, 3]))


def test_path_values_read_each_point_with_its_layer():
    readout, per_layer, points, score = _setup()
    assert isinstance(per_layer, PathReadout) and isinstance(readout, PathReadout)
    values, _ = path_values(per_layer, points, score, 64)
    assert torch.cat(per_layer.seen).tolist() == [0, 1, 2, 3] * 2
    scaled = points * per_layer.scales[None, :, None]
    expected, _ = path_values(readout, scaled, score, 64)
    torch.testing.assert_close(values, expected)
    later = torch.arange(1, 4)  # the points after h_base, as path points 1..3
    shifted, _ = path_values(per_layer, points[:, 1:], score, 64, layers=later)
    torch.testing.assert_close(shifted, expected[:, 1:])


def test_the_models_readout_ignores_the_layer():
    readout, _, points, score = _setup()
    flat = points.flatten(0, 1)
    layer = torch.arange(flat.shape[0])
    assert torch.equal(readout(flat, layer), readout(flat))
    assert torch.equal(
        readout.score(flat, score.repeat_interleave(4), layer),
        readout.score(flat, score.repeat_interleave(4)),
    )


@pytest.mark.parametrize("method", ["prediction_aware", "gausslegendre"])
def test_estimators_read_a_segment_with_the_layer_at_its_end(method):
    _, per_layer, points, score = _setup()
    values, _ = path_values(per_layer, points, score, 64)
    per_layer.seen.clear()
    rule = ESTIMATORS[method]
    found = rule.attributions(
        Integration(rule, per_layer, 4, 64, Telescoping()), points, score, values[:, -1]
    )
    seen = torch.cat(per_layer.seen).unique().tolist()
    assert seen == [1, 2, 3]  # never 0: h_base only starts segment 1
    assert found.shape == (2, 3, 4)
