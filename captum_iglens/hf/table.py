r"""The architecture table: where the decoder blocks and the readout live in each
supported Hugging Face causal LM. Data only.

Each entry (:class:`Architecture`), keyed by ``model.config.model_type``, says
where the decoder blocks are, which modules sit between the last block and the
head (the final norm, plus any output projection), what kind of norm that is,
where the head is, and which transform the model applies to the head's output
(final-logit softcapping, logit scaling). Each built-in entry was read from the
architecture's ``modeling_<name>.py`` in transformers and is verified by the test
suite, on tiny models built from each config. Registration and lookup are in
:mod:`captum_iglens.hf.architectures`, probing in :mod:`captum_iglens.hf.probe`.
"""

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Tuple, Union

from torch import nn

from captum_iglens.readout.transforms import LogitDivide, LogitScale, Softcap

#: Kinds of final norm; ``"rms"`` scales only, ``"layer"`` also centres,
#: ``"none"`` where the model applies no final norm.
NORM_KINDS: Tuple[str, ...] = ("rms", "layer", "none")


def no_post(model: nn.Module) -> None:
    r"""The ``post`` of a model that applies no transform to its head's output."""
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
                    MLP), or a tuple of paths, one per block, where blocks of
                    different kinds differ; or ``None`` where the block adds
                    attention and MLP in parallel and no such state exists.
                    Default: none.
        norm_kind (str): One of :data:`NORM_KINDS`: ``"rms"`` or ``"layer"``
                    (the final norm also subtracts the mean). Read by DLA, which
                    freezes the norm's scale. Default: ``"rms"``.
        attn_out (Callable): From the model's config, the path inside each block
                    of the attention output projection (``nn.Linear`` or GPT-2's
                    ``Conv1D``), whose input is the heads' outputs side by side
                    and whose output the block adds to the stream (times
                    ``attn_scale``, through ``attn_norm`` where set, beside
                    ``parallel_mlp`` where set); ``None`` where no such split
                    exists (hybrid recurrent blocks, a block that normalises the
                    stream itself). Needed for ``granularity="head"``.
                    Default: none.
        attn_scale (Callable): From the config, the factor the block applies
                    to the attention output before adding it (Granite's
                    ``residual_multiplier``). Default: 1.
        attn_norm (Callable): From the config, the path inside each block of
                    the RMSNorm the block applies to the attention output
                    projection's output before adding it to the stream (Gemma
                    2/3/4, OLMo 2/3: a post-norm), or ``None``. With
                    ``attn_out``, the head split scales each head's output by
                    the norm's factor of the real forward. Default: none.
        parallel_mlp (Callable): From the config, the path inside each block of
                    the MLP whose output the block adds beside the attention
                    output, both computed from the block's input (GPT-J, Phi,
                    Cohere, parallel Falcon/GPT-NeoX/StableLM), or ``None`` for a
                    sequential block. With ``attn_out``, the heads and the MLP
                    split the block's one segment. Default: none.
        mlp_out (Callable): From the config, the path inside each block of the
                    MLP's output projection (``nn.Linear`` or ``Conv1D``),
                    whose input is the neurons' activations and whose output
                    (times ``attn_scale``, through ``mlp_norm`` where set) the
                    block adds after ``mid``; ``None`` where the MLP is a
                    mixture of experts or the block is parallel. Needed for
                    ``granularity="neuron"``. Default: none.
        mlp_norm (Callable): From the config, the path inside each block of the
                    RMSNorm applied to the MLP's output before it is added
                    (Gemma 2/3, OLMo 2/3), or ``None``. Default: none.
        experts (Callable): From the config, the path inside each block of the
                    routed experts module of a mixture-of-experts MLP, called as
                    ``experts(x, top_k_index, top_k_weights)`` and returning
                    ``Σ_e g_e expert_e(x)``, whose sum (plus any shared experts)
                    the block adds after ``mid``; or ``None``. Needed for
                    ``granularity="expert"``. Default: none.
        shared_experts (Callable): From the config, whether the MoE MLP adds
                    shared experts beside the routed ones. Default: False.
    """

    layers: str
    norm: Tuple[str, ...]
    head: Tuple[str, ...] = ("lm_head",)
    post: Callable[[nn.Module], Optional[nn.Module]] = no_post
    mid: Callable[[Any], Union[None, str, Tuple[str, ...]]] = lambda config: None
    norm_kind: str = "rms"
    attn_out: Callable[[Any], Optional[str]] = lambda config: None
    attn_scale: Callable[[Any], float] = lambda config: 1.0
    attn_norm: Callable[[Any], Optional[str]] = lambda config: None
    parallel_mlp: Callable[[Any], Optional[str]] = lambda config: None
    mlp_out: Callable[[Any], Optional[str]] = lambda config: None
    mlp_norm: Callable[[Any], Optional[str]] = lambda config: None
    experts: Callable[[Any], Optional[str]] = lambda config: None
    shared_experts: Callable[[Any], bool] = lambda config: False

    def __post_init__(self) -> None:
        if not isinstance(self.layers, str) or not self.layers:
            raise ValueError(f"layers: expected a dotted path, got {self.layers!r}")
        for name in ("norm", "head"):
            paths = getattr(self, name)
            if not isinstance(paths, tuple) or not all(
                isinstance(p, str) and p for p in paths
            ):
                raise ValueError(
                    f"{name}: expected a tuple of dotted paths, got {paths!r}"
                )
        if not self.head:
            raise ValueError("head: expected at least one dotted path")
        for name in (
            "post",
            "mid",
            "attn_out",
            "attn_scale",
            "attn_norm",
            "parallel_mlp",
            "mlp_out",
            "mlp_norm",
            "experts",
            "shared_experts",
        ):
            if not callable(getattr(self, name)):
                raise TypeError(f"{name}: expected a callable")
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(
                f"norm_kind: expected one of {list(NORM_KINDS)}, got {self.norm_kind!r}"
            )


def in_block(
    path: str, *, parallel_if: Callable[[Any], bool] = lambda c: False
) -> Callable[[Any], Optional[str]]:
    r"""A block-relative module ``path``, for ``Architecture.mid`` or ``attn_out``,
    unless the config makes the block parallel (then None)."""
    return lambda config: None if parallel_if(config) else path


def parallel_in_block(
    path: str, *, parallel_if: Callable[[Any], bool] = lambda c: True
) -> Callable[[Any], Optional[str]]:
    r"""A block-relative module ``path``, for ``Architecture.parallel_mlp``, where
    the config makes the block parallel (else None)."""
    return lambda config: path if parallel_if(config) else None


# The final transforms read attributes of a Hugging Face model (duck-typed: Any).
def _softcap_from_config(model: Any) -> Optional[nn.Module]:
    r"""``Softcap(config.final_logit_softcapping)``, where set."""
    cap = model.config.final_logit_softcapping
    return None if cap is None else Softcap(cap)


def _cohere_logit_scale(model: Any) -> nn.Module:
    r"""``LogitScale(model.logit_scale)``."""
    # CohereForCausalLM.forward multiplies by its own copy of config.logit_scale.
    return LogitScale(model.logit_scale)


def _granite_logits_scaling(model: Any) -> nn.Module:
    r"""``LogitDivide(config.logits_scaling)``."""
    return LogitDivide(model.config.logits_scaling)


def _falcon_h1_multiplier(model: Any) -> nn.Module:
    r"""``LogitScale(model.model.lm_head_multiplier)``."""
    # FalconH1ForCausalLM.forward: lm_head(h) * model.model.lm_head_multiplier.
    return LogitScale(model.model.lm_head_multiplier)


_POST_ATTENTION_NORM = in_block("post_attention_layernorm")
_O_PROJ = in_block("self_attn.o_proj")
_DOWN_PROJ = in_block("mlp.down_proj")
_POST_FEEDFORWARD_NORM = in_block("post_feedforward_layernorm")
_LLAMA_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    mid=_POST_ATTENTION_NORM,
    attn_out=_O_PROJ,
)
# Gemma 2/3/4 normalise the attention output before adding it (an RMSNorm:
# the heads are split with the norm's per-position factor).
_GEMMA2_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    post=_softcap_from_config,
    mid=in_block("pre_feedforward_layernorm"),
    attn_out=_O_PROJ,
    attn_norm=_POST_ATTENTION_NORM,
    mlp_out=_DOWN_PROJ,
    mlp_norm=_POST_FEEDFORWARD_NORM,
)

_OLMO2_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    mid=in_block("mlp"),
    attn_out=_O_PROJ,
    attn_norm=_POST_ATTENTION_NORM,
    mlp_out=_DOWN_PROJ,
    mlp_norm=_POST_FEEDFORWARD_NORM,
)
# Dense Llama-like MLPs: down_proj(act(gate_proj(x)) * up_proj(x)).
_LLAMA_DENSE = replace(_LLAMA_LIKE, mlp_out=_DOWN_PROJ)
# Llama-like blocks whose MLP is a mixture of experts, mlp.experts(x, index, g).
_LLAMA_MOE = replace(_LLAMA_LIKE, experts=in_block("mlp.experts"))

_LAYER_NORM: Dict[str, Any] = dict(norm_kind="layer")
_GRANITE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    post=_granite_logits_scaling,
    mid=_POST_ATTENTION_NORM,
    attn_out=_O_PROJ,
    attn_scale=lambda c: c.residual_multiplier,
)
# Hybrid blocks (linear attention or Mamba, then the MLP) have no attention
# output projection in every block: no head split.
_LLAMA_LIKE_HYBRID = replace(_LLAMA_LIKE, attn_out=lambda config: None)

#: The built-in entries, by ``config.model_type``; the test suite verifies each.
BUILT_IN: Dict[str, Architecture] = {
    "llama": _LLAMA_DENSE,
    "mistral": _LLAMA_DENSE,
    "qwen2": _LLAMA_DENSE,
    "qwen3": _LLAMA_DENSE,
    "gemma": _LLAMA_DENSE,
    "gemma2": _GEMMA2_LIKE,
    "gemma3_text": _GEMMA2_LIKE,
    "gpt2": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid=in_block("ln_2", parallel_if=lambda c: c.add_cross_attention),
        attn_out=in_block("attn.c_proj", parallel_if=lambda c: c.add_cross_attention),
        mlp_out=in_block("mlp.c_proj", parallel_if=lambda c: c.add_cross_attention),
    ),
    # transformers 5 renamed GPT-NeoX's head from ``embed_out`` to ``lm_head``.
    "gpt_neox": Architecture(
        **_LAYER_NORM,
        layers="gpt_neox.layers",
        norm=("gpt_neox.final_layer_norm",),
        head=("lm_head", "embed_out"),
        mid=in_block(
            "post_attention_layernorm",
            parallel_if=lambda c: c.use_parallel_residual,
        ),
        attn_out=in_block("attention.dense"),
        parallel_mlp=parallel_in_block(
            "mlp", parallel_if=lambda c: c.use_parallel_residual
        ),
        mlp_out=in_block(
            "mlp.dense_4h_to_h", parallel_if=lambda c: c.use_parallel_residual
        ),
    ),
    "gptj": Architecture(
        layers="transformer.h",
        norm=("transformer.ln_f",),
        attn_out=in_block("attn.out_proj"),
        parallel_mlp=parallel_in_block("mlp"),
        **_LAYER_NORM,
    ),
    "opt": Architecture(
        **_LAYER_NORM,
        layers="model.decoder.layers",
        norm=("model.decoder.final_layer_norm", "model.decoder.project_out"),
        # Post-norm OPT normalises the stream after attention: no plain h_mid.
        mid=in_block(
            "final_layer_norm", parallel_if=lambda c: not c.do_layer_norm_before
        ),
        attn_out=in_block(
            "self_attn.out_proj", parallel_if=lambda c: not c.do_layer_norm_before
        ),
        mlp_out=in_block("fc2", parallel_if=lambda c: not c.do_layer_norm_before),
    ),
    "phi": Architecture(
        layers="model.layers",
        norm=("model.final_layernorm",),
        attn_out=in_block("self_attn.dense"),
        parallel_mlp=parallel_in_block("mlp"),
        **_LAYER_NORM,
    ),
    "phi3": _LLAMA_DENSE,
    "falcon": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid=in_block(
            "post_attention_layernorm",
            parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture,
        ),
        attn_out=in_block("self_attention.dense"),
        parallel_mlp=parallel_in_block(
            "mlp", parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture
        ),
        mlp_out=in_block(
            "mlp.dense_4h_to_h",
            parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture,
        ),
    ),
    "bloom": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        # With the residual taken after the norm, the stream is not h + attn.
        mid=in_block(
            "post_attention_layernorm",
            parallel_if=lambda c: c.apply_residual_connection_post_layernorm,
        ),
        # The slow exact path of pretraining_tp > 1 never calls `dense`.
        attn_out=in_block(
            "self_attention.dense",
            parallel_if=lambda c: (
                c.apply_residual_connection_post_layernorm
                or (c.pretraining_tp > 1 and c.slow_but_exact)
            ),
        ),
        mlp_out=in_block(
            "mlp.dense_4h_to_h",
            parallel_if=lambda c: (
                c.apply_residual_connection_post_layernorm
                or (c.pretraining_tp > 1 and c.slow_but_exact)
            ),
        ),
    ),
    "stablelm": Architecture(
        **_LAYER_NORM,
        layers="model.layers",
        norm=("model.norm",),
        mid=in_block(
            "post_attention_layernorm",
            parallel_if=lambda c: c.use_parallel_residual,
        ),
        attn_out=_O_PROJ,
        parallel_mlp=parallel_in_block(
            "mlp", parallel_if=lambda c: c.use_parallel_residual
        ),
        mlp_out=in_block(
            "mlp.down_proj", parallel_if=lambda c: c.use_parallel_residual
        ),
    ),
    "cohere": Architecture(
        **_LAYER_NORM,
        layers="model.layers",
        norm=("model.norm",),
        post=_cohere_logit_scale,
        attn_out=_O_PROJ,
        parallel_mlp=parallel_in_block("mlp"),
    ),
    "granite": replace(_GRANITE, mlp_out=_DOWN_PROJ),
    # OLMo's final norm is a parameter-free LayerNorm.
    "olmo": Architecture(
        layers="model.layers",
        norm=("model.norm",),
        mid=_POST_ATTENTION_NORM,
        attn_out=_O_PROJ,
        **_LAYER_NORM,
        mlp_out=_DOWN_PROJ,
    ),
    # OLMo2 normalises the attention output before adding it (an RMSNorm: the
    # heads are split with its per-position factor); the MLP reads the stream.
    "olmo2": _OLMO2_LIKE,
    # Current families. A mixture-of-experts layer is the block's MLP: the block
    # stays a residual block, and the mid-block state is the MLP's input.
    "llama4_text": _LLAMA_LIKE,
    "qwen3_5_text": _LLAMA_LIKE_HYBRID,  # Gated DeltaNet or attention, then MLP
    "qwen3_5_moe_text": _LLAMA_LIKE_HYBRID,
    "qwen3_moe": _LLAMA_MOE,
    "qwen3_next": _LLAMA_LIKE_HYBRID,  # Gated DeltaNet or attention, then experts
    "qwen2_moe": replace(_LLAMA_MOE, shared_experts=lambda config: True),
    "mixtral": _LLAMA_MOE,
    "olmoe": _LLAMA_MOE,
    "smollm3": _LLAMA_DENSE,
    "gpt_oss": _LLAMA_LIKE,
    "deepseek_v3": _LLAMA_LIKE,
    "glm4_moe": _LLAMA_LIKE,
    "phimoe": Architecture(
        layers="model.layers",
        norm=("model.norm",),
        mid=_POST_ATTENTION_NORM,
        attn_out=_O_PROJ,
        **_LAYER_NORM,
        experts=in_block("mlp.experts"),
    ),
    "granitemoe": _GRANITE,
    "granitemoeshared": _GRANITE,
    # Mamba-2 or attention, then experts.
    "granitemoehybrid": replace(_GRANITE, attn_out=lambda config: None),
    "olmo3": _OLMO2_LIKE,
    # Gemma 4 scales the whole stream by layer_scalar after its MLP (and may add
    # per-layer inputs and experts): no neuron split.
    "gemma4_text": replace(
        _GEMMA2_LIKE, mlp_out=lambda config: None, mlp_norm=lambda config: None
    ),
    # Hybrid recurrent: a Mamba mixer (or attention), then the MLP or experts.
    "jamba": Architecture(
        layers="model.layers",
        norm=("model.final_layernorm",),
        mid=in_block("pre_ff_layernorm"),
    ),
    # Mamba-2 and attention in parallel, then the MLP; the head's output is
    # multiplied by lm_head_multiplier.
    "falcon_h1": Architecture(
        layers="model.layers",
        norm=("model.final_layernorm",),
        post=_falcon_h1_multiplier,
        mid=in_block("pre_ff_layernorm"),
    ),
    # Its attention blocks normalise the attention output (OLMo 2 style: the MLP
    # reads h_mid) and its Gated DeltaNet blocks are pre-norm: one path per block.
    "olmo_hybrid": Architecture(
        layers="model.layers",
        norm=("model.norm",),
        mid=lambda config: tuple(
            "mlp" if kind == "full_attention" else "post_attention_layernorm"
            for kind in config.layer_types
        ),
    ),
}

#: Model types that cannot be read out by a final norm and head applied to one
#: residual stream, with the reason. Neither the table nor the probe takes them.
REFUSED: Dict[str, str] = dict.fromkeys(
    ("gemma3n", "gemma3n_text"),
    "Gemma 3n's blocks pass a stack of AltUp predictions (altup_num_inputs "
    "streams) from block to block, and the model mixes them through "
    "altup_unembed_projections before its final norm: no single residual "
    "stream is read out by the final norm and head, so IG-Lens's path does not "
    "exist",
)
