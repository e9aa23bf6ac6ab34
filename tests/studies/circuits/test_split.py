"""The training pairs of a search: drawn by seed apart from the scored ones,
none sharing a prompt with them, recorded, and an overlap refused."""

import pytest

from captum_iglens.studies.circuits.split import (
    TooFewPairs,
    check_disjoint,
    draw_split,
    pairs_sha256,
)
from captum_iglens.studies.circuits.tasks import Encoded, Pair


def _pair(i, clean=None, other=None):
    clean = clean or (1, 10 + i, 7)
    other = other or (1, 60 + i, 7)
    text = Pair(f"c{clean}", f"o{other}", " a", " b", line=i + 1)
    return Encoded(text, clean, other, 5, 6)


def test_the_split_is_disjoint_seeded_and_recorded():
    kept = [_pair(i) for i in range(30)]
    split, test, train = draw_split(kept, 10, 8, seed=3)
    assert test == kept[:10]  # the scored pairs are those of a run without --train
    assert split.test == tuple(range(10))
    assert len(train) == 8 and set(split.train) <= set(range(10, 30))
    assert train == [kept[i] for i in split.train]
    assert split.train_sha256 == pairs_sha256(train)
    assert split.test_sha256 == pairs_sha256(test)
    assert split.to_dict()["train"] == list(split.train) and split.seed == 3
    again, _, _ = draw_split(kept, 10, 8, seed=3)
    other, _, _ = draw_split(kept, 10, 8, seed=4)
    assert again == split and other.train != split.train


def test_pairs_sharing_a_prompt_with_a_scored_one_are_never_drawn():
    kept = [_pair(i) for i in range(6)]
    kept += [
        _pair(6, clean=kept[0].clean),  # the same clean prompt, another pair
        _pair(7, other=kept[1].clean),  # a scored clean prompt as counterfactual
        _pair(8, clean=kept[2].counterfactual),
    ]
    split, _, train = draw_split(kept, 3, 3, seed=0)
    assert split.train == (3, 4, 5) and split.shared == 3
    with pytest.raises(
        TooFewPairs,
        match=r"3 of the 9 kept pairs are left .* 3 scored, 3 more share a prompt "
        r"with one; expected 4",
    ):
        draw_split(kept, 3, 4, seed=0)


def test_an_overlapping_split_is_refused():
    test = [_pair(i) for i in range(3)]
    with pytest.raises(ValueError, match="training pair 1 shares the prompt 'c"):
        check_disjoint(test, [_pair(5), _pair(6, clean=test[2].clean)])
    with pytest.raises(ValueError, match="training pair 0 shares the prompt 'o"):
        check_disjoint(test, [_pair(7, other=test[0].clean)])
    check_disjoint(test, [_pair(5), _pair(6)])


def test_a_result_holds_its_split_and_refuses_a_broken_one_by_field():
    from captum_iglens.studies.circuits.study import CircuitsResult

    split, _, _ = draw_split([_pair(i) for i in range(30)], 10, 8, seed=3)
    result = CircuitsResult("t", "m", "logit_diff", {"scored": 10}, 1, [1.0], [])
    assert result.split is None and result.describe_split() == "10 pairs scored"
    data = dict(result.to_dict(), split=split.to_dict())
    loaded = CircuitsResult.from_dict(data)
    assert loaded.split == split.to_dict()
    assert "found its circuits on 8 training pairs drawn by seed 3" in (
        loaded.describe_split()
    )
    del data["split"]["train"]
    with pytest.raises(ValueError, match=r"split\.train"):
        CircuitsResult.from_dict(data)
