import math
from typing import Dict, List, Tuple

import pytest
import torch
from captum_iglens.hf import model_parts, supported_model_types
from captum_iglens.readout import LogitDivide, LogitScale, Readout, Softcap
from tests.tiny_models import ARCHITECTURES, final_norm_path, tiny_model, VOCAB
from torch import nn, Tensor
from transformers import AutoConfig, AutoModelForCausalLM

EXACT_ATOL = 1e-5  # readout logits vs the model's logits
PROB_ATOL = 1e-6  # probabilities
# A readout bug must move the logits far beyond EXACT_ATOL to count as caught.
CAUGHT = 100 * EXACT_ATOL

WITH_POST = {
    "gemma2": Softcap,
    "gemma3_text": Softcap,
    "cohere": LogitScale,
    "granite": LogitDivide,
    "granitemoe": LogitDivide,
    "granitemoeshared": LogitDivide,
    "granitemoehybrid": LogitDivide,
    "gemma4_text": Softcap,
    "falcon_h1": LogitScale,
}


@pytest.fixture(params=ARCHITECTURES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def model(name: str) -> nn.Module:
    return tiny_model(name)


def _input_ids(batch: int = 2, seq: int = 7) -> Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, (batch, seq), generator=gen)


def _last_block_output(model: nn.Module, ids: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Returns (last block's output, model logits), captured with our own hook."""
    captured: Dict[str, Tensor] = {}

    def hook(module: nn.Module, args: Tuple, output: object) -> None:
        captured["h"] = output[0] if isinstance(output, tuple) else output

    handle = model_parts(model).blocks[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        handle.remove()
    return captured["h"], logits


def _targets(n: int) -> Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(2))


def _hook_snapshot(model: nn.Module) -> Dict[str, List[Tuple[int, object]]]:
    kinds = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    )
    return {
        f"{name}.{kind}": list(getattr(module, kind).items())
        for name, module in model.named_modules()
        for kind in kinds
    }


# (a) exactness at the top


def test_readout_reproduces_model_logits(model: nn.Module) -> None:
    h_final, logits = _last_block_output(model, _input_ids())
    readout = model_parts(model).readout()
    with torch.no_grad():
        out = readout(h_final)
    assert out.shape == logits.shape
    assert out.dtype == logits.dtype
    torch.testing.assert_close(out, logits, atol=EXACT_ATOL, rtol=0)


def test_table_matches_model(name: str, model: nn.Module) -> None:
    parts = model_parts(model)
    norm, head, post = parts.norm, parts.head, parts.post
    assert head is model.get_output_embeddings()
    expected_norm = final_norm_path(name)
    if expected_norm is None:
        assert norm is None
    else:
        first = norm[0] if isinstance(norm, nn.Sequential) else norm
        assert first is model.get_submodule(expected_norm)
    if name in WITH_POST:
        assert type(post) is WITH_POST[name]
    else:
        assert post is None
    layers = model_parts(model).blocks
    assert isinstance(layers, list)
    assert len(layers) == model.config.num_hidden_layers


def test_opt_project_out_follows_final_norm() -> None:
    model = tiny_model("opt-project-out")
    norm = model_parts(model).norm
    decoder = model.model.decoder
    assert isinstance(norm, nn.Sequential)
    assert list(norm) == [decoder.final_layer_norm, decoder.project_out]


# (b) probabilities


def test_log_prob_matches_model_probabilities(model: nn.Module) -> None:
    h_final, logits = _last_block_output(model, _input_ids())
    h = h_final.flatten(0, 1)
    flat_logits = logits.flatten(0, 1)
    readout = model_parts(model).readout()
    for y in (flat_logits.argmax(-1), _targets(h.shape[0])):
        expected = flat_logits.float().softmax(-1).gather(-1, y[:, None])[:, 0]
        with torch.no_grad():
            log_p = readout.log_prob(h, y)
        assert log_p.dtype == torch.float32
        assert log_p.shape == y.shape
        torch.testing.assert_close(log_p.exp(), expected, atol=PROB_ATOL, rtol=0)


# (c) the tests above can fail


# OLMo's final LayerNorm has no weight or bias, so it is idempotent up to eps (a
# second application moves logits by ~1e-5 only); OPT without a final norm has
# nothing to apply twice.
NORM_TWICE_VISIBLE = [
    a for a in ARCHITECTURES if a not in ("olmo", "opt-no-final-norm")
]


@pytest.mark.parametrize("arch", NORM_TWICE_VISIBLE)
def test_applying_norm_twice_is_caught(arch: str) -> None:
    model = tiny_model(arch)
    parts = model_parts(model)
    norm, head, post = parts.norm, parts.head, parts.post
    h_final, logits = _last_block_output(model, _input_ids())
    # The pitfall: reading hidden_states[-1] (already normed) through the readout.
    # OPT's project_out changes the width, so prepend the final norm itself.
    final_norm = norm[0] if isinstance(norm, nn.Sequential) else norm
    twice = Readout(head, nn.Sequential(final_norm, norm), post)
    with torch.no_grad():
        assert (twice(h_final) - logits).abs().max() > CAUGHT


@pytest.mark.parametrize("name", sorted(WITH_POST))
def test_dropping_post_is_caught(name: str) -> None:
    model = tiny_model(name)
    parts = model_parts(model)
    norm, head, _ = parts.norm, parts.head, parts.post
    h_final, logits = _last_block_output(model, _input_ids())
    with torch.no_grad():
        assert (Readout(head, norm)(h_final) - logits).abs().max() > CAUGHT


def test_gemma3_text_without_softcapping_has_no_post() -> None:
    model = tiny_model("gemma3_text", final_logit_softcapping=None)
    assert model_parts(model).post is None
    h_final, logits = _last_block_output(model, _input_ids())
    with torch.no_grad():
        out = model_parts(model).readout()(h_final)
    torch.testing.assert_close(out, logits, atol=EXACT_ATOL, rtol=0)


# (d) chunking


@pytest.mark.parametrize("rows", [1, 2])
def test_chunked_log_prob_equals_unchunked(model: nn.Module, rows: int) -> None:
    h_final, _ = _last_block_output(model, _input_ids())
    h = h_final.flatten(0, 1)
    y = _targets(h.shape[0])
    full = model_parts(model).readout()
    # logits and log-softmax; a post transform's input beside its output
    per_logit = 8 if full.post is None else 12
    chunked = model_parts(model).readout(max_chunk_bytes=rows * per_logit * VOCAB)
    assert full.rows_per_chunk() >= h.shape[0]
    assert chunked.rows_per_chunk() == rows
    with torch.no_grad():
        torch.testing.assert_close(
            chunked.log_prob(h, y), full.log_prob(h, y), atol=1e-6, rtol=0
        )


def test_chunking_bounds_rows_per_head_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model("llama")
    h_final, _ = _last_block_output(model, _input_ids(batch=3, seq=5))
    h = h_final.flatten(0, 1)  # 15 rows
    budget = 4 * 8 * VOCAB + 3  # four rows of logits and log-softmax, plus slack
    readout = model_parts(model).readout(max_chunk_bytes=budget)
    head = readout.head
    rows_seen: List[int] = []
    original = head.forward

    def spy(x: Tensor) -> Tensor:
        rows_seen.append(x.shape[0])
        return original(x)

    monkeypatch.setattr(head, "forward", spy)
    with torch.no_grad():
        readout.log_prob(h, _targets(h.shape[0]))
    assert readout.rows_per_chunk() == 4
    assert rows_seen == [4, 4, 4, 3]
    assert max(rows_seen) * VOCAB * 8 <= budget


def test_rows_per_chunk_is_at_least_one() -> None:
    readout = Readout(nn.Linear(8, 1000), max_chunk_bytes=1)
    assert readout.rows_per_chunk() == 1
    assert Readout(nn.Linear(8, 1000), max_chunk_bytes=16000).rows_per_chunk() == 2


@pytest.mark.parametrize("post", [Softcap(30.0), LogitScale(2.0), LogitDivide(3.0)])
def test_rows_per_chunk_counts_a_post_transforms_array(post: nn.Module) -> None:
    """8 bytes a logit (12 in a backward), and 4 more with a post transform."""
    plain = Readout(nn.Linear(8, 1000), max_chunk_bytes=48000)
    with_post = Readout(nn.Linear(8, 1000), post=post, max_chunk_bytes=48000)
    assert (plain.rows_per_chunk(), plain.rows_per_chunk(backward=True)) == (6, 4)
    assert (with_post.rows_per_chunk(), with_post.rows_per_chunk(True)) == (4, 3)


def test_softcap_without_grad_is_bit_identical_and_leaves_its_input() -> None:
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(0)) * 40
    before = logits.clone()
    with torch.no_grad():
        fast = Softcap(30.0)(logits)
    assert torch.equal(logits, before)
    assert torch.equal(fast, torch.tanh(logits / 30.0) * 30.0)  # as the model
    wide = logits.clone().requires_grad_()
    recorded = Softcap(30.0)(wide)
    assert torch.equal(recorded.detach(), fast)
    recorded.sum().backward()
    assert wide.grad is not None
    torch.testing.assert_close(wide.grad, 1 - torch.tanh(logits / 30.0).square())


def test_log_prob_of_no_rows() -> None:
    readout = Readout(nn.Linear(8, 10))
    out = readout.log_prob(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)
    assert out.dtype == torch.float32


# (e) unknown architectures fail loudly


def test_unknown_model_type_is_probed_and_verified() -> None:
    # Not in the table: the probe's parts are used only because they reproduce
    # the logits, checked here with this test's own hook.
    config = AutoConfig.for_model(
        "gpt_neo",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global"], 2]],
        max_position_embeddings=64,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    assert "gpt_neo" not in supported_model_types()
    h_final, logits = _last_block_output(model, _input_ids())
    with torch.no_grad():
        out = model_parts(model).readout()(h_final)
    torch.testing.assert_close(out, logits, atol=EXACT_ATOL, rtol=0)


def test_unknown_model_type_with_known_layout_is_verified() -> None:
    model = tiny_model("llama")
    model.config.model_type = "made_up"
    h_final, logits = _last_block_output(model, _input_ids())
    with torch.no_grad():
        out = model_parts(model).readout()(h_final)
    torch.testing.assert_close(out, logits, atol=EXACT_ATOL, rtol=0)


def test_model_without_config_raises() -> None:
    with pytest.raises(ValueError, match=r"Linear"):
        model_parts(nn.Linear(4, 4))


def test_base_model_without_head_raises() -> None:
    base = tiny_model("llama").model  # LlamaModel: same model_type, no lm_head
    with pytest.raises(ValueError, match="LlamaModel.*'model.norm'"):
        model_parts(base)


# (f) the model is left alone


def test_model_hooks_modes_and_flags_unchanged(model: nn.Module) -> None:
    calls: List[int] = []
    user_handle = model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: calls.append(1)
    )
    try:
        model.train()
        model.get_output_embeddings().weight.requires_grad_(False)
        hooks = _hook_snapshot(model)
        modes = {n: m.training for n, m in model.named_modules()}
        flags = {n: p.requires_grad for n, p in model.named_parameters()}
        readout = model_parts(model).readout()
        h = torch.randn(3, model.config.hidden_size, requires_grad=True)
        readout.log_prob(h, _targets(3)).sum().backward()
        with torch.no_grad():
            readout(h)
        assert _hook_snapshot(model) == hooks
        assert {n: m.training for n, m in model.named_modules()} == modes
        assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
        assert calls  # the user's own hook still fires through the readout
    finally:
        user_handle.remove()


def test_readout_shares_the_model_parameters(model: nn.Module) -> None:
    readout = model_parts(model).readout()
    model_params = {id(p) for p in model.parameters()}
    readout_params = list(readout.parameters())
    assert readout_params
    assert all(id(p) in model_params for p in readout_params)


# (g) gradients


def test_log_prob_gradients_flow(model: nn.Module) -> None:
    h_final, _ = _last_block_output(model, _input_ids())
    y = _targets(h_final.shape[0] * h_final.shape[1])
    h = h_final.flatten(0, 1).detach().requires_grad_()
    readout = model_parts(model).readout(max_chunk_bytes=3 * 8 * VOCAB)
    readout.log_prob(h, y).sum().backward()
    assert h.grad is not None
    assert torch.isfinite(h.grad).all()
    assert (h.grad.abs().sum(-1) > 0).all()

    h_ref = h.detach().clone().requires_grad_()
    logits = readout(h_ref).float().log_softmax(-1)
    logits.gather(-1, y[:, None]).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad, atol=1e-6, rtol=1e-5)


# constructor and argument checks


def test_constructor_validates_arguments() -> None:
    with pytest.raises(TypeError, match="head"):
        Readout(torch.zeros(3, 3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="norm"):
        Readout(nn.Linear(2, 3), norm=lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        Readout(nn.Linear(2, 3), max_chunk_bytes=0)
    with pytest.raises(ValueError, match="out_features or a 2-D weight"):
        Readout(nn.Identity())


def test_log_prob_validates_arguments() -> None:
    readout = Readout(nn.Linear(4, 10))
    with pytest.raises(ValueError, match=r"\(N, d\)"):
        readout.log_prob(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="target"):
        readout.log_prob(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.long"):
        readout.log_prob(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int32))


def test_vocab_size_and_repr() -> None:
    readout = Readout(nn.Linear(4, 10), post=Softcap(30.0), max_chunk_bytes=80)
    assert readout.vocab_size == 10
    text = repr(readout)
    assert "vocab_size=10, max_chunk_bytes=80" in text
    assert "Softcap(cap=30.0)" in text
    assert repr(LogitScale(0.0625)) == "LogitScale(factor=0.0625)"
    assert repr(LogitDivide(4.0)) == "LogitDivide(divisor=4.0)"


def test_post_transforms_match_their_formulas() -> None:
    x = torch.linspace(-50, 50, 101)
    torch.testing.assert_close(Softcap(30.0)(x), 30.0 * torch.tanh(x / 30.0))
    assert Softcap(30.0)(x).abs().max() < 30.0
    torch.testing.assert_close(LogitScale(0.5)(x), x * 0.5)
    torch.testing.assert_close(LogitDivide(4.0)(x), x / 4.0)
    with pytest.raises(ValueError):
        Softcap(0.0)
    with pytest.raises(ValueError):
        LogitDivide(0)


def test_readout_is_pointwise_over_tokens(model: nn.Module) -> None:
    h_final, logits = _last_block_output(model, _input_ids())
    readout = model_parts(model).readout()
    with torch.no_grad():
        one = readout(h_final[1, 3])
    torch.testing.assert_close(one, logits[1, 3], atol=EXACT_ATOL, rtol=0)
    assert math.prod(one.shape) == readout.vocab_size


def test_log_prob_upcasts_low_precision_logits() -> None:
    torch.manual_seed(0)
    head = nn.Linear(16, 50).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.mul_(8)
    readout = Readout(head)
    h = torch.randn(6, 16, dtype=torch.bfloat16)
    y = _targets(6) % 50
    with torch.no_grad():
        logits = readout(h)
        log_p = readout.log_prob(h, y)
    assert logits.dtype == torch.bfloat16
    assert log_p.dtype == torch.float32
    expected = logits.float().log_softmax(-1).gather(-1, y[:, None])[:, 0]
    torch.testing.assert_close(log_p, expected, atol=1e-6, rtol=0)
