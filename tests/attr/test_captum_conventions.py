"""Captum's generic patterns (hook removal, targets, additional_forward_args,
internal_batch_size, convergence delta, data parallel, NoiseTunnel,
ClassSummarizer) applied to LayerIGLens on tiny causal LMs: a pure-torch one and
Hugging Face ones built from their configs. Where LayerIntegratedGradients takes
the same call, it runs too and must return the same structure (types, batch and
hidden sizes, dtypes, delta shapes). Attributions run over the attributed
positions ``P`` where LayerIntegratedGradients returns all ``T`` (documented in
docs/python-api.md), so the structure compares every size except that one."""

import copy
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from captum.attr import (
    ClassSummarizer,
    CommonStats,
    LayerIntegratedGradients,
    NoiseTunnel,
)
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from captum_iglens import LayerIGLens, Readout
from captum_iglens.hf.forward import CausalLMForward
from tests.helpers import hook_snapshot

TOL = dict(atol=2e-6, rtol=1e-4)
BATCH, LENGTH = 3, 5


# ----------------------------------------------------------------- tiny models


class _Block(nn.Module):
    """Pre-norm block: causal single-head attention, then an MLP."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        t = h.shape[1]
        allowed = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, :].bool()
        scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        h = h + self.out(scores.softmax(-1) @ v)
        return h + self.mlp(self.ln2(h))


class TinyCausalLM(nn.Module):
    """A pure-torch causal LM: token ids (B, T) or embeddings (B, T, d) in,
    logits (B, T, V) out."""

    def __init__(self, vocab: int = 32, d: int = 16, n_blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        h = x if x.is_floating_point() else self.embed(x)
        for block in self.blocks:
            h = block(h, attention_mask)
        return self.head(self.norm(h))


def pure_model() -> TinyCausalLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = TinyCausalLM()
        with torch.no_grad():
            for p in model.norm.parameters():
                p.normal_(mean=1.0, std=0.5)
    return model.eval()


class LastPosition(nn.Module):
    """A forward that returns last-position logits (B, V)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        return self.model(x, attention_mask)[:, -1]


class EmbedsForward(nn.Module):
    """A Hugging Face causal LM called on embeddings (B, T, d)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, embeds: Tensor) -> Tensor:
        return self.model(inputs_embeds=embeds, use_cache=False).logits


@dataclass
class Case:
    name: str
    model: nn.Module
    seq: nn.Module  # forward returning (B, T, V)
    blocks: List[nn.Module]
    readout: Optional[Readout]  # None: found from the Hugging Face model
    vocab: int
    embed: Callable[[Tensor], Tensor]

    @property
    def last(self) -> nn.Module:
        return LastPosition(self.seq)

    def lens(self, forward: Optional[nn.Module] = None, layer: Any = None, **kw):
        return LayerIGLens(
            self.seq if forward is None else forward,
            self.blocks if layer is None else layer,
            readout=self.readout,
            **kw,
        )

    def ids(self, batch: int = BATCH, length: int = LENGTH, seed: int = 0) -> Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(3, self.vocab, (batch, length), generator=gen)


def _case(name: str) -> Case:
    if name == "pure":
        model = pure_model()
        return Case(
            name,
            model,
            model,
            list(model.blocks),
            Readout(head=model.head, norm=model.norm),
            32,
            model.embed,
        )
    from captum_iglens.hf import model_parts
    from tests.tiny_models import VOCAB, tiny_model

    model = tiny_model(name)
    return Case(
        name,
        model,
        CausalLMForward(model),
        model_parts(model).blocks,
        None,
        VOCAB,
        model.get_input_embeddings(),
    )


@pytest.fixture(scope="module", params=["pure", "llama", "gpt2"])
def case(request) -> Case:
    return _case(request.param)


@pytest.fixture(scope="module")
def pure() -> Case:
    return _case("pure")


def _structure(attrs: Any) -> Any:
    if isinstance(attrs, Tensor):
        return ("Tensor", attrs.dim(), attrs.shape[0], attrs.shape[-1], attrs.dtype)
    return (type(attrs).__name__, tuple(_structure(a) for a in attrs))


def assert_like_lig(ours: Any, theirs: Any, delta: bool = False) -> None:
    """Same return structure as LayerIntegratedGradients' on the same call."""
    if delta:
        (ours, our_delta), (theirs, their_delta) = ours, theirs
        assert our_delta.shape == their_delta.shape
        assert our_delta.dtype == their_delta.dtype
    assert _structure(ours) == _structure(theirs)


def _no_hooks(model: nn.Module) -> bool:
    return all(not any(lists) for lists in hook_snapshot(model).values())


# ----------------------------------------------------------------- hook removal


class _ErrorModule(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise AssertionError("Raising error on execution")


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        raise RuntimeError("Raising error in the backward")


class _HeadFailingBackward(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head
        self.out_features = head.out_features

    def forward(self, h: Tensor) -> Tensor:
        return _FailingBackward.apply(self.head(h))


@pytest.mark.parametrize(
    "mode", ["normal", "incorrect_target", "invalid_module", "backward_error"]
)
@pytest.mark.parametrize("algorithm", ["lens", "lig"])
def test_hook_removal(mode, algorithm):
    """Captum's three modes, plus an exception raised in the backward: no hook
    stays on any module, whichever way the call ends."""
    model = copy.deepcopy(pure_model())
    if mode == "invalid_module":
        model.blocks[-1] = _ErrorModule()
    if mode == "backward_error":
        model.head = _HeadFailingBackward(model.head)
    forward, layer = LastPosition(model), model.blocks[-1]
    method = LayerIGLens(
        forward,
        layer,
        readout=Readout(head=model.head, norm=model.norm),
        input_layer=model.blocks[0],
    )
    if algorithm == "lig":
        method = LayerIntegratedGradients(forward, layer)
    target = (9999,) * 20 if mode == "incorrect_target" else 3
    ids = _case("pure").ids()
    if mode == "normal":
        method.attribute(ids, target=target)
    else:
        with pytest.raises((AssertionError, TypeError, ValueError, RuntimeError)):
            method.attribute(ids, target=target)
    assert _no_hooks(model)


# ----------------------------------------------------------------- targets

# name -> (target from per-example ids vs and positions ts, single target of
# example i, forward kind, whether LayerIntegratedGradients takes the form).
_FORMS = {
    "int": (lambda vs, ts: 5, lambda vs, ts, i: 5, "last", True),
    "one-tuple": (lambda vs, ts: (5,), lambda vs, ts, i: 5, "last", True),
    "0-d tensor": (lambda vs, ts: torch.tensor(5), lambda vs, ts, i: 5, "last", True),
    "one-element tensor": (
        lambda vs, ts: torch.tensor([5]),
        lambda vs, ts, i: 5,
        "last",
        True,
    ),
    "(B,) tensor": (
        lambda vs, ts: torch.tensor(vs),
        lambda vs, ts, i: vs[i],
        "last",
        True,
    ),
    "(B, 1) tensor": (
        lambda vs, ts: torch.tensor(vs)[:, None],
        lambda vs, ts, i: vs[i],
        "last",
        False,  # Captum asserts: a (B, 1) tensor is not one of its forms
    ),
    "list of ints": (lambda vs, ts: vs, lambda vs, ts, i: vs[i], "last", True),
    "list of one-tuples": (
        lambda vs, ts: [(v,) for v in vs],
        lambda vs, ts, i: vs[i],
        "last",
        True,
    ),
    "(t, v)": (lambda vs, ts: (2, 5), lambda vs, ts, i: (2, 5), "seq", True),
    "list of (t, v)": (
        lambda vs, ts: list(zip(ts, vs)),
        lambda vs, ts, i: (ts[i], vs[i]),
        "seq",
        True,
    ),
}


@pytest.mark.parametrize("form", list(_FORMS))
def test_target_forms_batch_equals_per_example(case, form):
    make, single, kind, lig_takes = _FORMS[form]
    vs, ts = [5, 9, 17], [1, 4, 1]
    forward = case.last if kind == "last" else case.seq
    lens, ids = case.lens(forward), case.ids()
    attrs, delta = lens.attribute(
        ids, target=make(vs, ts), return_convergence_delta=True
    )
    assert delta.shape == (BATCH,)
    assert delta.abs().max() <= 1e-6
    for i in range(BATCH):
        one, one_delta = lens.attribute(
            ids[i : i + 1], target=single(vs, ts, i), return_convergence_delta=True
        )
        for batch_layer, one_layer in zip(attrs, one):
            # zero away from the example's own position, equal at it
            assert (batch_layer[i] != 0).any(-1).sum() == 1
            torch.testing.assert_close(
                batch_layer[i].sum(0), one_layer[0].sum(0), **TOL
            )
        torch.testing.assert_close(delta[i : i + 1], one_delta, **TOL)
    lig = LayerIntegratedGradients(forward, [case.blocks[-1]])
    call = dict(target=make(vs, ts), n_steps=4, return_convergence_delta=True)
    if lig_takes:
        ours = case.lens(forward, [case.blocks[-1]]).attribute(ids, **call)
        assert_like_lig(ours, lig.attribute(ids, **call), delta=True)
    else:
        with pytest.raises(AssertionError):
            lig.attribute(ids, **call)


def test_tuple_target_selects_position_and_token(pure):
    """``(t, v)`` attributes token v at position t: the credits add up to the
    model's probability of v at t minus f at the start of the path, both
    computed here from the model's own modules."""
    model, ids = pure.model, pure.ids()
    targets = [(1, 3), (1, 7), (4, 7)]
    attrs = pure.lens().attribute(ids, target=targets)
    with torch.no_grad():
        logits = model(ids)
        h_0 = model.embed(ids)
    for b, (t, v) in enumerate(targets):
        p_model = logits[b, t].softmax(-1)[v]
        f_base = model.head(model.norm(h_0[b, t])).softmax(-1)[v]
        total = sum(layer[b].sum() for layer in attrs)
        torch.testing.assert_close(total, p_model - f_base, atol=1e-6, rtol=0)
    same = pure.lens().attribute(ids, target=(1, 3))
    explicit = pure.lens().attribute(ids, target=3, positions=[1])
    for a, b in zip(same, explicit):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_list_of_tuples_is_not_read_as_token_ids_per_position():
    """The call of issue 12: with two positions, a list of B (t, v) tuples is
    Captum's per-example index, not a (B, P) table of token ids."""
    hf = _case("llama")
    lens = LayerIGLens(hf.seq, hf.blocks)
    ids = hf.ids(batch=4)[:, :2]
    pairs = [(1, 3), (1, 7), (0, 7), (1, 3)]
    attrs, delta = lens.attribute(ids, target=pairs, return_convergence_delta=True)
    as_table = lens.attribute(ids, target=torch.tensor(pairs))
    assert delta.shape == (4,)
    assert not all(torch.allclose(a, b) for a, b in zip(attrs, as_table))
    for b, (t, v) in enumerate(pairs):
        own = lens.attribute(ids[b : b + 1], target=v, positions=[t])
        for layer, alone in zip(attrs, own):
            torch.testing.assert_close(layer[b, t], alone[0, 0], **TOL)
            assert (layer[b, 1 - t] == 0).all()


def test_per_position_tensor_keeps_its_meaning(pure):
    """The project's (B, P) form: one id per attributed position."""
    ids, lens = pure.ids(), pure.lens()
    ids_per_position = torch.tensor([[3, 4], [5, 6], [7, 8]])
    attrs = lens.attribute(ids, target=ids_per_position, positions=[1, 3])
    for p, pos in enumerate([1, 3]):
        alone = lens.attribute(ids, target=ids_per_position[:, p], positions=[pos])
        for a, b in zip(attrs, alone):
            torch.testing.assert_close(a[:, p], b[:, 0], **TOL)


@pytest.mark.parametrize(
    "target, error",
    [
        ((1, 2, 3), TypeError),
        ([(1, 3), 4, 5], TypeError),
        ([(1, 3), (2, 4)], ValueError),  # not one per example
        ((LENGTH, 3), ValueError),  # position out of range
        ((1.0, 3), TypeError),
        ([5], ValueError),  # a list holds one id per example
    ],
)
def test_target_forms_refused(pure, target, error):
    with pytest.raises(error, match="target"):
        pure.lens().attribute(pure.ids(), target=target)


def test_tuple_target_needs_position_axis_and_no_positions(pure):
    with pytest.raises(ValueError, match="target: .* no position axis"):
        pure.lens(pure.last).attribute(pure.ids(), target=(1, 3))
    with pytest.raises(ValueError, match="positions"):
        pure.lens().attribute(pure.ids(), target=(1, 3), positions=[1])


# ----------------------------------------------------------------- other arguments


def test_additional_forward_args_forms(case):
    ids = case.ids()
    mask = torch.ones_like(ids)
    lens = case.lens(case.last)
    lig = LayerIntegratedGradients(case.last, case.blocks[-1])
    reference = lens.attribute(ids, target=5)
    for extra in (mask, (mask,)):
        ours = lens.attribute(ids, target=5, additional_forward_args=extra)
        for a, b in zip(ours, reference):
            torch.testing.assert_close(a, b, **TOL)
        theirs = lig.attribute(ids, target=5, additional_forward_args=extra, n_steps=4)
        assert_like_lig(ours[-1], theirs)
    # Padding marked by the mask: the padded example equals itself alone.
    padded = ids.clone()
    mask[0, :2] = 0
    padded[0, :2] = 0
    ours = lens.attribute(padded, target=5, additional_forward_args=(mask,))
    alone = lens.attribute(ids[:1, 2:], target=5)
    for a, b in zip(ours, alone):
        torch.testing.assert_close(a[:1], b, **TOL)


@pytest.mark.parametrize("method", ["prediction_aware", "gausslegendre"])
def test_internal_batch_size_does_not_change_results(case, method):
    ids, lens = case.ids(), case.lens()
    results = [
        lens.attribute(
            ids, method=method, n_steps=6, internal_batch_size=size, positions=[1, 4]
        )
        for size in (None, 1, 7)
    ]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, **TOL)
    lig = LayerIntegratedGradients(case.last, case.blocks[-1])
    assert_like_lig(
        case.lens(case.last, case.blocks[-1]).attribute(
            ids, target=5, internal_batch_size=7, return_convergence_delta=True
        ),
        lig.attribute(
            ids,
            target=5,
            internal_batch_size=7,
            n_steps=4,
            return_convergence_delta=True,
        ),
        delta=True,
    )


# ----------------------------------------------------------------- delta


_DELTA_CALLS = {
    "default positions": (dict(), "seq", (BATCH, LENGTH)),
    "several positions": (dict(positions=[0, 2]), "seq", (BATCH, 2)),
    "int position": (dict(positions=-1, target=5), "seq", (BATCH,)),
    "(B, V) forward": (dict(target=[3, 4, 5]), "last", (BATCH,)),
    "(t, v)": (dict(target=(2, 5)), "seq", (BATCH,)),
    "list of (t, v)": (dict(target=[(2, 5), (0, 1), (4, 9)]), "seq", (BATCH,)),
    "token-id baselines": (dict(target=(2, 5), baselines="ids"), "seq", (BATCH,)),
    "mean baselines": (dict(baselines="mean"), "seq", (BATCH, LENGTH)),
    "trapezoid": (dict(method="riemann_trapezoid", n_steps=3), "seq", (BATCH, LENGTH)),
}


@pytest.mark.parametrize("call", list(_DELTA_CALLS))
def test_compute_convergence_delta_equals_returned(case, call):
    kwargs, kind, shape = dict(_DELTA_CALLS[call][0]), *_DELTA_CALLS[call][1:]
    ids = case.ids()
    if kwargs.get("baselines") == "ids":
        kwargs["baselines"] = torch.zeros_like(ids)
    lens = case.lens(case.last if kind == "last" else case.seq)
    attrs, delta = lens.attribute(ids, return_convergence_delta=True, **kwargs)
    assert delta.shape == shape
    again = lens.compute_convergence_delta(
        attrs,
        kwargs.get("baselines"),
        ids,
        target=kwargs.get("target"),
        positions=kwargs.get("positions"),
    )
    assert again.shape == shape
    torch.testing.assert_close(again, delta, atol=1e-7, rtol=0)
    if call == "trapezoid":  # a delta far from zero is recomputed too
        assert delta.abs().max() > 1e-3


def test_compute_convergence_delta_is_in_probability_space(pure):
    """Against a delta computed here from the model's own modules."""
    model, ids = pure.model, pure.ids()
    lens = pure.lens()
    attrs = lens.attribute(ids, target=(3, 7))
    with torch.no_grad():
        p_model = model(ids)[:, 3].softmax(-1)[:, 7]
        f_base = model.head(model.norm(model.embed(ids)[:, 3])).softmax(-1)[:, 7]
    shifted = [a + 1e-3 for a in attrs]  # a delta that is not zero
    expected = sum(a.sum((1, 2)) for a in shifted) - (p_model - f_base)
    got = lens.compute_convergence_delta(shifted, None, ids, target=(3, 7))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="attributions"):
        lens.compute_convergence_delta(attrs[0][:, :, None], None, ids, target=(3, 7))


def test_convergence_delta_is_the_maps_delta_to_the_bit(pure):
    """The map's delta and ``compute_convergence_delta`` of the map's own
    credits are one float64 subtraction: the same float32 bits (on the pure
    model, whose readout of ``h_base`` does not depend on how rows are
    batched; Hugging Face kernels move it by ~1e-8)."""
    ids = pure.ids()
    lens = pure.lens(pure.seq)
    result = lens.attribute_map(
        ids, positions=[1, 3, 4], method="riemann_trapezoid", n_steps=3
    )
    credits = result.attributions  # (B, P, n)
    columns = [credits[:, :, i : i + 1] for i in range(credits.shape[-1])]
    again = lens.compute_convergence_delta(
        columns, None, ids, target=result.targets, positions=[1, 3, 4]
    )
    assert torch.equal(again.float(), result.delta)
    assert result.delta.abs().max() > 1e-3  # a delta that is not zero


# ----------------------------------------------------------------- constructor


def _hf_case(name: str) -> Case:
    return _case(name)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_construction_without_readout(name):
    """``LayerIGLens(model, layer)`` as Captum's generic tests build every layer
    method, for the model, its bound forward, and wrappers of it."""
    hf = _hf_case(name)
    ids = hf.ids()
    reference = LayerIGLens.from_model(hf.model).attribute(ids, target=5)
    for forward in (
        hf.seq,
        LastPosition(hf.seq),
        nn.DataParallel(hf.seq),
    ):
        lens = LayerIGLens(forward, hf.blocks)
        ours = lens.attribute(ids, target=5, positions=-1)
        for a, b in zip(ours, reference):
            torch.testing.assert_close(a, b[:, -1:], **TOL)
    for forward in (hf.model, hf.model.forward):  # outputs with .logits
        ours = LayerIGLens(forward, hf.blocks).attribute(ids, target=5)
        for a, b in zip(ours, reference):
            torch.testing.assert_close(a, b, **TOL)
    # A single block starts the path at the model's first block, as from_model:
    # its credit is the sum of the blocks' credits.
    single = LayerIGLens(hf.model, hf.blocks[-1]).attribute(ids, target=5)
    total = sum(layer.sum(-1) for layer in reference)
    torch.testing.assert_close(single.sum(-1), total, **TOL)


def test_construction_without_readout_refused_for_other_models(pure):
    with pytest.raises(TypeError, match="readout"):
        LayerIGLens(pure.model, pure.blocks)


def test_multiply_by_inputs(pure):
    """False: each block's path-averaged gradient along its own segment; times
    that segment's displacement (captured here) it is the True result."""
    ids, model = pure.ids(), pure.model
    call = dict(target=(2, 5), method="gausslegendre", n_steps=8)
    multiplied = pure.lens().attribute(ids, **call)
    plain = pure.lens(multiply_by_inputs=False)
    assert not plain.multiplies_by_inputs and pure.lens().multiplies_by_inputs
    gradients, delta = plain.attribute(ids, return_convergence_delta=True, **call)
    states = [model.embed(ids)]
    handles = [
        b.register_forward_hook(lambda m, a, o: states.append(o)) for b in model.blocks
    ]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    for j, (grad, attr) in enumerate(zip(gradients, multiplied)):
        step = (states[j + 1] - states[j])[:, 2:3]
        torch.testing.assert_close(grad * step, attr, **TOL)
    assert delta.abs().max() <= 1e-3  # the delta of the multiplied attributions
    with pytest.raises(ValueError, match="prediction_aware"):
        plain.attribute(ids, target=(2, 5))
    lig = LayerIntegratedGradients(
        pure.seq, [pure.blocks[-1]], multiply_by_inputs=False
    )
    assert_like_lig(
        pure.lens(layer=[pure.blocks[-1]], multiply_by_inputs=False).attribute(
            ids, **call
        ),
        lig.attribute(ids, target=(2, 5), method="gausslegendre", n_steps=8),
    )


# ----------------------------------------------------------------- baselines


def test_token_id_baselines_start_at_first_block_input(case):
    """Token-id baselines equal the hidden-state baseline the first block
    receives for those ids (captured here), and differ from ``0``."""
    ids = case.ids()
    reference = torch.full_like(ids, 4)
    received = []
    handle = case.blocks[0].register_forward_pre_hook(
        lambda m, a, k: received.append((a[0] if a else k["hidden_states"]).detach()),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            case.seq(reference)
    finally:
        handle.remove()
    lens = case.lens()
    by_ids = lens.attribute(ids, baselines=reference, target=(2, 5))
    by_state = lens.attribute(ids, baselines=received[0], target=(2, 5))
    by_tuple = lens.attribute(ids, baselines=(reference,), target=(2, 5))
    zero = lens.attribute(ids, baselines=0, target=(2, 5))
    for a, b, c in zip(by_ids, by_state, by_tuple):
        torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(a, c, atol=0, rtol=0)
    assert not torch.allclose(by_ids[0], zero[0])
    lig = LayerIntegratedGradients(case.seq, [case.blocks[-1]])
    call = dict(baselines=reference, target=(2, 5), return_convergence_delta=True)
    assert_like_lig(
        case.lens(layer=[case.blocks[-1]]).attribute(ids, **call),
        lig.attribute(ids, n_steps=4, **call),
        delta=True,
    )
    with pytest.raises(ValueError, match="baselines"):
        lens.attribute(ids, baselines=(reference[:, :2],))


def test_token_id_baselines_one_per_input(pure):
    """A tuple of baselines, one per input: the reference forward runs on it."""
    ids, lens = pure.ids(), pure.lens()
    mask = torch.ones_like(ids)
    reference = torch.full_like(ids, 4)
    inputs = (ids, mask)
    per_input = lens.attribute(inputs, baselines=(reference, mask), target=(2, 5))
    alone = lens.attribute(ids, baselines=reference, target=(2, 5))
    for a, b in zip(per_input, alone):
        torch.testing.assert_close(a, b, **TOL)
    lig = LayerIntegratedGradients(pure.seq, [pure.blocks[-1]])
    assert_like_lig(
        pure.lens(layer=[pure.blocks[-1]]).attribute(
            inputs, baselines=(reference, mask), target=(2, 5)
        ),
        lig.attribute(inputs, baselines=(reference, mask), target=(2, 5), n_steps=4),
    )
    with pytest.raises(ValueError, match="one per input"):
        lens.attribute(inputs, baselines=(reference, mask, mask), target=(2, 5))


# ----------------------------------------------------------------- dtype


def test_float64_model_gives_float64_attributions():
    model = pure_model().double()
    lens = LayerIGLens(model, model.blocks[-1], readout=Readout(model.head, model.norm))
    ids = _case("pure").ids()
    for method in ("prediction_aware", "gausslegendre"):
        attrs, delta = lens.attribute(
            ids, target=(2, 5), method=method, return_convergence_delta=True
        )
        assert attrs.dtype == delta.dtype == torch.float64
    assert delta.abs().max() <= 1e-9
    lig = LayerIntegratedGradients(model, model.blocks[-1])
    assert_like_lig(
        lens.attribute(ids, target=(2, 5), return_convergence_delta=True),
        lig.attribute(ids, target=(2, 5), return_convergence_delta=True),
        delta=True,
    )
    assert lens.attribute_map(ids).attributions.dtype == torch.float32


# ----------------------------------------------------------------- data parallel


def test_data_parallel(case):
    ids = case.ids()
    wrapped = nn.DataParallel(case.seq)
    ours = case.lens(wrapped).attribute(ids, target=(2, 5))
    plain = case.lens().attribute(ids, target=(2, 5))
    for a, b in zip(ours, plain):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert_like_lig(
        case.lens(wrapped, case.blocks[-1]).attribute(ids, target=(2, 5)),
        LayerIntegratedGradients(wrapped, case.blocks[-1]).attribute(
            ids, target=(2, 5), n_steps=4
        ),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = pure_model()
        ddp = DistributedDataParallel(model)
        ids = _case("pure").ids(batch=4)[rank::world]
        lens = LayerIGLens(
            ddp, list(model.blocks), readout=Readout(model.head, model.norm)
        )
        attrs, delta = lens.attribute(ids, target=(2, 5), return_convergence_delta=True)
        lig = LayerIntegratedGradients(ddp, model.blocks[-1])
        lig_attrs, lig_delta = lig.attribute(
            ids, target=(2, 5), n_steps=4, return_convergence_delta=True
        )
        torch.save(
            dict(attrs=attrs, delta=delta, lig_attrs=lig_attrs, lig_delta=lig_delta),
            os.path.join(out_dir, f"{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_data_parallel(pure, tmp_path):
    """DDP (gloo, CPU, two processes): each rank's attributions of its shard
    equal the plain model's."""
    world = 2
    mp.spawn(_ddp_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world)
    ids = pure.ids(batch=4)
    lens = pure.lens()
    for rank in range(world):
        got = torch.load(tmp_path / f"{rank}.pt")
        attrs, delta = lens.attribute(
            ids[rank::world], target=(2, 5), return_convergence_delta=True
        )
        for a, b in zip(got["attrs"], attrs):
            torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(got["delta"], delta, **TOL)
        assert_like_lig(
            (got["attrs"][-1], got["delta"]),
            (got["lig_attrs"], got["lig_delta"]),
            delta=True,
        )


# ----------------------------------------------------------------- NoiseTunnel


@pytest.mark.parametrize("nt_type", ["smoothgrad", "smoothgrad_sq", "vargrad"])
@pytest.mark.parametrize("name", ["pure", "llama"])
def test_noise_tunnel(name, nt_type):
    """On embeddings (noise needs float inputs), over one block and over a tuple
    of blocks; a list of blocks is refused by NoiseTunnel itself, for
    LayerIntegratedGradients too."""
    c = _case(name)
    forward = c.seq if name == "pure" else EmbedsForward(c.model)
    embeds = c.embed(c.ids()).detach()
    call = dict(
        nt_type=nt_type,
        nt_samples=3,
        stdevs=1e-3,
        target=(2, 5),
        return_convergence_delta=True,
    )
    single = NoiseTunnel(c.lens(forward, c.blocks[-1])).attribute(embeds, **call)
    lig = NoiseTunnel(LayerIntegratedGradients(forward, c.blocks[-1]))
    assert_like_lig(single, lig.attribute(embeds, n_steps=4, **call), delta=True)
    assert single[1].shape == (BATCH * 3,)
    attrs, delta = NoiseTunnel(c.lens(forward, tuple(c.blocks))).attribute(
        embeds, **call
    )
    assert isinstance(attrs, tuple) and len(attrs) == len(c.blocks)
    assert delta.shape == (BATCH * 3,) and delta.abs().max() <= 1e-6
    if nt_type == "smoothgrad":  # tiny noise: close to the noiseless result
        clean = c.lens(forward, tuple(c.blocks)).attribute(embeds, target=(2, 5))
        for a, b in zip(attrs, clean):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    for method in (
        c.lens(forward, list(c.blocks)),
        LayerIntegratedGradients(forward, [c.blocks[-1]]),
    ):
        with pytest.raises(AssertionError, match="tuple"):
            NoiseTunnel(method).attribute(embeds, **call)


# ----------------------------------------------------------------- ClassSummarizer


def test_class_summarizer(pure):
    ids = pure.ids()
    labels = [5, 9, 5]
    target = [(2, v) for v in labels]
    ours = pure.lens(layer=pure.blocks[-1]).attribute(ids, target=target)
    theirs = LayerIntegratedGradients(pure.seq, pure.blocks[-1]).attribute(
        ids, target=target, n_steps=4
    )
    summaries = []
    for attrs in (ours, theirs):
        summarizer = ClassSummarizer(stats=CommonStats())
        summarizer.update(attrs, labels)
        summaries.append(summarizer)
    ours_s, theirs_s = summaries
    assert ours_s.class_summaries.keys() == theirs_s.class_summaries.keys() == {5, 9}
    for label in (5, 9):
        rows = [i for i, v in enumerate(labels) if v == label]
        (mine,), (lig,) = ours_s.class_summaries[label], theirs_s.class_summaries[label]
        torch.testing.assert_close(mine["mean"], ours[rows].mean(0), **TOL)
        assert mine.keys() == lig.keys()
    torch.testing.assert_close(ours_s.summary[0]["mean"], ours.mean(0), **TOL)


# ------------------------------------------------- Captum drop-in leftovers


class Softmaxed(nn.Module):
    """A forward returning probabilities, as many Captum tutorials write it."""

    def __init__(self, forward: nn.Module) -> None:
        super().__init__()
        self.forward_ = forward

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        return self.forward_(x, attention_mask).softmax(-1)


@pytest.mark.parametrize("last", [False, True], ids=["all-positions", "last"])
def test_a_softmax_forward_is_recognised(pure, last):
    """The probabilities' log is the logits up to a per-row constant: the same
    distribution, the same targets, the same attributions."""
    seq = pure.last if last else pure.seq
    ids = pure.ids()
    theirs = pure.lens(Softmaxed(seq)).attribute(ids, target=5)
    ours = pure.lens(seq).attribute(ids, target=5)
    for a, b in zip(theirs, ours):
        assert torch.allclose(a, b, atol=1e-6)
    got = pure.lens(Softmaxed(seq)).attribute_map(ids)
    want = pure.lens(seq).attribute_map(ids)
    assert torch.equal(got.targets, want.targets)
    assert torch.allclose(got.attributions, want.attributions, atol=1e-6)
    assert got.delta.abs().max() <= 1e-6


class _Classifier(nn.Module):
    """Captum's generic toy: features (B, F) in, class scores (B, C) out."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(torch.relu(self.linear1(x)))


@pytest.mark.parametrize(
    "inputs", [torch.randn(2, 3), torch.randn(2, 5, 3)], ids=["features", "seq"]
)
def test_a_classifier_is_refused_saying_what_is_needed(inputs):
    toy = _Classifier()
    lens = LayerIGLens(toy, toy.linear1, readout=Readout(head=nn.Linear(4, 7)))
    with pytest.raises((TypeError, ValueError), match="attributes a language model"):
        lens.attribute(inputs, target=0)
    assert _no_hooks(toy)


@pytest.mark.parametrize(
    "method",
    [
        "riemann_left",
        "riemann_right",
        "riemann_middle",
        "riemann_trapezoid",
        "gausslegendre",
    ],
)
def test_n_steps_one_accepted_exactly_where_captum_accepts_it(pure, method):
    """Captum 0.9's Riemann rules assert n > 1; Gauss-Legendre takes n = 1.
    LayerIGLens accepts the same, and refuses the rest with a ValueError
    naming n_steps (where Captum raises an AssertionError)."""
    ids = pure.ids()
    lig = LayerIntegratedGradients(pure.seq, pure.blocks[-1])
    try:
        lig.attribute(pure.embed(ids), target=(LENGTH - 1, 5), n_steps=1, method=method)
        captum_accepts = True
    except AssertionError:
        captum_accepts = False
    lens = pure.lens()
    if captum_accepts:
        lens.attribute(ids, target=5, n_steps=1, method=method)
    else:
        with pytest.raises(ValueError, match="n_steps"):
            lens.attribute(ids, target=5, n_steps=1, method=method)
