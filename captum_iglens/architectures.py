r"""Where the decoder blocks and the readout live in Hugging Face causal LMs.

One explicit table, keyed by ``model.config.model_type``, says for each supported
architecture where the decoder blocks are, which modules sit between the last
block and the head (the final norm, plus any output projection), where the head
is, and which transform the model applies to the head's output (final-logit
softcapping, logit scaling). Each entry was read from the architecture's
``modeling_<name>.py`` in transformers. An architecture that is not in the table
raises :class:`ValueError`; nothing is guessed.
"""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, List, Mapping, Optional, Tuple

from torch import Tensor, nn

from captum_iglens.readout import LogitDivide, LogitScale, Softcap

_MISSING = object()


def _no_post(model: nn.Module) -> None:
    return None


@dataclass(frozen=True)
class Architecture:
    r"""Module paths of one architecture, relative to its ``*ForCausalLM`` class.

    Args:
        layers (str): Dotted path of the ``nn.ModuleList`` of decoder blocks.
        norm (tuple of str): Dotted paths of the modules the model applies, in
                    this order, between the last block and the head. A path
                    whose attribute is ``None`` is skipped, as the model skips
                    it (OPT without a final norm or without ``project_out``).
        head (tuple of str): Accepted dotted paths of the head; exactly one
                    must exist. More than one only where transformers renamed
                    the attribute between versions.
        post (Callable): Builds the transform the model applies to the head's
                    output from the model, or returns ``None`` when it applies
                    none. Default: no transform.
        mid (Callable): From the model's config, the path inside each block of
                    the module whose input is the mid-block residual state
                    ``h + attn(...)`` (the stream after attention, before the
                    MLP), or ``None`` where the block adds attention and MLP in
                    parallel and no such state exists. Default: none.
    """

    layers: str
    norm: Tuple[str, ...]
    head: Tuple[str, ...] = ("lm_head",)
    post: Callable[[nn.Module], Optional[nn.Module]] = _no_post
    mid: Callable[[Any], Optional[str]] = lambda config: None


def _mid(path: str, *, parallel_if: Callable[[Any], bool] = lambda c: False):
    """Mid-block module ``path``, unless the config makes the block parallel."""
    return lambda config: None if parallel_if(config) else path


def _softcap_from_config(model: nn.Module) -> Optional[nn.Module]:
    cap = model.config.final_logit_softcapping
    return None if cap is None else Softcap(cap)


def _cohere_logit_scale(model: nn.Module) -> nn.Module:
    # CohereForCausalLM.forward multiplies by its own copy of config.logit_scale.
    return LogitScale(model.logit_scale)


def _granite_logits_scaling(model: nn.Module) -> nn.Module:
    return LogitDivide(model.config.logits_scaling)


_POST_ATTENTION_NORM = _mid("post_attention_layernorm")
_LLAMA_LIKE = Architecture(
    layers="model.layers", norm=("model.norm",), mid=_POST_ATTENTION_NORM
)
_GEMMA2_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    post=_softcap_from_config,
    mid=_mid("pre_feedforward_layernorm"),
)

ARCHITECTURE_TABLE: Mapping[str, Architecture] = MappingProxyType(
    {
        "llama": _LLAMA_LIKE,
        "mistral": _LLAMA_LIKE,
        "qwen2": _LLAMA_LIKE,
        "qwen3": _LLAMA_LIKE,
        "gemma": _LLAMA_LIKE,
        "gemma2": _GEMMA2_LIKE,
        "gemma3_text": _GEMMA2_LIKE,
        "gpt2": Architecture(
            layers="transformer.h",
            norm=("transformer.ln_f",),
            mid=_mid("ln_2", parallel_if=lambda c: c.add_cross_attention),
        ),
        # transformers 5 renamed GPT-NeoX's head from ``embed_out`` to ``lm_head``.
        "gpt_neox": Architecture(
            layers="gpt_neox.layers",
            norm=("gpt_neox.final_layer_norm",),
            head=("lm_head", "embed_out"),
            mid=_mid(
                "post_attention_layernorm",
                parallel_if=lambda c: c.use_parallel_residual,
            ),
        ),
        "gptj": Architecture(layers="transformer.h", norm=("transformer.ln_f",)),
        "opt": Architecture(
            layers="model.decoder.layers",
            norm=("model.decoder.final_layer_norm", "model.decoder.project_out"),
            # Post-norm OPT normalises the stream after attention: no plain h_mid.
            mid=_mid(
                "final_layer_norm", parallel_if=lambda c: not c.do_layer_norm_before
            ),
        ),
        "phi": Architecture(layers="model.layers", norm=("model.final_layernorm",)),
        "phi3": _LLAMA_LIKE,
        "falcon": Architecture(
            layers="transformer.h",
            norm=("transformer.ln_f",),
            mid=_mid(
                "post_attention_layernorm",
                parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture,
            ),
        ),
        "bloom": Architecture(
            layers="transformer.h",
            norm=("transformer.ln_f",),
            # With the residual taken after the norm, the stream is not h + attn.
            mid=_mid(
                "post_attention_layernorm",
                parallel_if=lambda c: c.apply_residual_connection_post_layernorm,
            ),
        ),
        "stablelm": Architecture(
            layers="model.layers",
            norm=("model.norm",),
            mid=_mid(
                "post_attention_layernorm",
                parallel_if=lambda c: c.use_parallel_residual,
            ),
        ),
        "cohere": Architecture(
            layers="model.layers", norm=("model.norm",), post=_cohere_logit_scale
        ),
        "granite": Architecture(
            layers="model.layers",
            norm=("model.norm",),
            post=_granite_logits_scaling,
            mid=_POST_ATTENTION_NORM,
        ),
        "olmo": _LLAMA_LIKE,
        # OLMo2 normalises the attention output before adding it; the MLP reads
        # the stream itself.
        "olmo2": Architecture(
            layers="model.layers", norm=("model.norm",), mid=_mid("mlp")
        ),
    }
)
r"""The supported architectures, keyed by ``model.config.model_type``."""


def _architecture(model: nn.Module) -> Architecture:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURE_TABLE:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}) is not a supported "
            f"architecture; supported model types: "
            f"{', '.join(sorted(ARCHITECTURE_TABLE))}. Build the readout by hand, "
            "Readout(head=..., norm=..., post=...), with the exact modules the "
            "model applies after its last block, and pass layer= explicitly."
        )
    return ARCHITECTURE_TABLE[model_type]


def _lookup(model: nn.Module, path: str) -> object:
    obj: object = model
    for name in path.split("."):
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _resolve(model: nn.Module, path: str) -> Optional[nn.Module]:
    obj = _lookup(model, path)
    if obj is _MISSING:
        raise ValueError(
            f"{type(model).__name__} (model_type={model.config.model_type!r}) "
            f"has no attribute {path!r}, where the architecture table expects "
            "it. Load the model with AutoModelForCausalLM, or build "
            "Readout(head=..., norm=..., post=...) by hand and pass layer= "
            "explicitly."
        )
    return obj


def decoder_layers(model: nn.Module) -> List[nn.Module]:
    r"""Returns the decoder blocks of a supported Hugging Face causal LM.

    Args:
        model (nn.Module): A ``*ForCausalLM`` model whose ``config.model_type``
                    is in :data:`ARCHITECTURE_TABLE`.

    Returns:
        **layers** (list of nn.Module):
            The model's own decoder blocks in execution order; the last one's
            output is the input of the readout.

    Raises:
        ValueError: If the model type is not supported or the model lacks the
            attribute the table names.
    """
    return list(_resolve(model, _architecture(model).layers))


def mid_block_modules(
    model: nn.Module, blocks: List[nn.Module]
) -> Optional[List[nn.Module]]:
    r"""Returns, for each block, the module whose input is the mid-block state.

    The mid-block state ``h_mid = h + attn(...)`` is the residual stream after a
    block's attention and before its MLP. It exists only where the block adds
    the two in sequence.

    Args:
        model (nn.Module): A ``*ForCausalLM`` model whose ``config.model_type``
                    is in :data:`ARCHITECTURE_TABLE`.
        blocks (list of nn.Module): Decoder blocks of ``model``.

    Returns:
        **modules** (list of nn.Module or None):
            One module per block (a forward pre-hook on it sees ``h_mid``), or
            ``None`` where the architecture (as configured) adds attention and MLP
            in parallel: GPT-J, Phi, Cohere, parallel Falcon, GPT-NeoX and StableLM
            with ``use_parallel_residual``, post-norm OPT, Bloom with the residual
            after the norm.
    """
    path = _architecture(model).mid(model.config)
    if path is None:
        return None
    modules = [_lookup(block, path) for block in blocks]
    if any(not isinstance(m, nn.Module) for m in modules):
        raise ValueError(
            f"{type(model).__name__}: a decoder block has no module {path!r}, where "
            "the architecture table expects the mid-block state"
        )
    return modules


def readout_parts(
    model: nn.Module,
) -> Tuple[Optional[nn.Module], nn.Module, Optional[nn.Module]]:
    r"""Returns the modules the model applies between its last block and its logits.

    The logits are ``post(head(norm(h)))`` for the last block's output ``h``. The
    modules are the model's own (no copies), except ``post``, which is a new
    parameter-free transform, and an ``nn.Sequential`` that chains the model's
    final norm and output projection where it has both (OPT with
    ``word_embed_proj_dim != hidden_size``).

    Args:
        model (nn.Module): A ``*ForCausalLM`` model whose ``config.model_type``
                    is in :data:`ARCHITECTURE_TABLE`.

    Returns:
        3-element tuple of **norm**, **head**, **post**:
        - **norm** (nn.Module or None):
            The final norm (and output projection), or ``None`` if the model
            applies none.
        - **head** (nn.Module):
            The unembedding, mapping ``(..., d)`` to ``(..., V)`` logits.
        - **post** (nn.Module or None):
            The transform of the head's output (:class:`Softcap`,
            :class:`LogitScale`, :class:`LogitDivide`), or ``None``.

    Raises:
        ValueError: If the model type is not supported or the model lacks an
            attribute the table names.
    """
    arch = _architecture(model)
    norms = [m for m in (_resolve(model, p) for p in arch.norm) if m is not None]
    if not norms:
        norm = None
    elif len(norms) == 1:
        norm = norms[0]
    else:
        norm = nn.Sequential(*norms)
    heads = [p for p in arch.head if _lookup(model, p) is not _MISSING]
    if len(heads) != 1:
        raise ValueError(
            f"{type(model).__name__} (model_type={model.config.model_type!r}) must "
            f"have exactly one of the head attributes {arch.head}; found "
            f"{heads or 'none'}. Load the model with AutoModelForCausalLM, or "
            "build Readout(head=..., norm=..., post=...) by hand and pass layer= "
            "explicitly."
        )
    return norm, _resolve(model, heads[0]), arch.post(model)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    r"""Position ids counted from each sequence's first real token, as ``generate``
    counts them, so that a left-padded sequence is read as if it were alone.

    Args:
        attention_mask (Tensor): ``(B, T)``, ones at real tokens.

    Returns:
        **position_ids** (Tensor): ``(B, T)`` long; 0 at the padding.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class CausalLMForward(nn.Module):
    r"""
    Calls a Hugging Face causal LM the way Captum calls a forward function:
    positionally, ``(input_ids, attention_mask=None)``, returning logits
    ``(B, T, V)``. With an attention mask, position ids are counted from each
    sequence's first real token, as ``generate`` does, so a left-padded sequence
    gets the same logits as the same sequence alone.

    Args:

        model (transformers.PreTrainedModel): The causal LM.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Optional[Tensor] = None
    ) -> Tensor:
        position_ids = (
            None if attention_mask is None else position_ids_from_mask(attention_mask)
        )
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).logits
