r"""The architecture registry: registration, lookup and verification.

The registry starts as the built-in table (:mod:`captum_iglens.hf.table`), keyed
by ``model.config.model_type``; users add their own entries with
:func:`register_architecture`. A model type that is neither built in nor
registered is probed (:mod:`captum_iglens.hf.probe`): its parts are proposed from
the module tree and used only once a real forward shows that they reproduce the
model's logits; otherwise :class:`ValueError` says how to register it. User
entries are verified the same way on first use. :func:`model_parts` is the one
way in: it unwraps the model, looks it up once and binds its parts
(:class:`~captum_iglens.hf.parts.ModelParts`).
"""

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from torch import nn

from captum_iglens.hf.declared import check_declared
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.probe import (
    last_outputs_and_logits,
    measured_norm_kind,
    propose_parts,
    readout_error,
    register_hint,
    tolerance,
)
from captum_iglens.hf.table import BUILT_IN, REFUSED, Architecture, in_block, no_post

# The registry: the built-in entries (verified by the test suite) and the user's.
_REGISTRY: Dict[str, Architecture] = dict(BUILT_IN)
# Model -> the entry verified on it (user-registered or probed).
_VERIFIED: "weakref.WeakKeyDictionary[nn.Module, Architecture]" = (
    weakref.WeakKeyDictionary()
)


def model_parts(model: Any) -> ModelParts:
    r"""The parts of a Hugging Face causal LM, bound once: unwrapped, looked up in
    the registry (and verified, see :func:`architecture`) and resolved.

    Every entry point calls this once and passes the result on; functions that
    accept a model also accept its :class:`ModelParts`, returned here as they are.

    Args:
        model (nn.Module or ModelParts): A ``*ForCausalLM`` model of a supported
                    architecture; a TransformerLens ``TransformerBridge``, an
                    nnsight ``LanguageModel`` or an ``nn.DataParallel`` / DDP
                    wrapping one (see
                    :func:`~captum_iglens.integrations.unwrap_model`); or parts
                    already bound.

    Returns:
        *ModelParts* of the (unwrapped) model.

    Raises:
        ValueError: If the model type is not supported, or the model lacks a
            module its entry names.

    Examples::

        >>> parts = model_parts(model)
        >>> readout = parts.readout()  # logits = readout(last block's output)
        >>> first_block = parts.blocks[0]
    """
    if isinstance(model, ModelParts):
        return model
    # Imported here: the integrations verify a wrapper through this package.
    from captum_iglens.integrations import unwrap_model

    model = unwrap_model(model)
    return ModelParts.bind(model, architecture(model))


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
    :func:`model_parts` and everything built on them support it.

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
        >>> ig_lens = LayerIGLens.from_model(my_model)  # verified here
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
        post = no_post
    elif isinstance(post, nn.Module):
        post = _constant(post)
    entry = Architecture(
        layers=layers,
        norm=tuple(norm),
        head=tuple(head),
        post=post,
        mid=in_block(mid) if mid is not None else (lambda config: None),
        norm_kind=norm_kind,
        attn_out=in_block(attn_out) if attn_out is not None else (lambda config: None),
    )
    _REGISTRY[model_type] = entry
    return entry


def _constant(module: nn.Module) -> Callable[[nn.Module], nn.Module]:
    return lambda model: module


def unregister_architecture(model_type: str) -> None:
    r"""Removes a model type added with :func:`register_architecture`; an entry
    that replaced a built-in one gives the built-in entry back.

    Args:

        model_type (str): A ``config.model_type`` registered by the user.

    Raises:
        ValueError: If the type is not registered, or its entry is built in
            (built-in entries cannot be removed; ``replace=True`` overrides one).
    """
    if model_type not in _REGISTRY:
        raise ValueError(f"model_type: {model_type!r} is not registered")
    built_in = BUILT_IN.get(model_type)
    if _REGISTRY[model_type] is built_in:
        raise ValueError(
            f"model_type: {model_type!r} is built in and cannot be removed; "
            "register_architecture(..., replace=True) overrides it"
        )
    if built_in is not None:
        _REGISTRY[model_type] = built_in
    else:
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
    known = model_type if isinstance(model_type, str) else ""
    entry = _REGISTRY.get(known)
    if entry is not None and BUILT_IN.get(known) is entry:
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
    parts = ModelParts.bind(model, entry)  # every block has the mid module
    captured, logits = last_outputs_and_logits(model, [entry.layers])
    if entry.layers not in captured:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the last block "
            f"of {entry.layers!r} did not run or did not return a tensor"
        )
    h_final = captured[entry.layers]
    error = readout_error(parts.norm, parts.head, parts.post, h_final, logits)
    if error > tolerance(h_final.dtype):
        hint = register_hint(model_type, entry.layers, entry.norm, entry.head)
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the registered "
            "architecture does not reproduce the model's logits (relative "
            f"difference {error:.3g}): the readout ({entry.norm}, {entry.head}, "
            f"post) of the output of the last block of {entry.layers!r} must be "
            f"what the model computes. Fix the entry with {hint[:-1]}, replace=True)"
        )
    try:
        check_declared(parts, h_final)
    except ValueError as error:
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}): the registered "
            f"{error}"
        ) from None
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
            parts = ModelParts.bind(model, entry)
            h_final = captured[p.layers]
            gap = readout_error(parts.norm, parts.head, parts.post, h_final, logits)
            if gap <= tolerance(h_final.dtype):
                kind = measured_norm_kind(parts.norm, h_final)
                return Architecture(
                    layers=p.layers,
                    norm=p.norm,
                    head=p.head,
                    post=p.post,
                    norm_kind=kind,
                )
            tried.append(
                f"layers={p.layers!r}, norm={p.norm}, post={p.post_name}: {gap:.3g}"
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
