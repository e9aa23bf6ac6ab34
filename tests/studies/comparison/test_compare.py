"""The comparison: IG-Lens beside LayerConductance, LayerIntegratedGradients, the
logit lens and DLA, on the same tokens and layers."""

import json

import captum
import matplotlib
import pytest
import torch
from captum.attr import LayerConductance, LayerIntegratedGradients

from captum_iglens import LayerIGLens, Settings
from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.studies.methods.runners import TargetProbability
from captum_iglens.hf import model_parts
from captum_iglens.studies.comparison import (
    COMPARED_METHODS,
    ComparisonResult,
    compare,
    format_joint_agreement,
    joint_agreement,
)
from tests.helpers import (
    block_states,
    assert_state_unchanged,
    hook_snapshot,
    left_padded,
    state_snapshot,
)
from tests.tiny_models import VOCAB, tiny_model

matplotlib.use("Agg")

FP32_TOL = 1e-6
POSITIONS = [-3, -2, -1]
N_STEPS = 64  # enough for Captum's convergence deltas to stay well under |Δp| here


@pytest.fixture(scope="module")
def calm_llama():
    # Weights a little smaller than the other tests' tiny models: Captum's integrals
    # then converge in 64 steps, so its per-block totals are clearly ≈ F(x) − F(x').
    return tiny_model("llama", initializer_range=0.1)


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(0)
    return left_padded([7, 5], VOCAB)


@pytest.fixture(scope="module")
def run(calm_llama, batch):
    ids, mask = batch
    hooks, state = hook_snapshot(calm_llama), state_snapshot(calm_llama)
    result = compare(calm_llama, ids, mask, positions=POSITIONS, n_steps=N_STEPS)
    return result, hooks, state


def _probability(model, ids, mask, positions, targets):
    """The model's probability of each target, ``(B, P)``, from one plain forward."""
    probs = block_states(model, ids, mask)[1][:, positions].float().softmax(-1)
    return probs.gather(-1, targets[..., None])[..., 0]


# ------------------------------------------------------------------- same work


def test_every_method_on_the_same_work(run):
    result = run[0]
    assert list(result.methods) == list(COMPARED_METHODS)
    b, p, k = 2, len(POSITIONS), 2
    assert result.positions.tolist() == [4, 5, 6]
    assert result.targets.shape == (b, p) and result.mask.all()
    assert result.layer_names == ["0", "1"]
    for name, entry in result.methods.items():
        assert entry.scores.shape == (b, p, k), name
        for tensor in (entry.layer_sum, entry.expected, entry.prob_change):
            assert tensor.shape == (b, p), name
        assert entry.residual.shape == (b, p), name


def test_hooks_and_state_unchanged(calm_llama, run):
    _, hooks, state = run
    assert hook_snapshot(calm_llama) == hooks
    assert_state_unchanged(calm_llama, state)


# ------------------------------------------------------------------- IG-Lens


def test_ig_lens_is_additive(calm_llama, batch, run):
    result = run[0]
    ids, mask = batch
    entry = result.methods["ig_lens"]
    assert entry.residual.max() <= FP32_TOL
    assert (entry.layer_sum - entry.expected).abs().max() <= FP32_TOL
    direct = LayerIGLens.from_model(calm_llama).attribute_map(
        ids, additional_forward_args=(mask,), positions=POSITIONS
    )
    assert torch.equal(direct.targets, result.targets)
    assert (direct.attributions - entry.scores).abs().max() <= FP32_TOL
    assert entry.forwards == 1 and entry.backwards == 0


def test_ig_lens_baseline_is_passed_through(calm_llama, batch):
    ids, mask = batch
    result = compare(
        calm_llama,
        ids,
        mask,
        positions=POSITIONS,
        baselines=0.0,
        methods=("ig_lens", "logit_lens_diff"),
    )
    ig, diff = result.methods["ig_lens"], result.methods["logit_lens_diff"]
    assert ig.residual.max() <= FP32_TOL
    assert result.metadata["ig_lens_baseline"] == "0.0"
    # The lens starts at h_0 whatever IG-Lens's baseline: only the first block differs.
    assert (ig.scores[..., 1:] - diff.scores[..., 1:]).abs().max() <= FP32_TOL
    assert (ig.scores[..., 0] - diff.scores[..., 0]).abs().max() > 1e-4


# ------------------------------------------------------------------- logit lens


def test_logit_lens_levels_and_differences(calm_llama, batch, run):
    result = run[0]
    ids, mask = batch
    levels, diff = result.methods["logit_lens"], result.methods["logit_lens_diff"]
    lens = LayerIGLens.from_model(calm_llama).attribute_map(
        ids, additional_forward_args=(mask,), positions=POSITIONS
    )
    assert (levels.scores - lens.levels).abs().max() <= FP32_TOL
    model_prob = _probability(calm_llama, ids, mask, POSITIONS, result.targets)
    assert (levels.scores[..., -1] - model_prob).abs().max() <= FP32_TOL
    # Block 0's level, by hand: the model's own norm and head on its output.
    h_1 = block_states(calm_llama, ids, mask)[0][1][:, POSITIONS]
    probs = calm_llama.lm_head(calm_llama.model.norm(h_1)).float().softmax(-1)
    by_hand = probs.gather(-1, result.targets[..., None])[..., 0]
    assert (levels.scores[..., 0] - by_hand).abs().max() <= FP32_TOL
    # Levels are not additive; their first differences telescope (IG-Lens's map).
    assert levels.residual.max() > 0.01
    assert diff.residual.max() <= FP32_TOL
    assert (diff.scores - result.methods["ig_lens"].scores).abs().max() <= FP32_TOL


# ------------------------------------------------------------------- DLA


def test_dla_matches_a_reference_and_sums_to_the_logit_difference(
    calm_llama, batch, run
):
    result = run[0]
    ids, mask = batch
    entry = result.methods["dla"]
    assert entry.unit == "logit"
    assert (entry.layer_sum - entry.expected).abs().max() <= 1e-5
    # Reference, by hand for Llama (RMSNorm, no biases): each block's update through
    # norm weight / rms(h_final) and the unembedding row of the target.
    states = block_states(calm_llama, ids, mask)[0]
    norm, head = calm_llama.model.norm, calm_llama.lm_head.weight
    h = torch.stack(states, 2)[:, POSITIONS]  # (B, P, 3, d): h_0, h_1, h_2
    rms = (h[:, :, -1].pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()
    rows = head[result.targets]  # (B, P, d)
    update = h.diff(dim=2) * norm.weight / rms[:, :, None]
    reference = (update * rows[:, :, None]).sum(-1)
    assert (entry.scores - reference).abs().max() <= 1e-5
    # Read as probability, the logit sums are far from Δp; the residual says so.
    lens_change = result.methods["logit_lens"].prob_change
    assert (entry.prob_change - lens_change).abs().max() <= FP32_TOL
    assert torch.allclose(entry.residual, (entry.layer_sum - entry.prob_change).abs())
    assert entry.residual.max() > 0.1


def test_dla_in_probability_matches_a_reference(calm_llama, batch, run):
    result = run[0]
    ids, mask = batch
    entry = result.methods["dla_prob"]
    assert entry.unit == "probability"
    # By hand for Llama: each update alone on h_0, through norm weight /
    # rms(h_final) and the whole unembedding, softmax, minus the same of h_0.
    states = block_states(calm_llama, ids, mask)[0]
    norm, head = calm_llama.model.norm, calm_llama.lm_head.weight
    h = torch.stack(states, 2)[:, POSITIONS]  # (B, P, 3, d): h_0, h_1, h_2
    rms = (h[:, :, -1].pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()
    alone = torch.cat([h[:, :, :1], h[:, :, :1] + h.diff(dim=2)], 2)
    probs = ((alone * norm.weight / rms[:, :, None]) @ head.T).softmax(-1)
    p_y = probs.gather(-1, result.targets[:, :, None, None].expand(-1, -1, 3, 1))
    reference = p_y[..., 1:, 0] - p_y[..., :1, 0]
    assert (entry.scores - reference).abs().max() <= 1e-6
    change = result.methods["ig_lens"].prob_change
    assert torch.equal(entry.prob_change, change)
    assert torch.allclose(entry.residual, (reference.sum(-1) - change).abs())


def test_the_joint_path_beside_dla(calm_llama, batch, run):
    result = run[0]
    ids, mask = batch
    joint = result.methods["ig_lens_joint"]
    assert joint.residual.max() <= FP32_TOL
    direct = LayerIGLens.from_model(calm_llama).attribute_map(
        ids,
        additional_forward_args=(mask,),
        positions=POSITIONS,
        path="joint",
        n_steps=N_STEPS,  # the joint map depends on its steps
    )
    assert (direct.attributions - joint.scores).abs().max() <= FP32_TOL
    found = joint_agreement(result)
    # Two columns: ρ is +1 when both rank the blocks alike, else −1.
    alike = (joint.scores.argmax(-1) == result.methods["dla"].scores.argmax(-1)).float()
    assert torch.equal(found["spearman"], 2 * alike - 1)
    assert torch.equal(found["joint_residual"], joint.residual)
    assert torch.equal(found["dla_prob_residual"], result.methods["dla_prob"].residual)
    table = format_joint_agreement(result, 1)
    assert len(table.splitlines()) == 2 + len(POSITIONS)
    assert f"{found['spearman'][1, 0].item():+.3f}" in table.splitlines()[2]
    alone = compare(calm_llama, ids, mask, positions=POSITIONS, methods=("dla",))
    with pytest.raises(ValueError, match="ig_lens_joint"):
        joint_agreement(alone)


@pytest.mark.parametrize(
    "arch",
    [
        "gpt2",
        "gemma2",
        "opt-project-out",
        "cohere",
        "olmo",
        "gptj",
        "opt-no-final-norm",
    ],
)
def test_dla_sums_to_the_logit_difference_across_architectures(arch):
    model = tiny_model(arch)
    ids, mask = left_padded([6, 4], VOCAB)
    result = compare(model, ids, mask, positions=[-2, -1], methods=("dla", "ig_lens"))
    entry = result.methods["dla"]
    scale = 1.0 + entry.expected.abs().max().item()
    assert (entry.layer_sum - entry.expected).abs().max() <= 1e-5 * scale
    assert result.methods["ig_lens"].residual.max() <= FP32_TOL
    assert ("softcapping" in entry.note) == (arch == "gemma2")


# ------------------------------------------------------------------- Captum


@pytest.mark.parametrize("name", ["layer_conductance", "layer_integrated_gradients"])
def test_captum_blocks_each_explain_the_whole_change(calm_llama, batch, run, name):
    result = run[0]
    ids, mask = batch
    entry = result.methods[name]
    k = entry.scores.shape[-1]
    pad = torch.full_like(ids, calm_llama.config.pad_token_id)
    change = _probability(calm_llama, ids, mask, POSITIONS, result.targets)
    change = change - _probability(calm_llama, pad, mask, POSITIONS, result.targets)
    assert (entry.expected - change).abs().max() <= FP32_TOL
    assert torch.equal(entry.prob_change, entry.expected)
    # Each block's total is the whole F(x) − F(x'), within Captum's own delta...
    assert entry.delta.shape == entry.scores.shape
    gap = (entry.scores - change[..., None]).abs()
    assert (gap <= entry.delta.abs() + 1e-5).all()
    assert (entry.delta.abs() <= 0.35 * change.abs()[..., None]).all()
    # ... so the sum over k blocks is about k times the change, not the change.
    real = change.abs() > 1e-3
    assert real.sum() >= 4
    assert (entry.residual[real] > 0.5 * (k - 1) * change.abs()[real]).all()
    assert entry.backwards == k
    assert entry.forward_sequences >= k * N_STEPS * ids.shape[0] * len(POSITIONS)


def test_captum_memory_is_bounded_by_row_groups(calm_llama, batch, monkeypatch):
    import captum_iglens.studies.methods.runners as runners

    ids, mask = batch
    kwargs = dict(
        positions=[-2, -1],
        n_steps=4,
        methods=("layer_conductance", "layer_integrated_gradients_multilayer"),
    )
    whole = compare(calm_llama, ids, mask, **kwargs)
    # A budget of two sequences: one row per Captum call, two sequences a pass.
    seq = runners.sequence_bytes(calm_llama, ids.shape[1])
    monkeypatch.setattr(runners, "CAPTUM_BUDGET", 2 * seq)
    calls = []
    attribute = LayerIntegratedGradients.attribute

    def spy(self, inputs, *args, internal_batch_size=None, **kwargs):
        calls.append((len(inputs), internal_batch_size))
        return attribute(
            self, inputs, *args, internal_batch_size=internal_batch_size, **kwargs
        )

    monkeypatch.setattr(LayerIntegratedGradients, "attribute", spy)
    small = compare(calm_llama, ids, mask, **kwargs)
    assert calls and set(calls) == {(1, 2)}
    for name in kwargs["methods"]:
        torch.testing.assert_close(
            small.methods[name].scores, whole.methods[name].scores, atol=1e-6, rtol=0
        )


def test_captum_keeps_no_graph_before_the_attributed_block(calm_llama, batch):
    # LayerConductance makes its interpolated embeddings require grad; with them
    # and the weights requiring grad, every block before the attributed one kept
    # its activations through all of Captum's internal batches (GBs on SmolLM2).
    ids, mask = batch
    blocks = model_parts(calm_llama).blocks
    assert all(p.requires_grad for p in calm_llama.parameters())
    graphs = []
    handle = blocks[0].register_forward_hook(
        lambda module, args, output: graphs.append(hidden_of(output).requires_grad)
    )
    try:
        compare(
            calm_llama,
            ids,
            mask,
            positions=[-1],
            n_steps=2,
            layers=[len(blocks) - 1],
            methods=("layer_conductance", "layer_integrated_gradients"),
        )
    finally:
        handle.remove()
    assert len(graphs) > 2 and not any(graphs)
    assert all(p.requires_grad for p in calm_llama.parameters())


def test_layer_conductance_scores_are_captums_own(calm_llama, batch):
    # The same call of Captum's LayerConductance with a plain F: no detaching,
    # the weights requiring grad; one call over all rows.
    ids, mask = batch
    result = compare(
        calm_llama,
        ids,
        mask,
        positions=[-2, -1],
        n_steps=4,
        layers=[0],
        methods=("layer_conductance",),
    )
    positions = torch.tensor([5, 6])

    def forward(embeds, attention_mask, position, target):
        logits = calm_llama(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits
        probs = logits[torch.arange(len(position)), position].float().softmax(-1)
        return probs.gather(-1, target[:, None])[:, 0]

    embed = calm_llama.get_input_embeddings()
    rows = ids.repeat_interleave(2, 0)
    lc = LayerConductance(forward, model_parts(calm_llama).blocks[0])
    expected = lc.attribute(
        embed(rows),
        embed(torch.full_like(rows, calm_llama.config.pad_token_id)),
        additional_forward_args=(
            mask.repeat_interleave(2, 0),
            positions.repeat(2),
            result.targets.flatten(),
        ),
        n_steps=4,
    )
    expected = expected.detach().flatten(1).sum(1).view(2, 2)
    scores = result.methods["layer_conductance"].scores[..., 0]
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=0)


def test_a_captum_run_beyond_the_machine_is_announced(calm_llama, batch):
    ids, mask = batch
    with pytest.warns(UserWarning, match="more than this machine's"):
        compare(
            calm_llama,
            ids,
            mask,
            positions=[-1],
            n_steps=2,
            methods=("layer_integrated_gradients",),
            internal_batch_size=10**12,
        )


def test_captum_methods_share_one_baseline_input(run):
    result = run[0]
    lc = result.methods["layer_conductance"]
    lig = result.methods["layer_integrated_gradients"]
    assert (lc.expected - lig.expected).abs().max() <= FP32_TOL
    assert result.metadata["baseline_token"] == 0


def test_lig_on_dependent_blocks_raises_or_gives_zeros(calm_llama, batch, run):
    # Pinned: if a Captum release changes this, the finding must be checked again.
    assert captum.__version__ == "0.9.0"
    result = run[0]
    ids, mask = batch
    blocks = model_parts(calm_llama).blocks
    forward = TargetProbability(calm_llama, embeddings=False)
    rows = ids.repeat_interleave(3, 0)
    extra = (
        mask.repeat_interleave(3, 0),
        torch.tensor([4, 5, 6]).repeat(2),
        result.targets.flatten(),
    )
    with pytest.warns(UserWarning, match="Multiple layers"):
        lig = LayerIntegratedGradients(forward, blocks)
    with pytest.raises(RuntimeError, match="not have been used in the graph"):
        lig.attribute(rows, torch.zeros_like(rows), None, extra, n_steps=4)
    entry = result.methods["layer_integrated_gradients_multilayer"]
    assert "RuntimeError" in entry.note and "all-zero blocks: ['0']" in entry.note
    assert torch.equal(entry.scores[..., 0], torch.zeros_like(entry.scores[..., 0]))
    last = result.methods["layer_integrated_gradients"].scores[..., -1]
    assert (entry.scores[..., -1] - last).abs().max() <= FP32_TOL


# ------------------------------------------------------------------- output


def test_costs_are_counted(run):
    result = run[0]
    for name in ("ig_lens", "logit_lens", "logit_lens_diff", "dla"):
        entry = result.methods[name]
        passes = (entry.forwards, entry.forward_sequences, entry.backwards)
        assert passes == (1, 2, 0), name
        assert entry.readout_rows > 0
    for entry in result.methods.values():
        assert entry.seconds > 0 and entry.peak_bytes >= 0


def test_table_json_and_plot(run, tmp_path):
    import matplotlib.pyplot as plt

    result = run[0]
    table = result.format_table()
    summary, header = table.splitlines()[:2]
    assert summary.startswith("2 sequence(s) x 3 position(s) x 2 blocks (0, 1)")
    assert header.split()[:5] == ["method", "resid", "max", "resid", "med"]
    for name in COMPARED_METHODS:
        assert name in table
    data = json.loads(json.dumps(result.to_dict()))
    residual = result.methods["ig_lens"].residual
    assert data["methods"]["ig_lens"]["residual"] == residual.tolist()
    result.save(tmp_path / "comparison.json")
    loaded = ComparisonResult.load(tmp_path / "comparison.json")
    assert loaded.format_table() == table
    assert torch.equal(loaded.methods["dla"].scores, result.methods["dla"].scores)
    fig, axes = result.plot(sequence=1)
    assert set(axes) == set(COMPARED_METHODS) | {"residuals"}
    assert axes["residuals"].get_yscale() == "log"
    fig.savefig(tmp_path / "comparison.png")
    plt.close(fig)


def test_without_attention_mask(calm_llama):
    ids = torch.randint(1, VOCAB, (1, 6))
    methods = ("ig_lens", "dla", "layer_conductance", "layer_integrated_gradients")
    result = compare(calm_llama, ids, positions=[-1], n_steps=8, methods=methods)
    assert result.methods["ig_lens"].residual.max() <= FP32_TOL
    mask = torch.ones_like(ids)
    change = _probability(calm_llama, ids, mask, [-1], result.targets)
    pad = torch.zeros_like(ids)  # the tiny model's pad token
    change = change - _probability(calm_llama, pad, mask, [-1], result.targets)
    for name in methods[2:]:
        assert (result.methods[name].expected - change).abs().max() <= FP32_TOL


def test_bad_arguments(calm_llama, batch):
    ids, mask = batch
    with pytest.raises(ValueError, match="layer_conductance"):
        compare(calm_llama, ids, mask, methods=("ig_lens", "tuned_lens"))
    with pytest.raises(ValueError, match="n_steps"):
        compare(calm_llama, ids, mask, n_steps=0)
    with pytest.raises(ValueError, match="baseline_token"):
        compare(calm_llama, ids, mask, baseline_token=VOCAB)


# ------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_real_model_ig_lens_is_exact(default_model):
    model, tokenizer = default_model
    ids = tokenizer("The capital of France is Paris.", return_tensors="pt").input_ids
    result = compare(
        model,
        ids,
        positions=[-3, -2, -1],
        layers=[9, 19],
        methods=("ig_lens", "logit_lens_diff", "dla"),
        tokenizer=tokenizer,
    )
    assert result.layer_names == ["9", "19", "29"]
    assert result.methods["ig_lens"].residual.max() <= FP32_TOL
    assert result.methods["logit_lens_diff"].residual.max() <= FP32_TOL
    dla = result.methods["dla"]
    scale = 1.0 + dla.expected.abs().max().item()
    assert (dla.layer_sum - dla.expected).abs().max() <= 1e-5 * scale
    assert dla.residual.max() > 0.1
    assert result.tokens[0][0] == " Paris"


# ------------------------------------------------------------------- settings


def test_settings_reach_every_method(calm_llama, batch, monkeypatch, tmp_path):
    ids, mask = batch
    steps = []
    original = LayerIntegratedGradients.attribute

    def spy(self, *args, **kwargs):
        steps.append(kwargs["n_steps"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LayerIntegratedGradients, "attribute", spy)
    settings = Settings(
        layers=(0,),
        method="riemann_trapezoid",
        n_steps=3,
        baselines="mean",
        granularity="sublayer",
    )
    result = compare(
        calm_llama,
        ids,
        mask,
        positions=[-1],
        methods=["ig_lens", "logit_lens", "dla", "layer_integrated_gradients"],
        settings=settings,
    )
    assert steps == [3, 3]  # one call per block, with the settings' steps
    sublayers = ["0.attn", "0.mlp", "1.attn", "1.mlp"]
    assert result.methods["ig_lens"].layer_names == sublayers
    assert result.methods["logit_lens"].layer_names == sublayers
    assert result.methods["dla"].layer_names == ["0", "1"]
    expected = LayerIGLens.from_model(calm_llama).attribute_map(
        ids,
        target=result.targets,
        additional_forward_args=(mask,),
        positions=[-1],
        **settings.map_kwargs(),
    )
    torch.testing.assert_close(
        result.methods["ig_lens"].scores,
        expected.attributions * expected.mask[..., None],
        atol=FP32_TOL,
        rtol=0,
    )
    path = tmp_path / "c.json"
    result.save(path)
    loaded = ComparisonResult.load(path)
    assert loaded.methods["ig_lens"].layer_names == sublayers
    assert loaded.format_table() == result.format_table()
    fig, axes = loaded.plot()
    assert set(axes) == set(result.methods) | {"residuals"}


def test_malformed_comparison_file_is_refused(run, tmp_path):
    result = run[0]
    data = result.to_dict()
    data["methods"]["dla"]["scores"][0][0].pop()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"kind": "ComparisonResult", **data}))
    with pytest.raises(ValueError, match="methods.dla.scores"):
        ComparisonResult.load(path)
