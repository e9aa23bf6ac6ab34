"""Every option in every dtype: the map with and without views, at every
granularity, for every target form, on a tiny model in float32, float64,
bfloat16 and float16. Each view column is checked against the column's own
level, so a granularity whose columns are not its path points (the heads) is
held to the same rule as the blocks."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.granularities import GRANULARITIES
from tests.helpers import left_padded
from tests.tiny_models import VOCAB, tiny_model

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TARGETS = {
    "greedy": {},
    "given": {"target": "given"},
    "foil": {"foil": 3},
    "token_set": {"target_tokens": {5, 9}},
}
TOP = 3


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    base = tiny_model("llama")
    return {dtype: tiny_model("llama").to(dtype) for dtype in DTYPES} | {"base": base}


def _kwargs(targets, ids):
    kwargs = dict(TARGETS[targets])
    if kwargs.get("target") == "given":
        kwargs["target"] = [(ids.shape[1] - 1, 7)] * ids.shape[0]
    return kwargs


@pytest.fixture(scope="module")
def moe_models():
    """The tiny Mixtral in every dtype, for granularity="expert". transformers'
    default experts kernel (grouped_mm) takes no float64, so the float64 model runs
    its eager experts, as a user must do to run it at all."""
    torch.manual_seed(0)
    moe = {dtype: tiny_model("mixtral").to(dtype) for dtype in DTYPES}
    moe[torch.float64].set_experts_implementation("eager")
    return moe


def test_float64_mixtral_needs_eager_experts():
    """The reason for the eager experts above: the model's own forward refuses."""
    model = tiny_model("mixtral").to(torch.float64)
    with pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16"):
        model(torch.randint(0, VOCAB, (1, 4)))


def _cases():
    for dtype in DTYPES:
        for granularity in GRANULARITIES:
            yield pytest.param(dtype, granularity, id=f"{granularity}-{str(dtype)[6:]}")


#: The views with the greedy target, and every other target with views.
VIEWS_AND_TARGETS = [(0, "greedy")] + [(TOP, t) for t in TARGETS]


@pytest.mark.parametrize("dtype, granularity", list(_cases()))
@pytest.mark.parametrize("top_k, targets", VIEWS_AND_TARGETS)
def test_map_every_dtype_granularity_view_and_target(
    models, moe_models, dtype, granularity, top_k, targets
):
    torch.manual_seed(1)
    ids, mask = left_padded([5, 3], VOCAB)
    lens = LayerIGLens.from_model(
        (moe_models if granularity == "expert" else models)[dtype]
    )
    result = lens.attribute_map(
        ids,
        additional_forward_args=(mask,),
        granularity=granularity,
        top_k=top_k,
        **_kwargs(targets, ids),
    )
    n = len(result.layer_names)
    assert result.attributions.shape[-1] == n
    assert result.attributions.dtype == torch.float32
    assert result.delta.abs().max() <= 1e-6  # telescoping in every dtype
    if not top_k:
        assert result.top_ids is None
        return
    b, p = result.targets.shape
    assert result.top_ids.shape == (b, p, n, TOP)
    for name in ("top_probs", "entropy", "kl"):
        assert getattr(result, name).dtype == torch.float32, name
    if targets in ("greedy", "given"):
        _views_agree_with_levels(result)
    if targets == "greedy":  # the model's own answer tops its last column
        assert (result.rank[..., -1][result.mask] == 1).all()


def _views_agree_with_levels(result):
    """A single-target column's level is its target's probability: when the
    view ranks the target within the top-k, that entry is the target with the
    same probability, and it is never above the column's most probable token."""
    real = result.mask[..., None].expand_as(result.rank)
    level = result.levels
    assert (level[real] <= result.top_probs[..., 0][real] + 1e-5).all()
    within = real & (result.rank <= TOP)
    slot = (result.rank.clamp(max=TOP) - 1)[..., None]
    ids_at = result.top_ids.gather(-1, slot)[..., 0]
    probs_at = result.top_probs.gather(-1, slot)[..., 0]
    targets = result.targets[..., None].expand_as(ids_at)
    assert torch.equal(ids_at[within], targets[within])
    assert torch.allclose(probs_at[within], level[within], atol=1e-5)


def test_head_columns_show_their_blocks_mid_and_output_views(models):
    """A head column reads ``h_mid`` of its block: its views are the
    sublayer map's attention column's; the mlp column the block output's."""
    ids, mask = left_padded([5, 3], VOCAB)
    lens = LayerIGLens.from_model(models["base"])
    heads = lens.attribute_map(
        ids, additional_forward_args=(mask,), granularity="head", top_k=TOP
    )
    subs = lens.attribute_map(
        ids, additional_forward_args=(mask,), granularity="sublayer", top_k=TOP
    )
    for j, name in enumerate(heads.layer_names):
        if name == "input":
            continue
        source = name.rsplit(".", 1)[0] if ".attn." in name else name
        i = subs.layer_names.index(source)
        for field in ("top_ids", "rank"):
            assert torch.equal(
                getattr(heads, field)[:, :, j], getattr(subs, field)[:, :, i]
            ), (name, field)
        for field in ("top_probs", "entropy", "kl"):
            assert torch.allclose(
                getattr(heads, field)[:, :, j],
                getattr(subs, field)[:, :, i],
                atol=1e-6,
            ), (name, field)
