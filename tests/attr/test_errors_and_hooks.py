"""Bad input gets a clear error; after any call the model is as it was."""

import pytest
import torch

from captum_iglens import LayerIGLens
from captum_iglens.hf import model_parts
from tests.helpers import (
    assert_state_unchanged,
    hook_snapshot,
    left_padded,
    state_snapshot,
)
from tests.tiny_models import VOCAB, tiny_model


def _ids(b=2, t=5):
    return torch.randint(1, VOCAB, (b, t))


BAD_CALLS = [
    ("n_steps", dict(n_steps=0), ValueError),
    ("n_steps", dict(n_steps=1, method="riemann_left"), ValueError),
    ("n_steps", dict(n_steps=10**11), ValueError),  # issue 48: a 13 TB grid
    ("n_steps", dict(n_steps=10**20), ValueError),  # issue 48: OverflowError
    ("n_steps", dict(n_steps=10**11, path="joint"), ValueError),
    ("method", dict(method="simpson"), ValueError),
    ("target", dict(target=VOCAB), ValueError),
    ("target", dict(target=-1), ValueError),
    ("target", dict(target=torch.zeros(2, 3, dtype=torch.long)), ValueError),
    ("target", dict(target=(9999,) * 20), TypeError),
    ("target", dict(target=torch.tensor([0.5, 1.5])), TypeError),
    ("positions", dict(positions=[5]), ValueError),
    ("positions", dict(positions=[-6]), ValueError),
    ("positions", dict(positions=[]), ValueError),
    ("positions", dict(positions="last"), TypeError),  # issue 48: new(): invalid ...
    ("positions", dict(positions=[0, "a"]), TypeError),
    ("positions", dict(positions=-1.0), TypeError),
    ("baselines", dict(baselines=torch.zeros(3, 5, 32)), ValueError),
    ("baselines", dict(baselines="median"), TypeError),
    ("baselines", dict(baselines=float("nan")), ValueError),
    ("baselines", dict(baselines=float("inf")), ValueError),
    ("baselines", dict(baselines=torch.full((1, 1, 32), float("-inf"))), ValueError),
    ("baselines", dict(baselines=1e30), ValueError),  # issue 48: after the work
    ("baselines", dict(baselines=torch.full((1, 1, 32), -1e20)), ValueError),
    ("internal_batch_size", dict(internal_batch_size=0), ValueError),
    ("attribute_to_layer_input", dict(attribute_to_layer_input=True), ValueError),
]


@pytest.mark.parametrize("path", ["telescoping", "joint"])
@pytest.mark.parametrize("call", ["attribute", "attribute_map"])
def test_steps_beyond_the_machine_are_refused_before_the_forward(
    lens, llama, call, path
):
    """Issue 48: ``n_steps`` whose one segment cannot be held (a 256 GB grid,
    or an ``OverflowError``) was found only when the grid was allocated, after
    the forward."""
    calls = []
    hook = llama.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        for n_steps in (10**11, 10**20):  # 13 TB at d = 32
            with pytest.raises(ValueError, match=r"n_steps: .* GiB of memory"):
                getattr(lens, call)(_ids(), n_steps=n_steps, path=path)
    finally:
        hook.remove()
    assert not calls  # refused before the model ran


@pytest.mark.parametrize(
    "tokens", [{-1}, [-1, 4], torch.tensor([-1]), {VOCAB}], ids=str
)
def test_token_sets_out_of_range_say_so(lens, tokens):
    """``-1`` pads only the ``(B, P, S)`` tensor form: in a set it is an id out
    of range, not a missing one."""
    with pytest.raises(ValueError, match=r"target_tokens: token ids must lie in"):
        lens.attribute_map(_ids(), target_tokens=tokens)


@pytest.mark.parametrize("name, kwargs, error", BAD_CALLS)
def test_bad_arguments_name_the_argument(lens, llama, name, kwargs, error):
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    with pytest.raises(error, match=name):
        lens.attribute(_ids(), **kwargs)
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)


@pytest.mark.parametrize(
    "inputs",
    [
        torch.zeros(0, 5, dtype=torch.long),
        torch.zeros(2, 0, dtype=torch.long),
        torch.zeros(3, dtype=torch.long),
    ],
)
def test_empty_or_flat_inputs(lens, inputs):
    with pytest.raises(ValueError, match="inputs"):
        lens.attribute_map(inputs)


@pytest.mark.parametrize(
    "inputs, error, message",
    [
        (torch.full((2, 5), VOCAB), ValueError, rf"\[0, {VOCAB}\).*max {VOCAB}"),
        (torch.full((2, 5), -1), ValueError, "min -1"),
        (torch.ones(1, 2, 5, dtype=torch.long), ValueError, r"shape \(B, T\)"),
        (torch.ones(2, 5), TypeError, "integer dtype"),
        (torch.ones(2, 5, dtype=torch.bool), TypeError, "torch.bool"),
    ],
)
def test_token_ids_are_checked_before_the_forward(llama, inputs, error, message):
    lens = LayerIGLens.from_model(llama)
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    for call in (lens.attribute, lens.attribute_map):
        with pytest.raises(error, match=f"inputs: .*{message}"):
            call(inputs)
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)


def test_a_mask_without_tokens_is_refused(lens):
    mask = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="attention mask marks no token"):
        lens.attribute_map(_ids(), additional_forward_args=(mask,))


@pytest.mark.parametrize("path", ["telescoping", "joint"])
def test_a_delta_of_a_list_of_the_wrong_length_is_refused(lens, llama, path):
    # Issue 48: 1 or 3 of 2 blocks (4 sub-layers) gave a delta such as -0.25.
    ids = _ids()
    attrs = lens.attribute(ids, target=5, positions=-1, path=path)
    assert len(attrs) == 2
    delta = lens.compute_convergence_delta(
        attrs, None, ids, target=5, positions=-1, path=path
    )
    assert delta.abs().max() < 1e-5
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    for wrong in (attrs[:1], [*attrs, attrs[0]], [*attrs, *attrs, attrs[0]]):
        with pytest.raises(ValueError, match="attributions: expected 2 or 4 tensors"):
            lens.compute_convergence_delta(
                wrong, None, ids, target=5, positions=-1, path=path
            )
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)


@pytest.mark.parametrize("value", [float("nan"), 0.5, 7.0])
def test_an_attention_mask_of_other_values_than_0_and_1_is_refused(lens, llama, value):
    # Issue 48: p_model changed while result.mask read all True.
    ids, mask = _ids(), torch.ones(2, 5)
    mask[1, 2] = value
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    with pytest.raises(ValueError, match="expected an attention_mask of 0s and 1s"):
        lens.attribute_map(ids, additional_forward_args=(mask,))
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)
    lens.attribute_map(ids, additional_forward_args=(torch.ones(2, 5),))  # 1.0s


def test_constructor_errors(llama):
    blocks = model_parts(llama).blocks
    readout = model_parts(llama).readout()
    other = tiny_model("llama")
    with pytest.raises(TypeError, match="layer"):
        LayerIGLens(llama, [], readout=readout)
    with pytest.raises(TypeError, match="layer"):
        LayerIGLens(llama, ["model.layers.0"], readout=readout)
    with pytest.raises(ValueError, match="layer"):
        LayerIGLens(llama, [blocks[0], blocks[0]], readout=readout)
    with pytest.raises(ValueError, match=r"layer\[0\]"):
        LayerIGLens(llama, [model_parts(other).blocks[0]], readout=readout)
    with pytest.raises(TypeError, match="readout"):
        LayerIGLens(llama, blocks, readout=llama.lm_head)
    with pytest.raises(TypeError, match="forward_func"):
        LayerIGLens(None, blocks, readout=readout)
    with pytest.raises(ValueError, match="layers"):
        LayerIGLens.from_model(llama, layers=[len(blocks)])


def test_layers_out_of_order_or_not_final(llama):
    blocks = model_parts(llama).blocks
    readout = model_parts(llama).readout()
    hooks = hook_snapshot(llama)
    with pytest.raises(ValueError, match="execution order"):
        LayerIGLens(llama, [blocks[1], blocks[0]], readout=readout).attribute_map(
            _ids()
        )
    with pytest.raises(ValueError, match="final block"):
        LayerIGLens(llama, blocks[:-1], readout=readout).attribute_map(_ids())
    assert hook_snapshot(llama) == hooks


def test_forward_without_logits(llama):
    parts = model_parts(llama)
    lens = LayerIGLens(
        lambda ids: {"x": llama(ids).logits}, parts.blocks, readout=parts.readout()
    )
    with pytest.raises(TypeError, match="forward_func"):
        lens.attribute_map(_ids())
    lens = LayerIGLens(
        lambda ids: llama(ids).logits[..., :10],
        parts.blocks,
        readout=parts.readout(),
    )
    with pytest.raises(ValueError, match="forward_func"):
        lens.attribute_map(_ids())


def test_nan_names_the_layer(llama, monkeypatch):
    blocks = model_parts(llama).blocks
    lens = LayerIGLens.from_model(llama)
    handle = blocks[1].register_forward_hook(lambda m, a, o: o * float("nan"))
    hooks = hook_snapshot(llama)
    try:
        with pytest.raises(ValueError, match="block 1"):
            lens.attribute_map(_ids())
    finally:
        handle.remove()
    assert hook_snapshot(llama) != hooks  # the test's own hook was there, and is kept


def test_layer_that_raises_leaves_no_hook(llama, monkeypatch):
    lens = LayerIGLens.from_model(llama)
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    block = model_parts(llama).blocks[1]

    def broken(*args, **kwargs):
        raise AssertionError("Raising error on execution")

    monkeypatch.setattr(block, "forward", broken)
    with pytest.raises(AssertionError, match="Raising error"):
        lens.attribute(_ids())
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)


def test_error_during_backward_leaves_no_hook(llama):
    lens = LayerIGLens.from_model(llama)
    llama.train()
    try:
        hooks, state = hook_snapshot(llama), state_snapshot(llama)
        with pytest.raises(TypeError):
            lens.attribute(_ids(), grad_kwargs={"no_such_option": True})
        assert hook_snapshot(llama) == hooks
        assert_state_unchanged(llama, state)
    finally:
        llama.eval()


def test_normal_call_keeps_hooks_weights_and_mode(llama):
    lens = LayerIGLens.from_model(llama)
    ids, mask = left_padded([5, 3], VOCAB)
    own = model_parts(llama).blocks[0].register_forward_hook(lambda m, a, o: None)
    try:
        hooks, state = hook_snapshot(llama), state_snapshot(llama)
        lens.attribute(
            ids, additional_forward_args=(mask,), method="gausslegendre", n_steps=3
        )
        lens.attribute_map(ids, additional_forward_args=(mask,))
        assert hook_snapshot(llama) == hooks
        assert_state_unchanged(llama, state)
    finally:
        own.remove()


def test_gradients_forced_under_no_grad(lens):
    with torch.no_grad():
        attrs = lens.attribute(_ids(), method="riemann_middle", n_steps=4)
    assert all(a.abs().sum() > 0 for a in attrs)


def test_grad_kwargs_pass_through(lens):
    a = lens.attribute(
        _ids(1, 3),
        method="gausslegendre",
        n_steps=3,
        grad_kwargs={"retain_graph": False},
    )
    assert len(a) == len(lens.layers)


def test_training_mode_is_evaluated_in_eval_mode_and_restored():
    # Dropout everywhere: in training mode every forward would differ.
    model = tiny_model("gpt2", resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    lens = LayerIGLens.from_model(model)
    ids = _ids()
    expected = lens.attribute_map(ids).attributions
    model.train()
    model.transformer.h[0].eval()  # a mixed state must come back as it was
    modes = {name: m.training for name, m in model.named_modules()}
    for _ in range(2):
        torch.testing.assert_close(
            lens.attribute_map(ids).attributions, expected, rtol=0, atol=0
        )
    assert {name: m.training for name, m in model.named_modules()} == modes


def test_concurrent_calls_on_one_model_are_safe(llama):
    import threading

    lenses = [LayerIGLens.from_model(llama), LayerIGLens.from_model(llama)]
    inputs = [_ids(2, 6), _ids(3, 4)]
    expected = [lens.attribute_map(x) for lens, x in zip(lenses, inputs)]
    hooks = hook_snapshot(llama)
    results, errors = {}, []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                results[i] = lenses[i % 2].attribute_map(inputs[i % 2])
        except Exception as err:  # reported below, in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for i, result in results.items():
        torch.testing.assert_close(
            result.attributions, expected[i % 2].attributions, rtol=0, atol=0
        )
    assert hook_snapshot(llama) == hooks


def test_a_model_on_the_meta_device_is_refused():
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_model("llama").config)
    with pytest.raises(ValueError, match="meta device"):
        LayerIGLens.from_model(model)


def test_a_readout_the_same_at_every_layer_takes_the_joint_path(llama, tmp_path):
    # Issue 48: identity translators are the model's own readout at every point,
    # which the joint path takes (as its docs say); it was refused after a forward.
    from captum_iglens import IGLensResult
    from captum_iglens.readout.translators import Translators

    ids = _ids()
    lens = LayerIGLens.from_model(llama, lens=Translators.identity(2, 32))
    result = lens.attribute_map(ids, path="joint", n_steps=8)
    logit = LayerIGLens.from_model(llama).attribute_map(ids, path="joint", n_steps=8)
    torch.testing.assert_close(result.attributions, logit.attributions)
    assert result.path == "joint" and not result.lens_change.any()
    result.save(tmp_path / "r.json")
    assert IGLensResult.load(tmp_path / "r.json").path == "joint"


def test_from_model_takes_embeddings_as_its_docstring_says(llama):
    # Issue 48: a raw torch indexing error, though embeddings are documented.
    ids, mask = left_padded([5, 3], VOCAB)
    embeds = llama.get_input_embeddings()(ids).detach()
    lens = LayerIGLens.from_model(llama)
    by_ids = lens.attribute_map(ids, additional_forward_args=(mask,), n_steps=4)
    by_embeds = lens.attribute_map(embeds, additional_forward_args=(mask,), n_steps=4)
    torch.testing.assert_close(by_embeds.attributions, by_ids.attributions)
    torch.testing.assert_close(by_embeds.model_prob, by_ids.model_prob)


def test_an_error_of_the_models_own_norm_goes_through(llama, monkeypatch):
    # Issue 48: re-raised as "ValueError: the readout cannot read ...".
    norm = llama.model.norm
    forward = norm.forward

    def fails_on_rows(hidden):
        if hidden.dim() == 2:  # as the readout reads it, not as the model does
            raise RuntimeError("the norm's own failure")
        return forward(hidden)

    monkeypatch.setattr(norm, "forward", fails_on_rows)
    hooks, state = hook_snapshot(llama), state_snapshot(llama)
    with pytest.raises(RuntimeError, match="the norm's own failure"):
        LayerIGLens.from_model(llama).attribute_map(_ids())
    assert hook_snapshot(llama) == hooks
    assert_state_unchanged(llama, state)
