"""The closed-form lens fit: recovery of a planted map, streaming, the held-out
report, the checkpoint folder, and the tiny-model fit end to end."""

import json

import pytest
import torch

from captum_iglens.hf import model_parts
from captum_iglens.hf.checksum import weights_checksum
from captum_iglens.lens_fit import (
    cached_lens,
    lens_cache_folder,
    FitOptions,
    GramStats,
    fit_lens,
    lens_quality,
    save_fit,
    solve_ridge,
)
from captum_iglens.readout.translators import Translators
from tests.helpers import (
    assert_state_unchanged,
    fixed_weights,
    hook_snapshot,
    state_snapshot,
)
from tests.tiny_models import tiny_model, tiny_tokenizer


def _planted(n: int, d: int, layers: int, seed: int = 0):
    """States h_0 … h_{L−1} and h_L = h_i M_i + b_i exactly, per state."""
    g = torch.Generator().manual_seed(seed)
    maps = torch.randn(layers, d, d, generator=g, dtype=torch.float64) / d**0.5
    bias = torch.randn(layers, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, d, generator=g, dtype=torch.float64) * 3 + 1
    # Each x_i is chosen so that x_i M_i + b_i = y exactly.
    x = torch.stack(
        [torch.linalg.solve(maps[i].T, (y - bias[i]).T).T for i in range(layers)]
    )
    return torch.cat([x, y[None]]).float(), maps, bias


def test_closed_form_recovers_a_planted_map():
    states, maps, bias = _planted(n=600, d=12, layers=3)
    stats = GramStats(3, 12)
    for chunk in states.double().split(97, dim=1):  # streamed, uneven chunks
        stats.add(chunk)
    weight, b = solve_ridge(stats, ridge=1e-9)
    eye = torch.eye(12, dtype=torch.float64)
    recovered = weight.double().transpose(1, 2) + eye  # M_i = I + W_iᵀ
    assert stats.rows == 600
    assert torch.allclose(recovered, maps, atol=1e-3)
    assert torch.allclose(b.double(), bias, atol=1e-3)
    mapped = Translators(weight, b)(states[1], torch.ones(600, dtype=torch.long))
    assert torch.allclose(mapped, states[-1], atol=1e-2)


def test_streaming_equals_one_batch_and_ridge_shrinks_towards_identity():
    states, _, _ = _planted(n=200, d=8, layers=2, seed=1)
    whole, parts = GramStats(2, 8), GramStats(2, 8)
    whole.add(states)
    for chunk in states.split(7, dim=1):
        parts.add(chunk)
    assert torch.allclose(whole.xx, parts.xx) and torch.allclose(whole.xy, parts.xy)
    small = solve_ridge(whole, 1e-6)[0].norm()
    large = solve_ridge(whole, 1e6)[0].norm()
    assert large < 1e-3 * small  # a huge ridge keeps the identity


@pytest.mark.parametrize("ridge", [0, -1.0, float("nan")])
def test_bad_ridge_is_refused(ridge):
    stats = GramStats(1, 4)
    stats.add(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="ridge"):
        solve_ridge(stats, ridge)


def test_gram_refuses_states_of_another_shape():
    with pytest.raises(ValueError, match=r"states: expected shape \(3, N, 4\)"):
        GramStats(2, 4).add(torch.randn(2, 5, 4))


def test_quality_of_the_identity_is_the_logit_lens_and_zero_at_the_top():
    model = tiny_model("llama")
    readout = model_parts(model).readout()
    states = torch.randn(3, 10, 32)
    logit = lens_quality(readout, states)
    zeros = lens_quality(readout, states, Translators.identity(2, 32))
    assert torch.equal(logit.kl, zeros.kl) and torch.equal(logit.top1, zeros.top1)
    assert logit.kl[-1].abs() < 1e-6 and logit.top1[-1] == 1
    # An independent KL of state 0, from plain softmaxes.
    p = readout(states[-1]).log_softmax(-1)
    q = readout(states[0]).log_softmax(-1)
    expected = (p.exp() * (p - q)).sum(-1).mean().detach()
    assert abs(float(logit.kl[0]) - float(expected)) < 1e-5


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
def test_tiny_fit_end_to_end_writes_a_loadable_checkpoint(kind, tmp_path):
    model, tokenizer = tiny_model(kind), tiny_tokenizer()
    parts = model_parts(model)
    hooks, state = hook_snapshot(model), state_snapshot(model)
    options = FitOptions(
        tokens=300,
        eval_tokens=40,
        length=16,
        batch=8,
        curve=(100,),
        kl_steps=2,
        kl_tokens=50,
        kl_batch=8,
    )
    first = fit_lens(parts, tokenizer, options)
    again = fit_lens(parts, tokenizer, options)
    assert hook_snapshot(model) == hooks
    assert_state_unchanged(model, state)
    assert torch.equal(first.weight, again.weight)  # seeded: reproducible
    report = first.report
    assert report.settings["fit_tokens"] == 300
    assert report.settings["eval_tokens"] == 40
    assert len(report.kl["fitted"]) == 3 and report.kl["logit"][-1] < 1e-6
    assert set(report.kl) == {"logit", "closed_form", "fitted"}
    assert report.curve[0]["tokens"] == 100
    save_fit(tmp_path / "lens", first, curve_folders=True)
    params = torch.load(tmp_path / "lens" / "params.pt", weights_only=True)
    assert sorted(params) == sorted(
        f"{i}.{k}" for i in range(2) for k in ("weight", "bias")
    )
    assert params["1.weight"].shape == (32, 32) and params["1.bias"].shape == (32,)
    assert torch.equal(params["0.weight"], first.weight[0])
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert config["d_model"] == 32 and config["num_hidden_layers"] == 2
    assert config["bias"] is True and config["lens_type"] == "linear_tuned_lens"
    curve = json.loads((tmp_path / "lens-tokens100" / "config.json").read_text())
    assert curve["lens_type"] == "linear_shortcut"
    loaded = Translators.load(tmp_path / "lens")
    assert torch.equal(loaded.weight, first.weight) and torch.equal(
        loaded.bias, first.bias
    )
    assert config["model_checksum"] == weights_checksum(model)
    assert (tmp_path / "lens-tokens100" / "params.pt").is_file()
    assert (tmp_path / "lens" / "fit_report.png").stat().st_size > 1000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_fit_on_a_corpus_file_leaves_the_first_position_out(tmp_path):
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    texts = [
        " ".join(f"t{5 + (i * 7 + j) % 100}" for j in range(20)) for i in range(30)
    ]
    fitted = fit_lens(
        model_parts(model),
        tokenizer,
        FitOptions(tokens=200, eval_tokens=30, length=10, batch=4, corpus=texts),
    )
    # BOS + 20 words = 21 ids per text -> windows of 10, 10, 1: 9 + 9 rows each.
    assert fitted.report.settings["fit_tokens"] == 200
    assert fitted.report.settings["eval_tokens"] == 30


def test_checksum_follows_the_weights():
    model = tiny_model("llama")
    before = weights_checksum(model)
    assert before == weights_checksum(tiny_model("llama"))
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1
    assert weights_checksum(model) != before


def test_a_lens_cached_before_is_found_by_the_same_checksum(tmp_path):
    # The folder that version 0.1.0 cached the fixed-weight tiny Llama's lens in
    # (the first 16 hex digits of the checksum of its weights then): found, not
    # fitted again.
    model = fixed_weights(tiny_model("llama"))
    cached = tmp_path / "lenses" / "17df94e7d5fa69e6"
    cached.mkdir(parents=True)
    (cached / "params.pt").write_bytes(b"")
    assert lens_cache_folder(weights_checksum(model), tmp_path) == cached
    assert cached_lens(model_parts(model), tiny_tokenizer(), cache_dir=tmp_path) == (
        cached
    )
