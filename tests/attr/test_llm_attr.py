"""LLMLayerAttribution: Captum's LLM pipeline with layers as the columns."""

from collections import UserDict
from typing import List, Optional, Union

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from captum.attr import (  # noqa: E402
    LayerIntegratedGradients,
    LLMAttributionResult,
    TextTemplateInput,
    TextTokenInput,
)
from torch import Tensor  # noqa: E402

from captum_iglens import IGLensResult, LayerIGLens  # noqa: E402
from captum_iglens.hf import model_parts  # noqa: E402
from captum_iglens.attr.llm_attr import LLMLayerAttribution  # noqa: E402
from tests.tiny_models import tiny_model  # noqa: E402

TOL = 1e-6


class DummyTokenizer:
    """Space-separated single characters, id = ord(char) (< 128, the tiny vocab).

    ``<s>`` is the tiny models' BOS (1); any longer word is ``<unk>`` (3). Modelled
    on the DummyTokenizer of Captum's tests/attr/test_llm_attr.py.
    """

    bos, eos, unk = 1, 2, 3
    pad_token_id = 0
    eos_token_id = eos
    special = {0: "<pad>", bos: "<s>", eos: "</s>", unk: "<unk>"}

    def encode(
        self,
        text: str,
        add_special_tokens: bool = True,
        return_tensors: Optional[str] = None,
    ) -> Union[List[int], Tensor]:
        ids = [
            ord(w) if len(w) == 1 else (self.bos if w == "<s>" else self.unk)
            for w in text.split(" ")
        ]
        if add_special_tokens:
            ids = [self.bos, *ids]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def convert_ids_to_tokens(
        self, ids: Union[int, List[int]]
    ) -> Union[str, List[str]]:
        if isinstance(ids, int):
            return self.special.get(ids, chr(ids))
        return [self.special.get(i, chr(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        raise NotImplementedError

    def decode(self, ids: Tensor) -> str:
        tokens = self.convert_ids_to_tokens(ids.tolist())
        return tokens if isinstance(tokens, str) else " ".join(tokens)

    def __call__(
        self,
        text: str,
        add_special_tokens: bool = True,
        return_offsets_mapping: bool = False,
    ) -> UserDict:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        out = UserDict(input_ids=ids)
        if return_offsets_mapping:
            offsets = [(0, 0)] if add_special_tokens else []
            start = 0
            for word in text.split(" "):
                offsets.append((start, start + len(word)))
                start += len(word) + 1
            out["offset_mapping"] = offsets
        return out


@pytest.fixture(scope="module")
def llama3():
    return tiny_model("llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def lens(llama3):
    return LayerIGLens.from_model(llama3)


@pytest.fixture(scope="module")
def tokenizer():
    return DummyTokenizer()


def _reference_probs(model, ids: Tensor, n_prompt: int, target: Tensor) -> Tensor:
    """p(target_i | prompt + target_<i) from the model's own logits."""
    full = torch.cat([ids, target[None]], dim=1)
    with torch.no_grad():
        probs = model(full).logits.softmax(-1)[0]
    rows = torch.arange(n_prompt - 1, n_prompt - 1 + len(target))
    return probs[rows, target]


def _check_result(res, lens, n_out):
    assert isinstance(res, LLMAttributionResult)
    n_layers = len(lens.layer_names)
    assert res.token_attr.shape == (n_out, n_layers)
    assert res.seq_attr.shape == (n_layers,)
    assert res.input_tokens == lens.layer_names
    assert len(res.output_tokens) == n_out
    assert res.output_probs.shape == (n_out,)
    assert torch.allclose(res.seq_attr, res.token_attr.sum(0), atol=TOL)
    iglens = res.iglens
    assert isinstance(iglens, IGLensResult)
    delta_p = iglens.model_prob[0] - iglens.base_prob[0]
    assert (res.token_attr.sum(1) - delta_p).abs().max() <= TOL
    assert torch.equal(res.output_probs, iglens.model_prob[0])


def test_string_target_teacher_forcing(llama3, lens, tokenizer):
    llm_attr = LLMLayerAttribution(lens, tokenizer)
    inp = TextTokenInput("a b c d", tokenizer)
    res = llm_attr.attribute(inp, target="x y z")
    _check_result(res, lens, 3)
    assert res.output_tokens == ["x", "y", "z"]
    target = torch.tensor([ord("x"), ord("y"), ord("z")])
    assert torch.equal(res.iglens.targets[0], target)
    prompt = inp.to_model_input()
    expected = _reference_probs(llama3, prompt, prompt.shape[1], target)
    assert torch.allclose(res.output_probs, expected, atol=TOL)
    # The attributed positions are those that predict each target token.
    n_prompt = prompt.shape[1]
    assert res.iglens.positions.tolist() == [n_prompt - 1, n_prompt, n_prompt + 1]


def test_tensor_target_and_template_input(llama3, lens, tokenizer):
    llm_attr = LLMLayerAttribution(lens, tokenizer)
    inp = TextTemplateInput("{} b {} d", ["a", "c"])
    target = torch.tensor([[ord("q"), ord("r")]])
    res = llm_attr.attribute(inp, target=target)
    _check_result(res, lens, 2)
    prompt = tokenizer.encode("a b c d", return_tensors="pt")
    expected = _reference_probs(llama3, prompt, prompt.shape[1], target[0])
    assert torch.allclose(res.output_probs, expected, atol=TOL)


def test_generated_target_is_greedy(llama3, lens, tokenizer):
    llm_attr = LLMLayerAttribution(lens, tokenizer)
    inp = TextTokenInput("a b c", tokenizer)
    res = llm_attr.attribute(inp, gen_args={"max_new_tokens": 4, "eos_token_id": None})
    _check_result(res, lens, 4)
    # Greedy generation: every output token is the model's argmax at its position.
    prompt = inp.to_model_input()
    generated = res.iglens.targets[0]
    with torch.no_grad():
        logits = llama3(torch.cat([prompt, generated[None]], dim=1)).logits[0]
    n = prompt.shape[1]
    assert torch.equal(logits[n - 1 : n - 1 + 4].argmax(-1), generated)
    expected = _reference_probs(llama3, prompt, n, generated)
    assert torch.allclose(res.output_probs, expected, atol=TOL)


def test_plot_token_attr_labels_layers(lens, tokenizer):
    res = LLMLayerAttribution(lens, tokenizer).attribute(
        TextTokenInput("a b", tokenizer), target="x y"
    )
    out = res.plot_token_attr()
    assert out is not None
    fig, ax = out
    try:
        assert [t.get_text() for t in ax.get_xticklabels()] == lens.layer_names
        assert ax.images[0].get_array().shape == (2, len(lens.layer_names))
    finally:
        plt.close(fig)
    fig, ax = res.plot_seq_attr()
    plt.close(fig)


def test_kwargs_reach_attribute_map(lens, tokenizer):
    llm_attr = LLMLayerAttribution(lens, tokenizer)
    inp = TextTokenInput("a b c", tokenizer)
    res = llm_attr.attribute(inp, target="x y", method="riemann_trapezoid", n_steps=5)
    assert res.iglens.method == "riemann_trapezoid"
    assert res.iglens.n_steps == 5
    # Captum's rules are approximate: the rows no longer sum exactly to Δp.
    exact = llm_attr.attribute(inp, target="x y")
    assert not torch.allclose(res.token_attr, exact.token_attr, atol=1e-7)
    with pytest.raises(TypeError, match="positions"):
        llm_attr.attribute(inp, target="x y", positions=[0])


def test_wrong_attr_method_and_inputs(llama3, lens, tokenizer):
    lig = LayerIntegratedGradients(llama3, model_parts(llama3).blocks[0])
    with pytest.raises(TypeError, match="attr_method"):
        LLMLayerAttribution(lig, tokenizer)
    with pytest.raises(TypeError, match="attr_method"):
        LLMLayerAttribution(llama3, tokenizer)
    llm_attr = LLMLayerAttribution(lens, tokenizer)
    with pytest.raises(TypeError, match="inp"):
        llm_attr.attribute("a b c", target="x")
    inp = TextTokenInput("a b c", tokenizer)
    with pytest.raises(ValueError, match="gen_args"):
        llm_attr.attribute(inp, target="x", gen_args={"max_new_tokens": 2})
    with pytest.raises(TypeError, match="target"):
        llm_attr.attribute(inp, target=[120])
    with pytest.raises(ValueError, match="target"):
        llm_attr.attribute(inp, target=torch.tensor([], dtype=torch.long))


def test_no_generate_raises_clearly(llama3, tokenizer):
    lens = LayerIGLens.from_model(llama3)
    blocks = model_parts(llama3).blocks
    plain = LayerIGLens(
        lambda ids: llama3(ids).logits,
        blocks,
        readout=lens.readout,
        layer_names=["a", "b", "c"],
    )
    llm_attr = LLMLayerAttribution(plain, tokenizer)
    inp = TextTokenInput("a b", tokenizer)
    with pytest.raises(ValueError, match="generate"):
        llm_attr.attribute(inp)
    # A target still works without a generating model.
    res = llm_attr.attribute(inp, target="x")
    assert res.input_tokens == ["a", "b", "c"]
    assert res.token_attr.shape == (1, 3)


def test_forward_func_is_hf_model(llama3, tokenizer):
    """LayerIGLens built on the HF model itself also generates."""
    ref = LayerIGLens.from_model(llama3)
    direct = LayerIGLens(llama3, model_parts(llama3).blocks, readout=ref.readout)
    llm_attr = LLMLayerAttribution(direct, tokenizer)
    assert llm_attr.model is llama3
    res = llm_attr.attribute(
        TextTokenInput("a b", tokenizer),
        gen_args={"max_new_tokens": 2, "eos_token_id": None},
    )
    assert res.token_attr.shape == (2, 3)
