r"""Where the decoder blocks and the readout live in Hugging Face causal LMs.

One explicit registry, keyed by ``model.config.model_type``, says for each
supported architecture where the decoder blocks are, which modules sit between
the last block and the head (the final norm, plus any output projection), what
kind of norm that is, where the head is, and which transform the model applies
to the head's output (final-logit softcapping, logit scaling). Each built-in
entry was read from the architecture's ``modeling_<name>.py`` in transformers;
users add their own with :func:`register_architecture`. A model type that is
neither built in nor registered is probed (:mod:`captum_iglens.hf.probe`): its
parts are proposed from the module tree and used only once a real forward shows
that they reproduce the model's logits; otherwise :class:`ValueError` says how
to register it. User entries are verified the same way on first use. Built-in
entries are verified by the test suite, on tiny models built from each config.
"""

import operator
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from captum_iglens.hf.probe import (
    last_outputs_and_logits,
    measured_norm_kind,
    propose_parts,
    readout_error,
    register_hint,
    tolerance,
)
from captum_iglens.readout.transforms import LogitDivide, LogitScale, Softcap

#: Kinds of final norm: ``"rms"`` scales only, ``"layer"`` also centres,
#: ``"none"`` where the model applies no final norm.
NORM_KINDS: Tuple[str, ...] = ("rms", "layer", "none")

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
                    and whose output (times ``attn_scale``) the block adds to the
                    stream unchanged; ``None`` where no such split exists
                    (parallel blocks, a norm on the attention output). Needed for
                    ``granularity="head"``. Default: none.
        attn_scale (Callable): From the config, the factor the block applies
                    to the attention output before adding it (Granite's
                    ``residual_multiplier``). Default: 1.
    """

    layers: str
    norm: Tuple[str, ...]
    head: Tuple[str, ...] = ("lm_head",)
    post: Callable[[nn.Module], Optional[nn.Module]] = _no_post
    mid: Callable[[Any], Union[None, str, Tuple[str, ...]]] = lambda config: None
    norm_kind: str = "rms"
    attn_out: Callable[[Any], Optional[str]] = lambda config: None
    attn_scale: Callable[[Any], float] = lambda config: 1.0

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
        for name in ("post", "mid", "attn_out", "attn_scale"):
            if not callable(getattr(self, name)):
                raise TypeError(f"{name}: expected a callable")
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(
                f"norm_kind: expected one of {list(NORM_KINDS)}, got "
                f"{self.norm_kind!r}"
            )


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


def _falcon_h1_multiplier(model: nn.Module) -> nn.Module:
    # FalconH1ForCausalLM.forward: lm_head(h) * model.model.lm_head_multiplier.
    return LogitScale(model.model.lm_head_multiplier)


_POST_ATTENTION_NORM = _mid("post_attention_layernorm")
_O_PROJ = _mid("self_attn.o_proj")
_LLAMA_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    mid=_POST_ATTENTION_NORM,
    attn_out=_O_PROJ,
)
# Gemma 2/3 normalise the attention output before adding it: no head split.
_GEMMA2_LIKE = Architecture(
    layers="model.layers",
    norm=("model.norm",),
    post=_softcap_from_config,
    mid=_mid("pre_feedforward_layernorm"),
)

_LAYER_NORM = dict(norm_kind="layer")
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

_REGISTRY: Dict[str, Architecture] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "gemma2": _GEMMA2_LIKE,
    "gemma3_text": _GEMMA2_LIKE,
    "gpt2": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid=_mid("ln_2", parallel_if=lambda c: c.add_cross_attention),
        attn_out=_mid("attn.c_proj", parallel_if=lambda c: c.add_cross_attention),
    ),
    # transformers 5 renamed GPT-NeoX's head from ``embed_out`` to ``lm_head``.
    "gpt_neox": Architecture(
        **_LAYER_NORM,
        layers="gpt_neox.layers",
        norm=("gpt_neox.final_layer_norm",),
        head=("lm_head", "embed_out"),
        mid=_mid(
            "post_attention_layernorm",
            parallel_if=lambda c: c.use_parallel_residual,
        ),
        attn_out=_mid(
            "attention.dense", parallel_if=lambda c: c.use_parallel_residual
        ),
    ),
    "gptj": Architecture(
        layers="transformer.h", norm=("transformer.ln_f",), **_LAYER_NORM
    ),
    "opt": Architecture(
        **_LAYER_NORM,
        layers="model.decoder.layers",
        norm=("model.decoder.final_layer_norm", "model.decoder.project_out"),
        # Post-norm OPT normalises the stream after attention: no plain h_mid.
        mid=_mid("final_layer_norm", parallel_if=lambda c: not c.do_layer_norm_before),
        attn_out=_mid(
            "self_attn.out_proj", parallel_if=lambda c: not c.do_layer_norm_before
        ),
    ),
    "phi": Architecture(
        layers="model.layers", norm=("model.final_layernorm",), **_LAYER_NORM
    ),
    "phi3": _LLAMA_LIKE,
    "falcon": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        mid=_mid(
            "post_attention_layernorm",
            parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture,
        ),
        attn_out=_mid(
            "self_attention.dense",
            parallel_if=lambda c: c.parallel_attn or c.new_decoder_architecture,
        ),
    ),
    "bloom": Architecture(
        **_LAYER_NORM,
        layers="transformer.h",
        norm=("transformer.ln_f",),
        # With the residual taken after the norm, the stream is not h + attn.
        mid=_mid(
            "post_attention_layernorm",
            parallel_if=lambda c: c.apply_residual_connection_post_layernorm,
        ),
        # The slow exact path of pretraining_tp > 1 never calls `dense`.
        attn_out=_mid(
            "self_attention.dense",
            parallel_if=lambda c: c.apply_residual_connection_post_layernorm
            or (c.pretraining_tp > 1 and c.slow_but_exact),
        ),
    ),
    "stablelm": Architecture(
        **_LAYER_NORM,
        layers="model.layers",
        norm=("model.norm",),
        mid=_mid(
            "post_attention_layernorm",
            parallel_if=lambda c: c.use_parallel_residual,
        ),
        attn_out=_mid(
            "self_attn.o_proj", parallel_if=lambda c: c.use_parallel_residual
        ),
    ),
    "cohere": Architecture(
        **_LAYER_NORM,
        layers="model.layers",
        norm=("model.norm",),
        post=_cohere_logit_scale,
    ),
    "granite": _GRANITE,
    # OLMo's final norm is a parameter-free LayerNorm.
    "olmo": Architecture(
        layers="model.layers",
        norm=("model.norm",),
        mid=_POST_ATTENTION_NORM,
        attn_out=_O_PROJ,
        **_LAYER_NORM,
    ),
    # OLMo2 normalises the attention output before adding it (no head split);
    # the MLP reads the stream itself.
    "olmo2": Architecture(layers="model.layers", norm=("model.norm",), mid=_mid("mlp")),
    # Current families. A mixture-of-experts layer is the block's MLP: the block
    # stays a residual block, and the mid-block state is the MLP's input.
    "llama4_text": _LLAMA_LIKE,
    "qwen3_5_text": _LLAMA_LIKE_HYBRID,  # Gated DeltaNet or attention, then MLP
    "qwen3_5_moe_text": _LLAMA_LIKE_HYBRID,
    "qwen3_moe": _LLAMA_LIKE,
    "qwen3_next": _LLAMA_LIKE_HYBRID,  # Gated DeltaNet or attention, then experts
    "qwen2_moe": _LLAMA_LIKE,
    "mixtral": _LLAMA_LIKE,
    "olmoe": _LLAMA_LIKE,
    "smollm3": _LLAMA_LIKE,
    "gpt_oss": _LLAMA_LIKE,
    "deepseek_v3": _LLAMA_LIKE,
    "glm4_moe": _LLAMA_LIKE,
    "phimoe": Architecture(
        layers="model.layers",
        norm=("model.norm",),
        mid=_POST_ATTENTION_NORM,
        attn_out=_O_PROJ,
        **_LAYER_NORM,
    ),
    "granitemoe": _GRANITE,
    "granitemoeshared": _GRANITE,
    # Mamba-2 or attention, then experts.
    "granitemoehybrid": replace(_GRANITE, attn_out=lambda config: None),
    "olmo3": Architecture(layers="model.layers", norm=("model.norm",), mid=_mid("mlp")),
    "gemma4_text": _GEMMA2_LIKE,
    # Hybrid recurrent: a Mamba mixer (or attention), then the MLP or experts.
    "jamba": Architecture(
        layers="model.layers",
        norm=("model.final_layernorm",),
        mid=_mid("pre_ff_layernorm"),
    ),
    # Mamba-2 and attention in parallel, then the MLP; the head's output is
    # multiplied by lm_head_multiplier.
    "falcon_h1": Architecture(
        layers="model.layers",
        norm=("model.final_layernorm",),
        post=_falcon_h1_multiplier,
        mid=_mid("pre_ff_layernorm"),
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

# The entries verified by the test suite; anything else is verified on first use.
_BUILT_IN: Dict[str, Architecture] = dict(_REGISTRY)
# Model -> the entry verified on it (user-registered or probed).
_VERIFIED: "weakref.WeakKeyDictionary[nn.Module, Architecture]" = (
    weakref.WeakKeyDictionary()
)


def register_architecture(
    model_type: str,
    *,
    layers: str,
    norm: Sequence[str],
    head: Sequence[str] = ("lm_head",),
    post: Union[None, nn.Module, Callable[[nn.Module], Optional[nn.Module]]] = None,
    mid: Optional[str] = None,
    norm_kind: str = "rms",
    replace: bool = False,
    attn_out: Optional[str] = None,
) -> Architecture:
    r"""
    Adds a model type to the registry, so that :meth:`LayerIGLens.from_model`,
    :meth:`Readout.from_model` and everything built on them support it.

    Nothing registered is trusted blindly: on first use with a model, one
    forward checks that the readout of the last block reproduces the model's
    own logits (and that every block has the ``mid`` module), and every IG-Lens
    call checks it again; a wrong entry raises :class:`ValueError`.

    Args:

        model_type (str): The ``config.model_type`` of the model.
        layers (str): Dotted path of the ``nn.ModuleList`` of decoder blocks,
                    e.g. ``"model.layers"``.
        norm (list[str]): Dotted paths of what the model applies, in order,
                    between its last block and its head (final norm, output
                    projection); empty if nothing.
        head (list[str], optional): Accepted dotted paths of the head.
                    Default: ``("lm_head",)``.
        post (nn.Module or Callable, optional): The transform of the head's
                    output (e.g. ``Softcap(30.0)``), or a function that builds it
                    from the model (e.g. ``lambda m:
                    Softcap(m.config.final_logit_softcapping)``) or returns None.
                    Default: None (no transform).
        mid (str, optional): Path, inside each block, of the module whose input
                    is the mid-block state ``h + attn(...)`` (needed for
                    ``granularity="sublayer"``), e.g.
                    ``"post_attention_layernorm"``. Default: None (no split).
        norm_kind (str, optional): ``"rms"``, ``"layer"`` or ``"none"``.
                    Default: ``"rms"``.
        replace (bool, optional): Allow replacing an existing entry.
                    Default: False.
        attn_out (str, optional): Path, inside each block, of the attention
                    output projection whose output the block adds to the stream
                    unchanged (needed for ``granularity="head"``), e.g.
                    ``"self_attn.o_proj"``. Default: None (no head split).

    Returns:
        *Architecture*: the registered entry.

    Examples::

        >>> register_architecture(
        ...     "my_llama", layers="model.layers", norm=("model.norm",),
        ...     post=Softcap(30.0), mid="post_attention_layernorm")
        >>> lens = LayerIGLens.from_model(my_model)  # verified here
    """
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model_type: expected a non-empty string, got {model_type!r}")
    if model_type in _REGISTRY and not replace:
        raise ValueError(
            f"model_type: {model_type!r} is already registered; pass replace=True "
            "to replace it"
        )
    for name, paths in (("norm", norm), ("head", head)):
        if isinstance(paths, str):
            raise ValueError(
                f"{name}: expected a list of dotted paths, got the string {paths!r}; "
                f"write ({paths!r},)"
            )
    for name, path in (("mid", mid), ("attn_out", attn_out)):
        if path is not None and (not isinstance(path, str) or not path):
            raise ValueError(f"{name}: expected a dotted path or None, got {path!r}")
    if post is None:
        post = _no_post
    elif isinstance(post, nn.Module):
        post = _constant(post)
    entry = Architecture(
        layers=layers,
        norm=tuple(norm),
        head=tuple(head),
        post=post,
        mid=_mid(mid) if mid is not None else (lambda config: None),
        norm_kind=norm_kind,
        attn_out=_mid(attn_out) if attn_out is not None else (lambda config: None),
    )
    _REGISTRY[model_type] = entry
    return entry


def _constant(module: nn.Module) -> Callable[[nn.Module], nn.Module]:
    return lambda model: module


def unregister_architecture(model_type: str) -> None:
    r"""Removes a model type added with :func:`register_architecture`.

    Args:

        model_type (str): A registered ``config.model_type``.
    """
    if model_type not in _REGISTRY:
        raise ValueError(f"model_type: {model_type!r} is not registered")
    del _REGISTRY[model_type]


def supported_model_types() -> List[str]:
    r"""The registered model types, sorted."""
    return sorted(_REGISTRY)


def architecture(model: nn.Module) -> Architecture:
    r"""The registry entry of a model, keyed by ``model.config.model_type``.

    Built-in entries are returned as they are (the test suite verifies them). A
    user-registered entry is returned once one forward of this model shows that
    its readout reproduces the model's logits; for a type in neither, the
    probe's first proposal that does (:mod:`captum_iglens.hf.probe`). Each model
    is verified once.

    Raises:
        ValueError: If the type is refused (:data:`REFUSED`, with the reason), or
            the registered entry or every proposal of the probe fails the check;
            the message names the model type and the ``register_architecture``
            call to write.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}) is not supported: "
            f"{REFUSED[model_type]}."
        )
    entry = _REGISTRY.get(model_type)
    if entry is not None and _BUILT_IN.get(model_type) is entry:
        return entry
    if entry is None and config is None:
        raise ValueError(
            f"model: expected a Hugging Face causal LM with a config, got "
            f"{type(model).__name__}; build Readout(head=..., norm=..., post=...) "
            "by hand and pass layer= explicitly"
        )
    verified = _VERIFIED.get(model)
    if verified is not None and (entry is None or verified is entry):
        return verified
    entry = _probe(model) if entry is None else _verify(model, entry)
    _VERIFIED[model] = entry
    return entry


def _verify(model: nn.Module, entry: Architecture) -> Architecture:
    """The entry, once a real forward shows its readout gives the model's logits."""
    model_type = getattr(model.config, "model_type", None)
    mid_modules_of(model, entry, blocks_of(model, entry))
    captured, logits = last_outputs_and_logits(model, [entry.layers])
    if entry.layers not in captured:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the last block "
            f"of {entry.layers!r} did not run or did not return a tensor"
        )
    h_final = captured[entry.layers]
    error = readout_error(*readout_parts_of(model, entry), h_final, logits)
    if error > tolerance(h_final.dtype):
        hint = register_hint(model_type, entry.layers, entry.norm, entry.head)
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the registered "
            "architecture does not reproduce the model's logits (relative "
            f"difference {error:.3g}): the readout ({entry.norm}, {entry.head}, "
            f"post) of the output of the last block of {entry.layers!r} must be "
            f"what the model computes. Fix the entry with {hint[:-1]}, replace=True)"
        )
    return entry


def _probe(model: nn.Module) -> Architecture:
    """The first proposal of the probe whose readout gives the model's logits."""
    model_type = getattr(model.config, "model_type", None)
    proposals = propose_parts(model)
    tried: List[str] = []
    if proposals:
        paths = list(dict.fromkeys(p.layers for p in proposals))
        try:
            captured, logits = last_outputs_and_logits(model, paths)
        except (RuntimeError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(
                f"{type(model).__name__} (model_type={model_type!r}) is not in the "
                "architecture table, and the probe's verification forward "
                f"model(input_ids=...) failed ({error}). Register it with "
                "captum_iglens.register_architecture(...), or build "
                "Readout(head=..., norm=..., post=...) by hand and pass layer= "
                "explicitly."
            ) from error
        for p in proposals:
            if p.layers not in captured:
                continue
            entry = Architecture(layers=p.layers, norm=p.norm, head=p.head, post=p.post)
            norm, head, post = readout_parts_of(model, entry)
            error = readout_error(norm, head, post, captured[p.layers], logits)
            if error <= tolerance(captured[p.layers].dtype):
                kind = measured_norm_kind(norm, captured[p.layers])
                return Architecture(
                    layers=p.layers, norm=p.norm, head=p.head, post=p.post,
                    norm_kind=kind,
                )
            tried.append(
                f"layers={p.layers!r}, norm={p.norm}, post={p.post_name}: {error:.3g}"
            )
    first = proposals[0] if proposals else None
    hint = register_hint(
        model_type,
        first.layers if first else "model.layers",
        first.norm if first else (),
        first.head if first else ("lm_head",),
    )
    raise ValueError(
        f"{type(model).__name__} (model_type={model_type!r}) is not in the "
        "architecture table, and no part structure proposed by the probe "
        "reproduces its logits"
        + (f" (relative differences: {'; '.join(tried[:6])})" if tried else "")
        + f". Register it: {hint}; or build Readout(head=..., norm=..., post=...) "
        "by hand and pass layer= explicitly."
    )


def final_norm_kind(model: nn.Module) -> str:
    r"""The kind of the model's final norm, one of :data:`NORM_KINDS`."""
    return architecture(model).norm_kind


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
                    is registered.

    Returns:
        **layers** (list of nn.Module):
            The model's own decoder blocks in execution order; the last one's
            output is the input of the readout.

    Raises:
        ValueError: If the model type is not supported or the model lacks the
            attribute the table names.
    """
    return blocks_of(model, architecture(model))


def blocks_of(model: nn.Module, arch: Architecture) -> List[nn.Module]:
    r""":func:`decoder_layers` for a given entry ``arch`` of ``model``."""
    blocks = _resolve(model, arch.layers)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or not len(blocks):
        raise ValueError(
            f"{type(model).__name__}: {arch.layers!r} is not a non-empty "
            "nn.ModuleList of decoder blocks"
        )
    return list(blocks)


def choose_blocks(model: nn.Module, layers: Optional[Sequence[int]]) -> List[int]:
    r"""The one rule for choosing decoder blocks: sorted, unique indices, with the
    last block always included.

    Args:
        model (nn.Module): A model of a registered architecture.
        layers (list[int], optional): Block indices (negative ones count from the
                    end); booleans are refused. Default: all blocks.

    Returns:
        *list[int]*: the chosen block indices, in ``[0, n)``, ending with ``n - 1``.
    """
    n = len(decoder_layers(model))
    if layers is None:
        return list(range(n))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(
            f"layers: expected a list of block indices, got {type(layers).__name__}"
        )
    indices = [_block_index(index, n) for index in layers]
    return sorted({i % n for i in indices} | {n - 1})


def _block_index(index: object, n: int) -> int:
    """An integer block index in ``[-n, n)``: Python, numpy and 0-d torch integers
    are accepted, booleans and floats are not."""
    try:
        value = None if isinstance(index, bool) else operator.index(index)
    except TypeError:
        value = None
    if value is None:
        raise TypeError(
            f"layers: expected integer block indices, got {index!r} "
            f"({type(index).__name__})"
        )
    if not -n <= value < n:
        raise ValueError(f"layers: expected block indices in [-{n}, {n}), got {value}")
    return value


def mid_block_modules(
    model: nn.Module, blocks: List[nn.Module]
) -> Optional[List[nn.Module]]:
    r"""Returns, for each block, the module whose input is the mid-block state.

    The mid-block state ``h_mid = h + attn(...)`` is the residual stream after a
    block's attention and before its MLP. It exists only where the block adds
    the two in sequence.

    Args:
        model (nn.Module): A ``*ForCausalLM`` model whose ``config.model_type``
                    is registered.
        blocks (list of nn.Module): Decoder blocks of ``model``.

    Returns:
        **modules** (list of nn.Module or None):
            One module per block (a forward pre-hook on it sees ``h_mid``), or
            ``None`` where the architecture (as configured) adds attention and MLP
            in parallel: GPT-J, Phi, Cohere, parallel Falcon, GPT-NeoX and StableLM
            with ``use_parallel_residual``, post-norm OPT, Bloom with the residual
            after the norm.
    """
    return mid_modules_of(model, architecture(model), blocks)


def mid_modules_of(
    model: nn.Module, arch: Architecture, blocks: List[nn.Module]
) -> Optional[List[nn.Module]]:
    r""":func:`mid_block_modules` for a given entry ``arch`` of ``model``."""
    path = arch.mid(model.config)
    if path is None:
        return None
    if isinstance(path, str):
        paths = [path] * len(blocks)
    else:  # one path per block of the model, for blocks of different kinds
        index = {id(b): i for i, b in enumerate(blocks_of(model, arch))}
        paths = [path[index[id(block)]] for block in blocks]
    modules = [_lookup(block, p) for block, p in zip(blocks, paths)]
    for module, p in zip(modules, paths):
        if not isinstance(module, nn.Module):
            raise ValueError(
                f"{type(model).__name__}: a decoder block has no module {p!r}, "
                "where the architecture table expects the mid-block state"
            )
    return modules


def attention_outputs(
    model: nn.Module, blocks: List[nn.Module]
) -> Optional[Tuple[List[nn.Module], int, float]]:
    r"""Returns, for each block, the attention output projection, with the number
    of heads and the factor the block applies to the projection's output.

    Args:
        model (nn.Module): A ``*ForCausalLM`` model whose ``config.model_type``
                    is registered.
        blocks (list of nn.Module): Decoder blocks of ``model``.

    Returns:
        3-element tuple of **projections** (one per block), **n_heads** and
        **scale**, or ``None`` where the architecture (as configured) has no
        split of its attention update into heads: blocks that add attention and
        MLP in parallel, or that normalise the attention output before adding
        it (Gemma 2/3, OLMo 2).
    """
    arch = architecture(model)
    path = arch.attn_out(model.config)
    if path is None:
        return None
    modules = [_lookup(block, path) for block in blocks]
    if any(not isinstance(m, nn.Module) for m in modules):
        raise ValueError(
            f"{type(model).__name__}: a decoder block has no module {path!r}, where "
            "the architecture table expects the attention output projection"
        )
    n_heads = model.config.num_attention_heads
    return modules, n_heads, float(arch.attn_scale(model.config))


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
                    is registered.

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
    return readout_parts_of(model, architecture(model))


def readout_parts_of(
    model: nn.Module, arch: Architecture
) -> Tuple[Optional[nn.Module], nn.Module, Optional[nn.Module]]:
    r""":func:`readout_parts` for a given entry ``arch`` of ``model``."""
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
