r"""Hugging Face causal LMs: the architecture table and registry, the parts of a
model bound once, the model forward, text in and out, and the embedded models.
Nothing here imports the attribution."""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
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

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "architecture": "captum_iglens.hf.architectures",
        "model_parts": "captum_iglens.hf.architectures",
        "register_architecture": "captum_iglens.hf.architectures",
        "supported_model_types": "captum_iglens.hf.architectures",
        "unregister_architecture": "captum_iglens.hf.architectures",
        "CausalLMForward": "captum_iglens.hf.forward",
        "causal_lm_logits": "captum_iglens.hf.forward",
        "position_ids_from_mask": "captum_iglens.hf.forward",
        "ModelParts": "captum_iglens.hf.parts",
        "Architecture": "captum_iglens.hf.table",
        "encode_answer": "captum_iglens.hf.text",
        "encode_prompt": "captum_iglens.hf.text",
        "generate": "captum_iglens.hf.text",
        "left_pad": "captum_iglens.hf.text",
        "pad_token_id": "captum_iglens.hf.text",
        "stop_token_ids": "captum_iglens.hf.text",
        "teacher_forcing": "captum_iglens.hf.text",
    },
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
