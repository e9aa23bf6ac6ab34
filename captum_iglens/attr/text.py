r"""
IG-Lens on text with a Hugging Face causal LM: the map of a model's answer to a
prompt, with the tokens attached.
"""

from typing import Any, List, Optional, Union, cast

from torch import Tensor

from captum_iglens._utils.tokens import decode_tokens, single_token_id
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.text import (
    answered_prompt,
    decoded_top_tokens,
)
from captum_iglens.hf.architectures import model_parts
from captum_iglens.integrations import unwrap_model
from captum_iglens.readout.layer_readout import LensType
from captum_iglens.readout.scores import FoilType, TokenSetType
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings, provenance


def attribute_text(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    answer: Optional[Union[str, Tensor]] = None,
    settings: Optional[Settings] = None,
    lens: LensType = None,
    attribution: Optional[LayerIGLens] = None,
    progress: bool = False,
    foil: Union[str, FoilType] = None,
    target_tokens: Union[List[str], TokenSetType] = None,
    **options: Any,
) -> IGLensResult:
    r"""
    The IG-Lens map of a model's answer to a prompt, with token strings attached.

    The prompt is encoded (with the chat template unless ``chat=False``) and the
    answer is generated greedily unless given. Every attributed position ``t`` is
    credited for the token that actually follows it in ``prompt + answer``
    (teacher forcing), which for a greedy answer is also the model's own
    prediction.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture, or a
                    TransformerLens bridge or nnsight model wrapping one.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer (for a bridge or an
                    nnsight model, e.g. ``bridge.tokenizer``).
        prompt (str): The user's text.
        answer (str or Tensor, optional): A precomputed answer to attribute
                    instead of generating one: text, or token ids ``(n,)`` (ids
                    avoid re-tokenising a generated answer). Default: None
        settings (Settings, optional): Layers, positions, baselines, estimator,
                    granularity, chat template, generation length, ...
                    Default: ``Settings()``.
        lens (str, Path, Translators or LayerwiseReadout, optional): The
                    readout per layer, as :meth:`LayerIGLens.from_model` takes
                    it: a tuned-lens folder or
                    :class:`~captum_iglens.readout.translators.Translators`
                    reads every block through its learned translator (refused
                    before any forward if made for another model), or a
                    readout already resolved. Default: None (the logit
                    readout)
        attribution (LayerIGLens, optional): The attribution to use, e.g. one
                    built by hand for a model outside the registry; its
                    ``forward_func`` must take ``(input_ids)``. Then
                    ``settings.layers`` and ``lens`` must be None. Default:
                    ``LayerIGLens.from_model(model, settings.layers, lens=lens)``.
        progress (bool, optional): Progress bar for generation. Default: False.
        foil (str, int, set or Tensor, optional): Attribute ``p(token) -
                    p(foil)`` at every attributed position: a string that
                    encodes to a single token, or the ids accepted by
                    :meth:`LayerIGLens.attribute`. Default: None
        target_tokens (list[str], set[int] or Tensor, optional): Attribute the
                    total probability of these tokens (strings that each encode
                    to a single token, e.g. ``[" Paris", "Paris"]``, or ids) at
                    every attributed position, in place of the answer's token.
                    Default: None
        **options (Any): Fields of :class:`Settings` that override ``settings``,
                    e.g. ``layers=[0, 10]`` or ``method="riemann_trapezoid"``.

    Returns:
        :class:`~captum_iglens.IGLensResult` for one sequence (``B = 1``), with
        ``tokens`` (the attributed tokens as text), ``top_tokens`` with
        ``settings.top_k >= 1``, ``foils``/``target_sets`` when given, and
        ``metadata`` (prompt, answer, settings, model, package versions).
    """
    settings = Settings.resolve(settings, options)
    if attribution is not None and lens is not None:
        raise ValueError(
            "lens: pass the readout per layer to LayerIGLens.from_model when "
            "building attribution=, not beside it"
        )
    # Unwrapped once (a bridge, an nnsight model); looked up only when the
    # attribution is built here.
    parts = None if attribution is not None else model_parts(model)
    model = unwrap_model(model) if parts is None else parts.model
    if isinstance(foil, str):
        foil = single_token_id(tokenizer, foil, "foil")
    if isinstance(target_tokens, (list, tuple)) and any(
        isinstance(t, str) for t in target_tokens
    ):
        target_tokens = {
            single_token_id(tokenizer, t, "target_tokens") for t in target_tokens
        }
    if attribution is not None and settings.layers is not None:
        raise ValueError("layers: pass either layers or attribution, not both")
    if parts is not None:  # checked (a learned readout too) before any forward
        attribution = LayerIGLens.from_model(
            parts,
            settings.layers,
            max_chunk_bytes=settings.max_chunk_bytes,
            lens=lens,
        )
    ids, pos, targets, answer_ids = answered_prompt(
        model,
        tokenizer,
        prompt,
        answer=answer,
        chat=settings.chat,
        max_new_tokens=settings.max_new_tokens,
        positions=settings.positions,
        progress=progress,
    )
    if pos.numel() == 0:
        raise ValueError(
            f"positions: nothing to attribute for positions={settings.positions!r} "
            + (
                "(the answer is empty)"
                if settings.positions == "answer"
                else "(the prompt has one token)"
            )
        )
    device = next(model.parameters()).device
    # built above where not given
    result = cast(LayerIGLens, attribution).attribute_map(
        ids.to(device),
        target=targets.to(device),
        positions=pos,
        foil=foil,
        target_tokens=target_tokens,
        **settings.map_kwargs(),
    )
    result.tokens = [decode_tokens(tokenizer, targets[0].tolist())]
    if result.top_ids is not None:
        result.top_tokens = decoded_top_tokens(tokenizer, result.top_ids)
    result.metadata = {
        "prompt": prompt,
        "answer": tokenizer.decode(answer_ids),
        **provenance(model, settings),
    }
    if result.source_layout() is not None:  # the sources' text, for the viewer
        result.metadata["source_tokens"] = [decode_tokens(tokenizer, ids[0].tolist())]
    return result.to("cpu")
