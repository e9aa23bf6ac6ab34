r"""Hugging Face causal LMs: the architecture table and registry, the parts of a
model bound once, the model forward, text in and out, and the embedded models.
Nothing here imports the attribution."""

from captum_iglens.hf.architectures import (
    architecture,
    model_parts,
    register_architecture,
    supported_model_types,
    unregister_architecture,
)
from captum_iglens.hf.forward import (
    CausalLMForward,
    causal_lm_logits,
    position_ids_from_mask,
)
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.table import Architecture
from captum_iglens.hf.text import (
    encode_answer,
    encode_prompt,
    generate,
    left_pad,
    pad_token_id,
    stop_token_ids,
    teacher_forcing,
)

__all__ = [
    "architecture",
    "Architecture",
    "CausalLMForward",
    "causal_lm_logits",
    "encode_answer",
    "encode_prompt",
    "generate",
    "left_pad",
    "model_parts",
    "ModelParts",
    "pad_token_id",
    "position_ids_from_mask",
    "register_architecture",
    "stop_token_ids",
    "supported_model_types",
    "teacher_forcing",
    "unregister_architecture",
]
