r"""Tiny random Hugging Face causal LMs built from their configs, for tests.

Nothing is downloaded. Each model has 2 blocks, hidden size 32 and a vocabulary
of 128, is float32, in eval mode, and is built under a fixed seed without
touching the global RNG. Its final norm's weight (and bias) are randomized, so a
readout that applies the norm twice, or not at all, gives visibly wrong logits.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

VOCAB = 128
HIDDEN = 32

# Logits of order 1 to 10, so that softmax, softcapping and scaling all matter.
_COMMON: Dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
# Configs whose constructors do not take the common names.
_GPT2_NAMES = dict(n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=64)
_COMMON_NO_KV = {k: v for k, v in _COMMON.items() if k != "num_key_value_heads"}

# test id -> (model_type, config kwargs, path of the final norm or None).
# The norm paths are written out here, independently of the architecture table
# under test.
_SPECS: Dict[str, Tuple[str, Dict[str, Any], Optional[str]]] = {
    "llama": ("llama", _COMMON, "model.norm"),
    "mistral": ("mistral", _COMMON, "model.norm"),
    "qwen2": ("qwen2", _COMMON, "model.norm"),
    "qwen3": ("qwen3", dict(_COMMON, head_dim=8), "model.norm"),
    "gemma": ("gemma", dict(_COMMON, head_dim=8), "model.norm"),
    "gemma2": (
        "gemma2",
        dict(_COMMON, head_dim=8, final_logit_softcapping=2.0),
        "model.norm",
    ),
    "gemma3_text": (
        "gemma3_text",
        dict(_COMMON, head_dim=8, final_logit_softcapping=2.0),
        "model.norm",
    ),
    "gpt2": ("gpt2", dict(_COMMON_NO_KV, **_GPT2_NAMES), "transformer.ln_f"),
    "gpt_neox": ("gpt_neox", _COMMON_NO_KV, "gpt_neox.final_layer_norm"),
    "gptj": (
        "gptj",
        dict(_COMMON_NO_KV, rotary_dim=4, **_GPT2_NAMES),
        "transformer.ln_f",
    ),
    "opt": ("opt", dict(_COMMON_NO_KV, ffn_dim=64), "model.decoder.final_layer_norm"),
    "opt-project-out": (
        "opt",
        dict(_COMMON_NO_KV, ffn_dim=64, word_embed_proj_dim=16),
        "model.decoder.final_layer_norm",
    ),
    "opt-no-final-norm": (
        "opt",
        dict(_COMMON_NO_KV, ffn_dim=64, do_layer_norm_before=False),
        None,
    ),
    "phi": ("phi", _COMMON, "model.final_layernorm"),
    "phi3": ("phi3", _COMMON, "model.norm"),
    "falcon": ("falcon", _COMMON_NO_KV, "transformer.ln_f"),
    "bloom": ("bloom", dict(_COMMON_NO_KV, n_layer=2, n_head=4), "transformer.ln_f"),
    "stablelm": ("stablelm", _COMMON, "model.norm"),
    "cohere": ("cohere", dict(_COMMON, logit_scale=0.5), "model.norm"),
    "granite": ("granite", dict(_COMMON, logits_scaling=3.0), "model.norm"),
    "olmo": ("olmo", _COMMON, "model.norm"),
    "olmo2": ("olmo2", _COMMON, "model.norm"),
}

ARCHITECTURES: List[str] = list(_SPECS)
r"""Test ids: one per supported model_type, plus OPT variants."""


def final_norm_path(name: str) -> Optional[str]:
    r"""Returns the dotted path of the final norm of test model ``name``.

    Args:
        name (str): A test id from :data:`ARCHITECTURES`.

    Returns:
        **path** (str or None):
            E.g. ``"model.norm"``, or ``None`` for a model without a final norm.
    """
    return _SPECS[name][2]


def tiny_model(model_type: str, **config_overrides: Any) -> PreTrainedModel:
    r"""Builds a tiny random causal LM from its config.

    Args:
        model_type (str): A test id from :data:`ARCHITECTURES`: a
                    ``config.model_type`` such as ``"llama"``, or a variant
                    such as ``"opt-project-out"``.
        **config_overrides (Any): Config fields to change, e.g.
                    ``num_hidden_layers=3``.

    Returns:
        **model** (PreTrainedModel):
            The ``*ForCausalLM`` model, float32, in eval mode, with its final
            norm's weight (and bias) drawn at random.
    """
    if model_type not in _SPECS:
        raise ValueError(
            f"unknown tiny model {model_type!r}; choose from {', '.join(_SPECS)}"
        )
    hf_type, kwargs, norm_path = _SPECS[model_type]
    config = AutoConfig.for_model(hf_type, **dict(kwargs, **config_overrides))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if norm_path is not None:
            norm = model.get_submodule(norm_path)
            for name, param in norm.named_parameters():
                with torch.no_grad():
                    param.normal_(mean=1.0 if name == "weight" else 0.0, std=0.5)
    return model.eval()
