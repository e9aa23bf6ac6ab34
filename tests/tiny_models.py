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
# Mixture of experts: 4 experts, 2 chosen per token, under either name.
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MOE_LOCAL = dict(num_local_experts=4, num_experts_per_tok=2)
# DeepSeek-style routing; block 0 dense, block 1 routed.
_ROUTED = dict(
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
)
# Multi-head latent attention (DeepSeek-V3): one key-value head per head.
_MLA = dict(
    _ROUTED,
    num_key_value_heads=4,
    n_shared_experts=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=4,
    v_head_dim=8,
)
# Linear-attention (Gated DeltaNet) sizes.
_LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)
# Gated DeltaNet in block 0, attention in block 1 (Qwen 3.5 and Qwen 3 Next).
_DELTANET = dict(
    head_dim=8, layer_types=["linear_attention", "full_attention"], **_LINEAR
)
# Mamba-2 mixer sizes.
_MAMBA2 = dict(
    mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64, mamba_d_state=8, mamba_n_groups=1
)

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
    # Current families; mixture-of-experts layers with 4 experts, 2 per token.
    "llama4_text": (
        "llama4_text",
        dict(_COMMON, head_dim=8, intermediate_size_mlp=64, **_MOE_LOCAL),
        "model.norm",
    ),
    "qwen3_5_text": ("qwen3_5_text", dict(_COMMON, **_DELTANET), "model.norm"),
    "qwen3_5_moe_text": (
        "qwen3_5_moe_text",
        dict(_COMMON, shared_expert_intermediate_size=32, **_MOE, **_DELTANET),
        "model.norm",
    ),
    "qwen3_moe": ("qwen3_moe", dict(_COMMON, head_dim=8, **_MOE), "model.norm"),
    # Smaller weights: its logits reach 9 at 0.2, where chunked and unchunked
    # readouts differ by more than 1e-6 in probability.
    "qwen3_next": (
        "qwen3_next",
        dict(
            _COMMON,
            initializer_range=0.1,
            shared_expert_intermediate_size=32,
            **_MOE,
            **_DELTANET,
        ),
        "model.norm",
    ),
    "qwen2_moe": (
        "qwen2_moe",
        dict(_COMMON, shared_expert_intermediate_size=32, **_MOE),
        "model.norm",
    ),
    "mixtral": ("mixtral", dict(_COMMON, **_MOE_LOCAL), "model.norm"),
    "olmoe": ("olmoe", dict(_COMMON, **_MOE), "model.norm"),
    "smollm3": ("smollm3", _COMMON, "model.norm"),
    "gpt_oss": ("gpt_oss", dict(_COMMON, head_dim=8, **_MOE_LOCAL), "model.norm"),
    "deepseek_v3": ("deepseek_v3", {**_COMMON, **_MLA}, "model.norm"),
    "glm4_moe": (
        "glm4_moe",
        dict(_COMMON, head_dim=8, **_ROUTED, n_shared_experts=1),
        "model.norm",
    ),
    "phimoe": ("phimoe", dict(_COMMON, **_MOE_LOCAL), "model.norm"),
    "granitemoe": (
        "granitemoe",
        dict(_COMMON, logits_scaling=3.0, **_MOE_LOCAL),
        "model.norm",
    ),
    "granitemoeshared": (
        "granitemoeshared",
        dict(_COMMON, logits_scaling=3.0, shared_intermediate_size=32, **_MOE_LOCAL),
        "model.norm",
    ),
    "granitemoehybrid": (
        "granitemoehybrid",
        dict(
            _COMMON,
            logits_scaling=3.0,
            shared_intermediate_size=32,
            layer_types=["mamba", "attention"],
            **_MAMBA2,
            **_MOE_LOCAL,
        ),
        "model.norm",
    ),
    "olmo3": ("olmo3", _COMMON, "model.norm"),
    "gemma4_text": (
        "gemma4_text",
        dict(_COMMON, head_dim=8, final_logit_softcapping=2.0),
        "model.norm",
    ),
    "jamba": (
        "jamba",
        dict(
            _COMMON,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=4,
            num_experts_per_tok=2,
            use_mamba_kernels=False,
            mamba_d_state=8,
            mamba_dt_rank=4,
        ),
        "model.final_layernorm",
    ),
    "falcon_h1": (
        "falcon_h1",
        dict(_COMMON, lm_head_multiplier=0.7, **_MAMBA2),
        "model.final_layernorm",
    ),
    "olmo_hybrid": (
        "olmo_hybrid",
        dict(_COMMON, layer_types=["linear_attention", "full_attention"], **_LINEAR),
        "model.norm",
    ),
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


def tiny_tokenizer() -> Any:
    r"""A word-level tokenizer over the tiny models' vocabulary, built in memory.

    Returns:
        **tokenizer** (PreTrainedTokenizerFast):
            Token ``i`` is the word ``"t{i}"``; ``t0`` pads, ``t1`` and ``t2``
            are BOS and EOS, ``t3`` is unknown.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(
        models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3")
    )
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=words,
        bos_token="t1",
        eos_token="t2",
        pad_token="t0",
        unk_token="t3",
        # TransformerLens rebuilds tokenizers from these unless BOS is on.
        name_or_path="tiny",
        add_bos_token=True,
    )
