"""The validation study: ablation, agreement statistics, planted mechanisms, runner."""

import json
import math
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch

from captum_iglens import IGLensResult, LayerIGLens
from captum_iglens.studies.validation import stats
from captum_iglens.hf.architectures import decoder_layers
from captum_iglens.studies.validation.ablation import ablate, mean_updates
from captum_iglens.studies.validation import (
    SCORED_METHODS,
    Fact,
    StudyOptions,
    ValidationResult,
    load_facts,
    run_validation,
)
from tests.helpers import (
    assert_state_unchanged,
    hook_snapshot,
    left_padded,
    state_snapshot,
)
from tests.tiny_models import VOCAB, tiny_model

matplotlib.use("Agg")

FP32_TOL = 1e-6


# ------------------------------------------------------------------ statistics


def test_rankdata_averages_ties():
    assert stats.rankdata(np.array([10, 20, 20, 30])).tolist() == [1, 2.5, 2.5, 4]
    assert stats.rankdata(np.array([3.0, 1.0, 2.0])).tolist() == [3, 1, 2]
    assert stats.rankdata(np.array([5.0, 5.0, 5.0])).tolist() == [2, 2, 2]


def test_spearman_hand_computed():
    # No ties: 1 − 6·Σd² / (n(n² − 1)) = 1 − 6·2/60.
    assert stats.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 · 5).
    assert stats.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        3 / math.sqrt(10)
    )
    # Invariant under monotone maps.
    assert stats.spearman([0.1, 5, 2], [1, 100, 7]) == pytest.approx(1.0)


def test_spearman_undefined_for_constant_vectors():
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(stats.spearman([1, 2, 3], [0, 0, 0]))
    with pytest.raises(ValueError, match="one value per layer"):
        stats.spearman([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        stats.spearman([1, np.nan], [1, 2])


def test_top_k_hit_with_ties():
    drop = np.array([0.0, 0.9, 0.1, 0.2])
    assert stats.top_k_hit([0, 5, 1, 2], drop, 1) == 1.0
    assert stats.top_k_hit([5, 0, 1, 2], drop, 1) == 0.0
    assert stats.top_k_hit([5, 0, 1, 2], drop, 3) == 0.0
    assert stats.top_k_hit([5, 1, 0, 2], drop, 3) == 1.0
    # A constant score earns the chance rate: k / n.
    assert stats.top_k_hit([0, 0, 0, 0], drop, 1) == 0.25
    assert stats.top_k_hit([0, 0, 0, 0], drop, 3) == 0.75
    # Two layers tie for the top score, one of them the peak: half a hit.
    assert stats.top_k_hit([3, 3, 1, 0], drop, 1) == 0.5
    assert stats.top_k_hit([3, 3, 1, 0], drop, 3) == 1.0
    # Tied ablation peaks (layers 0 and 1): averaged over them.
    tied = np.array([5.0, 5.0, 0.0, 0.0])
    assert stats.top_k_hit([1, 0, 2, 3], tied, 1) == 0.0
    assert stats.top_k_hit([1, 0, 2, 3], tied, 3) == 0.5
    with pytest.raises(ValueError, match="k:"):
        stats.top_k_hit([1, 2], [1, 2], 0)


def test_peak_and_onset_distances():
    assert stats.peak_distance([0, 1, 5, 2], [4, 0, 0, 0]) == 2.0
    # Tied score maxima at 0 and 2, drop peak at 3: mean(|0 − 3|, |2 − 3|).
    assert stats.peak_distance([3, 1, 3, 0], [0, 0, 0, 1]) == 2.0
    # |score| cumulative: .1 .4 .8 1.0 → half the mass at layer 2.
    score = np.array([0.1, -0.3, 0.4, 0.2])
    assert stats.onset_index(score) == 2
    assert stats.onset_index(score, 0.1) == 0
    assert stats.onset_index(score, 1.0) == 3
    assert stats.onset_index(np.zeros(3)) == -1
    assert stats.onset_distance(score, [1, 0, 0, 0]) == 2.0
    assert math.isnan(stats.onset_distance(np.zeros(4), [1, 0, 0, 0]))


def test_onset_rule_matches_the_result_onset():
    torch.manual_seed(0)
    attributions = torch.randn(3, 4, 7)
    attributions[0, 1] = 0
    result = IGLensResult(
        attributions=attributions,
        lens=torch.full((3, 4, 7), 0.5),
        base_prob=torch.zeros(3, 4),
        model_prob=torch.zeros(3, 4),
        delta=attributions.sum(-1),
        targets=torch.zeros(3, 4, dtype=torch.long),
        positions=torch.arange(4),
        mask=torch.ones(3, 4, dtype=torch.bool),
        layer_names=[str(i) for i in range(7)],
        method="prediction_aware",
        n_steps=1,
    )
    for frac in (0.25, 0.5, 0.9):
        expected = result.onset(frac)
        ours = [
            [stats.onset_index(a.numpy(), frac) for a in row] for row in attributions
        ]
        assert ours == expected.tolist()


def test_nonmonotone_depth():
    assert stats.nonmonotone_depth([0.0, 0.2, 0.5, 0.9]) == 0.0
    assert stats.nonmonotone_depth([0.9, 0.5, 0.1]) == 0.0
    # Rises by 0.6 to 0.7, then falls by 0.4 to 0.3: depth min(0.6, 0.4).
    assert stats.nonmonotone_depth([0.1, 0.7, 0.3, 0.9]) == pytest.approx(0.4)
    assert stats.nonmonotone_depth([0.0, 0.3, 0.25, 0.8]) == pytest.approx(0.05)


def test_bootstrap_mean():
    constant = stats.bootstrap_mean(np.full(5, 0.3), 50)
    assert constant == dict(
        mean=pytest.approx(0.3),
        lo=pytest.approx(0.3),
        hi=pytest.approx(0.3),
        n=5,
        n_undefined=0,
    )
    values = np.array([np.nan, 0.0, 1.0, np.nan, 1.0, 0.0])
    out = stats.bootstrap_mean(values, 400, seed=3)
    assert (out["n"], out["n_undefined"], out["mean"]) == (4, 2, 0.5)
    assert 0.0 <= out["lo"] < 0.5 < out["hi"] <= 1.0
    assert stats.bootstrap_mean(values, 400, seed=3) == out
    empty = stats.bootstrap_mean(np.array([np.nan]), 10)
    assert empty["n"] == 0 and math.isnan(empty["mean"])
    with pytest.raises(ValueError, match="n_bootstrap"):
        stats.bootstrap_mean(values, 0)


def test_summarize_leaves_out_tokens_a_method_did_not_run_on():
    values = {"a": {"top1": np.array([1.0, 0.0, np.nan, 1.0])}}
    groups = {"all": np.ones(4, bool), "first": np.array([1, 1, 0, 0], bool)}
    computed = {"a": np.array([1, 1, 1, 0], bool)}
    out = stats.summarize(values, groups, computed, 20)
    assert (
        out["all"]["a"]["top1"]["n"] == 2
        and out["all"]["a"]["top1"]["n_undefined"] == 1
    )
    assert out["first"]["a"]["top1"]["mean"] == 0.5


# --------------------------------------------------------------------- ablation


def _forward_probs(model, ids, mask, positions, targets):
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids
        ).logits
    probs = logits[:, positions].float().softmax(-1)
    return probs.gather(-1, targets[..., None])[..., 0]


def _one_at_a_time(model, ids, mask, positions, targets, mode, means=None):
    """The reference: one forward per ablated block (and position), own hook."""
    blocks = decoder_layers(model)
    out = torch.zeros(*targets.shape, len(blocks))
    first = torch.arange(ids.shape[1])[None] == mask.argmax(-1)[:, None]
    for j, block in enumerate(blocks):
        where = (
            list(enumerate(positions)) if mode == "zero-at-position" else [(None, None)]
        )
        for index, position in where:

            def hook(module, args, kwargs, output, j=j, position=position):
                before = args[0] if args else kwargs["hidden_states"]
                if mode == "mean":
                    return before + torch.where(
                        first[..., None], means[j, 0], means[j, 1]
                    )
                if position is None:
                    return before
                edited = output.clone()
                edited[:, position] = before[:, position]
                return edited

            handle = block.register_forward_hook(hook, with_kwargs=True)
            try:
                probs = _forward_probs(model, ids, mask, positions, targets)
            finally:
                handle.remove()
            if index is None:
                out[..., j] = probs
            else:
                out[:, index, j] = probs[:, index]
    return out


@pytest.fixture(scope="module")
def llama4():
    return tiny_model("llama", num_hidden_layers=4)


@pytest.fixture(scope="module")
def padded():
    torch.manual_seed(0)
    return left_padded([7, 5], VOCAB)


@pytest.mark.parametrize("mode", ["skip", "mean", "zero-at-position"])
def test_batched_ablation_equals_one_at_a_time(llama4, padded, mode):
    ids, mask = padded
    positions = [4, 6]
    targets = torch.tensor([[3, 9], [17, 4]])
    means = None
    if mode == "mean":
        torch.manual_seed(1)
        means = mean_updates(
            llama4, [torch.randint(1, VOCAB, (n,)) for n in (4, 6, 3)], batch_size=2
        )
    reference = _one_at_a_time(llama4, ids, mask, positions, targets, mode, means)
    clean = _forward_probs(llama4, ids, mask, positions, targets)
    for max_batch in (6, 256):  # uneven chunks of 3 copies; everything at once
        result = ablate(
            llama4,
            ids,
            mask,
            positions=positions,
            targets=targets,
            mode=mode,
            means=means,
            max_batch=max_batch,
        )
        assert result.ablated.shape == (2, 2, 4)
        assert (result.ablated - reference).abs().max() <= FP32_TOL
        assert (result.clean - clean).abs().max() <= FP32_TOL
        assert torch.equal(result.drop, result.clean[..., None] - result.ablated)
    assert (
        reference - clean[..., None]
    ).abs().max() > 1e-3  # the ablations do something


def test_mean_updates_by_hand(llama4):
    torch.manual_seed(2)
    sequences = [torch.randint(1, VOCAB, (n,)) for n in (3, 5)]
    updates = {j: [] for j in range(4)}
    handles = [
        block.register_forward_hook(
            lambda m, a, k, o, j=j: updates[j].append((o - a[0])[0]), with_kwargs=True
        )
        for j, block in enumerate(decoder_layers(llama4))
    ]
    try:
        for seq in sequences:
            _forward_probs(
                llama4,
                seq[None],
                torch.ones(1, len(seq), dtype=torch.long),
                [0],
                seq[None, :1],
            )
    finally:
        for handle in handles:
            handle.remove()
    means = mean_updates(llama4, sequences, batch_size=2)
    assert means.shape == (4, 2, 32)
    for j in range(4):
        first = torch.stack([u[0] for u in updates[j]]).mean(0)
        others = torch.cat([u[1:] for u in updates[j]]).mean(0)
        assert (means[j, 0] - first).abs().max() <= 1e-5
        assert (means[j, 1] - others).abs().max() <= 1e-5


def test_ablation_owns_and_removes_its_hooks(llama4, padded):
    ids, mask = padded
    before, state = hook_snapshot(llama4), state_snapshot(llama4)
    ablate(
        llama4, ids, mask, positions=[-1], targets=torch.tensor([[1], [2]]), layers=[1]
    )
    mean_updates(llama4, [ids[0]])
    assert hook_snapshot(llama4) == before
    # A failure inside the forward still removes them.
    boom = decoder_layers(llama4)[3].register_forward_hook(lambda *a: 1 / 0)
    try:
        with pytest.raises(ZeroDivisionError):
            ablate(llama4, ids, mask, positions=[-1], targets=torch.tensor([[1], [2]]))
    finally:
        boom.remove()
    assert hook_snapshot(llama4) == before
    assert_state_unchanged(llama4, state)


def test_ablation_errors(llama4, padded):
    ids, mask = padded
    targets = torch.tensor([[1], [2]])
    with pytest.raises(ValueError, match="mode"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, mode="zero")
    with pytest.raises(ValueError, match="means"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, mode="mean")
    with pytest.raises(ValueError, match="layers"):
        ablate(llama4, ids, mask, positions=[-1], targets=targets, layers=[9])


# ------------------------------------------------------------ planted mechanisms

TARGET = 7


def _quiet(model):
    """Every block near identity: attention and MLP outputs scaled by 1e-3."""
    with torch.no_grad():
        for block in decoder_layers(model):
            block.self_attn.o_proj.weight.mul_(1e-3)
            block.mlp.down_proj.weight.mul_(1e-3)


def _readout_direction(model):
    """A unit vector of the residual stream that raises the target's logit."""
    with torch.no_grad():
        head = model.lm_head.weight
        u = model.model.norm.weight * (head[TARGET] - head.mean(0))
    return u / u.norm()


def _mlp_activation(model, block, ids, position):
    captured = {}
    handle = block.mlp.down_proj.register_forward_pre_hook(
        lambda m, a: captured.setdefault("a", a[0][0].detach().clone())
    )
    try:
        _forward_probs(model, ids, torch.ones_like(ids), [0], ids[:, :1])
    finally:
        handle.remove()
    return captured["a"]


def _write(block, direction, reading, gain, scale):
    """Set the block's MLP to write ``gain · direction · (reading · a) / scale``."""
    with torch.no_grad():
        block.mlp.down_proj.weight.copy_(gain * torch.outer(direction, reading) / scale)


def _attribute(model, ids, position):
    """IG-Lens credits, skip-ablation drops and the model's probability of TARGET."""
    targets = torch.tensor([[TARGET]])
    lens = LayerIGLens.from_model(model).attribute_map(
        ids, target=targets, positions=[position]
    )
    drops = ablate(model, ids, positions=[position], targets=targets).drop[0, 0]
    return lens.attributions[0, 0], drops, lens.model_prob[0, 0].item()


def test_planted_block_is_found_by_ablation_and_ig_lens():
    model = tiny_model("llama", num_hidden_layers=4)
    _quiet(model)
    ids, planted = torch.tensor([[5, 9, 17, 3]]), 2
    block = decoder_layers(model)[planted]
    a = _mlp_activation(model, block, ids, 3)[3]
    _write(block, _readout_direction(model), a, 8.0, a @ a)
    credits, drops, prob = _attribute(model, ids, 3)
    assert prob > 0.5
    assert int(credits.argmax()) == planted and int(drops.argmax()) == planted
    assert credits[planted] > 10 * credits.abs()[[0, 1, 3]].max()
    found = stats.agreement(credits.numpy(), drops.numpy())
    assert found["top1"] == 1.0 and found["peak_distance"] == 0.0
    assert found["onset_distance"] == 0.0
    targets = torch.tensor([[TARGET]])
    for mode in ("zero-at-position", "mean"):
        means = mean_updates(model, [ids[0], ids[0, :2]]) if mode == "mean" else None
        other = ablate(
            model, ids, positions=[3], targets=targets, mode=mode, means=means
        )
        assert int(other.drop[0, 0].argmax()) == planted, mode


def test_block_read_only_through_later_attention_makes_them_disagree():
    # Block 1 writes a direction w at position 0 only; blocks 2 and 3 each read it
    # there through uniform attention and write half of the target's direction at
    # position 1. Removing block 1 removes both halves (the largest drop), but the
    # readout at position 1 never sees block 1's update: IG-Lens credits 2 and 3.
    model = tiny_model("llama", num_hidden_layers=4)
    _quiet(model)
    ids, writer = torch.tensor([[5, 9]]), 1
    blocks = decoder_layers(model)
    u = _readout_direction(model)
    embed = model.model.embed_tokens.weight[ids[0]].detach()
    basis, _ = torch.linalg.qr(torch.stack([u, embed[0], embed[1], torch.randn(32)], 1))
    w = basis[:, 3]  # orthogonal to u and to both embeddings
    a = _mlp_activation(model, blocks[writer], ids, 0)
    v = a[0] - (a[0] @ a[1]) / (a[1] @ a[1]) * a[1]  # reads position 0, not position 1
    _write(blocks[writer], w, v, 10.0, v @ a[0])
    with torch.no_grad():
        for reader in blocks[2:]:
            attention = reader.self_attn
            attention.q_proj.weight.zero_()  # uniform attention over the prefix
            attention.v_proj.weight.zero_()
            attention.v_proj.weight[0] = w
            attention.o_proj.weight.zero_()
            attention.o_proj.weight[:, 0] = 1.4 * u
    credits, drops, prob = _attribute(model, ids, 1)
    assert prob > 0.5
    assert int(drops.argmax()) == writer
    assert int(credits.argmax()) in (2, 3)
    assert credits[writer].abs() < 1e-3 < drops[writer]
    found = stats.agreement(credits.numpy(), drops.numpy())
    assert found["top1"] == 0.0 and found["peak_distance"] >= 1.0


# ---------------------------------------------------------------- prompts, runner


def test_shipped_prompt_set():
    facts = load_facts()
    assert len(facts) >= 150
    assert len({f.id for f in facts}) == len(facts)
    assert len({f.relation for f in facts}) >= 6
    for fact in facts:
        assert fact.prompt == fact.prompt.strip() and fact.answer
        assert not fact.prompt.endswith(" " + fact.answer)


def test_answer_check():
    fact = Fact("x", "capital", "The capital of Argentina is", "Buenos Aires", ("BA",))
    assert fact.is_answered_by(" Buenos Aires.\n\nIt is")
    assert fact.is_answered_by(' "buenos aires", a city')
    assert fact.is_answered_by(" BA")
    assert not fact.is_answered_by(" Buenos")
    assert not fact.is_answered_by(" Santiago")
    assert Fact("y", "", "text").is_answered_by("anything") is None


def test_load_facts_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "A"}\n\n{"answer": "b"}\n')
    with pytest.raises(ValueError, match=":3: expected an object"):
        load_facts(path)
    path.write_text('{"prompt": "A", "answer": "b", "aliases": ["c"]}\n')
    assert load_facts(path) == [Fact("1", "", "A", "b", ("c",))]


class CharTokenizer:
    """A tokenizer of characters, enough for the runner."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = 2

    def __call__(self, text, return_tensors=None):
        return SimpleNamespace(
            input_ids=torch.tensor([[3 + ord(c) % 120 for c in text]])
        )

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + int(i) % 26) if int(i) > 2 else "" for i in ids)

    def get_vocab(self):
        return {}


def test_runner_end_to_end(llama4, tmp_path):
    prompts = [Fact("a", "r", "abc", "x"), Fact("b", "r", "hello", "y"), "a prompt"]
    for mode in ("skip", "mean"):
        result = run_validation(
            llama4,
            CharTokenizer(),
            prompts,
            mode=mode,
            progress=False,
            study=StudyOptions(
                n_bootstrap=30, batch_size=2, conductance_prompts=1, conductance_steps=2
            ),
        )
        assert result.methods == list(SCORED_METHODS)
        assert result.drops.shape == (3, 4) and result.trajectory.shape == (3, 5)
        assert result.correct[2] is None and isinstance(result.correct[0], bool)
        assert result.groups["conductance_subset"].sum() == 1
        assert result.summary["all"]["layer_conductance"]["top1"]["n"] == 1
        assert result.summary["all"]["ig_lens"]["top1"]["n"] == 3
        assert result.settings["max_gap_lens_vs_ablation_clean_prob"] <= FP32_TOL
        assert np.array_equal(
            result.scores["ig_lens_abs"], np.abs(result.scores["ig_lens"])
        )
        # The trajectory ends at the model's probability; the credits are its steps.
        assert np.abs(result.trajectory[:, -1] - result.model_prob).max() <= FP32_TOL
        assert (
            np.abs(np.diff(result.trajectory) - result.scores["ig_lens"]).max() <= 1e-5
        )
    table = result.format_table()
    for method in SCORED_METHODS:
        assert method in table
    assert "[conductance_subset]" in table
    path = tmp_path / "v.json"
    result.save(path)
    data = json.loads(path.read_text())
    json.dumps(data, allow_nan=False)
    assert data["mode"] == "mean" and len(data["tokens"]) == 3
    loaded = ValidationResult.load(path)
    assert loaded.format_table() == table
    for name, scores in result.scores.items():
        np.testing.assert_allclose(loaded.scores[name], scores, atol=1e-6)
    np.testing.assert_allclose(loaded.drops, result.drops, atol=1e-6)
    with pytest.raises(ValueError, match="holds a ValidationResult; expected a IGLensResult"):
        IGLensResult.load(path)
    fig, axes = result.plot()
    assert {"spearman", "top1", "example 0"} <= set(axes)
    fig.savefig(tmp_path / "v.png")
    with pytest.raises(ValueError, match="methods"):
        run_validation(llama4, CharTokenizer(), prompts, methods=["nope"])


@pytest.mark.real_model
def test_real_model_two_prompts(default_model):
    model, tokenizer = default_model
    result = run_validation(
        model,
        tokenizer,
        load_facts()[:2],
        methods=["ig_lens", "random"],
        study=StudyOptions(n_bootstrap=20),
        progress=False,
    )
    assert result.correct == [True, True]
    assert result.drops.shape == (2, 30)
    assert result.settings["max_gap_lens_vs_ablation_clean_prob"] <= 1e-5
