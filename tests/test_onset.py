"""The onset rules, one definition for the result and the studies."""

import numpy as np
import pytest
import torch

from captum_iglens import IGLensResult
from captum_iglens.onset import DEFAULT_ONSET_RULE, ONSET_RULES, onset_layers
from captum_iglens.studies.validation import stats

# |c| = .2 .3 .4 .5 .1 (total 1.5): cumulative .2 .5 .9, half (.75) at index 2.
# max(c, 0) = .2 .3 0 .5 0 (total 1.0): cumulative .2 .5, half at index 1.
# The largest credit, .5, at index 3.
CREDITS = [0.2, 0.3, -0.4, 0.5, -0.1]


def test_each_rule_by_hand():
    credits = torch.tensor(CREDITS)
    assert onset_layers(credits, rule="abs").item() == 2
    assert onset_layers(credits, rule="positive").item() == 1
    assert onset_layers(credits, rule="argmax").item() == 3
    # Cumulative positive mass .2 .5 .5 1.0: all of it only at index 3, a
    # tenth already at index 0.
    assert onset_layers(credits, 1.0, "positive").item() == 3
    assert onset_layers(credits, 0.1, "positive").item() == 0
    # abs: .2 .5 .9 1.4 1.5; 0.9 of 1.5 = 1.35 reached at index 3.
    assert onset_layers(credits, 0.9, "abs").item() == 3


def test_rules_without_an_onset_and_ties():
    negative = torch.tensor([-0.1, -0.3, -0.2])
    assert onset_layers(negative, rule="positive").item() == -1
    assert onset_layers(negative, rule="abs").item() == 1  # .1 .4 of .6
    assert onset_layers(negative, rule="argmax").item() == 0  # -0.1 is largest
    for rule in ONSET_RULES:
        assert onset_layers(torch.zeros(4), rule=rule).item() == -1
    assert onset_layers(torch.tensor([0.0, 0.3, 0.3]), rule="argmax").item() == 1


def test_rules_apply_row_by_row():
    rows = torch.tensor([CREDITS, [0.0, 0.0, 0.0, 0.0, 1.0]])
    assert onset_layers(rows, rule="positive").tolist() == [1, 4]
    assert onset_layers(rows[None], rule="argmax").tolist() == [[3, 4]]


def test_rule_and_frac_are_checked():
    with pytest.raises(ValueError, match="rule: expected one of"):
        onset_layers(torch.ones(3), rule="half")
    with pytest.raises(ValueError, match="frac:"):
        onset_layers(torch.ones(3), 0.0, "positive")
    assert DEFAULT_ONSET_RULE in ONSET_RULES


def _result(attributions: torch.Tensor) -> IGLensResult:
    b, p, k = attributions.shape
    mask = torch.ones(b, p, dtype=torch.bool)
    mask[0, 0] = False  # padding
    return IGLensResult(
        attributions=attributions * mask[..., None],
        levels=torch.full((b, p, k), 0.5),
        base_prob=torch.zeros(b, p),
        model_prob=torch.zeros(b, p),
        delta=(attributions * mask[..., None]).sum(-1),
        targets=torch.zeros(b, p, dtype=torch.long),
        positions=torch.arange(p),
        mask=mask,
        layer_names=[str(i) for i in range(k)],
        method="prediction_aware",
        n_steps=1,
    )


def test_the_result_and_the_studies_apply_the_same_rules():
    attributions = torch.tensor([CREDITS, CREDITS[::-1]]).repeat(2, 1, 1)
    result = _result(attributions)
    # Reversed: |c| .1 .5 .4 .3 .2 → .1 .6 .9, index 2; max(c, 0) 0 .5 0 .3 .2
    # → 0 .5 (half of 1.0) at index 1; the largest at index 1.
    expected = {"abs": [2, 2], "positive": [1, 1], "argmax": [3, 1]}
    for rule, (first, second) in expected.items():
        onset = result.onset(rule=rule)
        assert onset.tolist() == [[-1, second], [first, second]]
        ours = [stats.onset_index(row.numpy(), 0.5, rule) for row in attributions[1]]
        assert ours == [first, second]
    assert torch.equal(result.onset(), result.onset(rule=DEFAULT_ONSET_RULE))
    with pytest.raises(ValueError, match="rule:"):
        result.onset(rule="max")
    with pytest.raises(ValueError, match="rule:"):
        stats.onset_index(np.ones(3), rule="max")
