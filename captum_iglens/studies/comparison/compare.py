r"""
IG-Lens beside Captum's LayerConductance and LayerIntegratedGradients, the logit
lens and Direct Logit Attribution, measured on the same work: for the same
inputs, targets, positions and layers, each method's token-by-layer score, how far
its sum over layers is from the change in probability (the telescoping residual),
and what it cost (time, peak memory, passes through the model).

A tuned lens is not compared: it needs a trained translator per layer.
"""

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, cast

from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr._utils.checks import PositionsType
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import answered_prompt
from captum_iglens.readout import Readout
from captum_iglens.settings import Settings, provenance
from captum_iglens.studies.comparison.measure import (
    Cost,
    measure,
    peak_memory_source,
)
from captum_iglens.studies.comparison.result import (
    _COST_FIELDS,
    ComparisonResult,
    MethodResult,
)
from captum_iglens.studies.methods.registry import (
    COMPARED_METHODS,
    METHODS,
    SOURCE_METHODS,
)
from captum_iglens.studies.methods.runners import (
    Outcome,
    Work,
    default_baseline_token,
)


def compare(
    model: Union[Module, ModelParts],
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    positions: PositionsType = None,
    target: Union[None, int, Sequence[int], Tensor] = None,
    methods: Union[str, Sequence[str]] = COMPARED_METHODS,
    settings: Optional[Settings] = None,
    baseline_token: Optional[int] = None,
    tokenizer: Optional[Any] = None,
    **options: Any,
) -> ComparisonResult:
    r"""
    Runs each method on the same inputs, targets, positions and blocks, and
    measures each: a token-by-layer score ``(B, P, k)``, its sum over layers, the
    telescoping residual ``|Σ_layers − Δp|`` in probability, wall time, peak
    memory, and passes through the model. A first IG-Lens pass (counted in no
    method's cost) fixes the targets and positions every method attributes.

    The methods, :data:`COMPARED_METHODS`:

    - ``"ig_lens"``: :meth:`LayerIGLens.attribute_map`. Its credits sum to
      ``Δp = p_model − f(h_base)``.
    - ``"ig_lens_joint"``: :meth:`LayerIGLens.attribute_map` with
      ``path="joint"`` (whatever the settings' path): every block's update
      integrated along ``h_0 → h_final`` at once. Its credits sum to ``Δp``.
    - ``"logit_lens"``: the levels ``f(h_{L_j})``, read from IG-Lens's own pass
      (a logit lens costs what IG-Lens costs). Levels, not attributions: their
      sum is set against ``Δp = p_model − f(h_0)`` only to show it means nothing.
    - ``"logit_lens_diff"``: the first differences of those levels, starting
      from ``f(h_0)``. They telescope, and with IG-Lens's default baseline they
      are IG-Lens's map (by the gradient theorem; IG-Lens adds the split over
      hidden dimensions and the choice of baseline).
    - ``"dla"``: Direct Logit Attribution, in logits. Block ``L_j`` gets its
      update ``h_{L_j} − h_{L_{j−1}}`` (from ``h_0``; the updates of the blocks
      between two chosen ones together) read through the final norm with its
      scale taken from the final hidden state ``h_final`` (the usual convention,
      TransformerLens's ``apply_ln_to_stack`` with the final scale; a LayerNorm
      still centres, the norm's weight applies, its bias does not), any output
      projection, and the head without its bias. Cohere's and Granite's logit
      scaling are kept; final-logit softcapping, not linear, is left out. The
      scores sum to the logit difference ``ℓ(h_final) − ℓ̃(h_0)``, the target's
      logit minus that of ``h_0`` read at the same frozen scale; the residual
      shows what comes of reading that sum as ``Δp = p_model − f(h_0)``.
    - ``"dla_prob"``: DLA mapped to probability: each update alone on ``h_0``,
      ``p̃(h_0 + Δ_j) − p̃(h_0)``, read through the same frozen-scale readout
      with the softmax over the whole vocabulary (softcapping kept). The
      residual is how far DLA is from additive in probability.
    - ``"layer_conductance"``: Captum's :class:`~captum.attr.LayerConductance`,
      one call per block (it takes one layer). It interpolates the model's inputs,
      so ``F`` runs the model on ``inputs_embeds``, the embedding module's output
      for the ids (the model treats them as it treats the ids).
    - ``"layer_integrated_gradients"``: Captum's
      :class:`~captum.attr.LayerIntegratedGradients`, one call per block, ``F`` on
      token ids.
    - ``"layer_integrated_gradients_multilayer"``: one LayerIntegratedGradients
      call on the list of blocks. The blocks depend on each other, and Captum
      0.9.0 raises ``RuntimeError``; the retry with
      ``grad_kwargs={"materialize_grads": True}`` runs, and gives zeros to every
      block but the last. The note records both.

    For Captum's methods ``F(x)`` is the model's probability of the target at the
    position: each sequence is repeated once per position, so one call per block
    attributes every position. Each block's total is the whole ``F(x) − F(x')``
    (up to Captum's convergence delta, kept in ``delta``), so the sum over ``k``
    blocks is about ``k`` times the change.

    **Captum's baseline input** ``x'`` has the one token ``baseline_token`` at
    every position: its embedding for LayerConductance, the ids themselves for
    LayerIntegratedGradients, so both start from the same ``x'``. Like IG-Lens's
    baselines it is the same at every position, and unlike the zero embedding it
    is an input the model has seen (and one LayerIntegratedGradients on ids can
    use). IG-Lens's default baseline ``h_0`` has no counterpart: ``h_0`` is the
    input's own embedding, and ``x' = x`` gives ``F(x) − F(x') = 0``.

    Args:

        model (transformers.PreTrainedModel): A causal LM of a supported
                    architecture, in eval mode; a wrapper of one
                    (TransformerLens bridge, nnsight model,
                    ``nn.DataParallel``), or its
                    :func:`~captum_iglens.hf.model_parts`.
        input_ids (Tensor): ``(B, T)`` token ids.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at (left) padding.
                    Default: None
        positions (int, list[int] or Tensor, optional): The positions to
                    attribute. Default: None (every non-padding position).
        target (int, list[int] or Tensor, optional): As in
                    :meth:`LayerIGLens.attribute`. Default: None (the model's
                    greedy prediction at each position).
        methods (str or list[str], optional): Names from
                    :data:`COMPARED_METHODS`. Default: all of them.
        settings (Settings, optional): ``layers`` (Captum's methods cost a full
                    integral per block, so choose a few), IG-Lens's
                    ``baselines``, ``method``, ``granularity`` (IG-Lens and the
                    logit lens; the others stay per block) and
                    ``max_chunk_bytes``; ``n_steps`` is also the steps of
                    Captum's integrals (with Captum's default rule,
                    ``"gausslegendre"``), and ``internal_batch_size`` is also
                    Captum's (rows per forward, at least ``2·B·P`` for
                    LayerConductance). The logit lens and DLA start at ``h_0``
                    whatever the baseline is. Default: ``Settings()``.
        baseline_token (int, optional): The token of Captum's baseline input.
                    Default: None (``model.config.pad_token_id``, else its
                    ``bos_token_id``)
        tokenizer (PreTrainedTokenizerBase, optional): Labels tokens with text.
                    Default: None
        **options (Any): Fields of :class:`Settings` that override ``settings``.

    Returns:
        :class:`ComparisonResult`; print it, or call
        :meth:`~ComparisonResult.format_table`, for the table. Peak memory on CPU
        is a lower bound (see :class:`~captum_iglens._utils.measure.Cost`), and
        times on a shared machine are noisy.

    Examples::

        >>> result = compare(model, ids, positions=[-3, -2, -1], layers=[9, 19])
        >>> print(result.format_table())
        >>> fig, axes = result.plot()
    """
    settings = Settings.resolve(settings, options)
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    names = method_names(methods)
    baseline_token = _baseline_token(model, baseline_token)
    ig_lens = LayerIGLens.from_model(
        parts, settings.layers, max_chunk_bytes=settings.max_chunk_bytes
    )
    ig_lens.segment_names(settings.granularity)  # fails now, before any method runs
    for name in names:
        granularity = METHODS[name].granularity
        if granularity is not None:
            ig_lens.segment_names(granularity)  # same
    extra = None if attention_mask is None else (attention_mask,)
    setup = ig_lens.attribute_map(input_ids, None, target, extra, positions=positions)
    work = Work.from_map(
        parts,
        ig_lens,
        input_ids,
        attention_mask,
        setup,
        setup.base_prob,
        settings,
        baseline_token,
    )
    device = ig_lens.readout.device
    mask = setup.mask.cpu().clone()
    results: Dict[str, MethodResult] = {}
    for name in names:
        head = cast(Readout, ig_lens.readout).head  # a plain (logit) readout
        with measure(model, head, device) as cost:
            # Each method runs from scratch (no outcome shared): its cost is its own.
            # The compared and source methods all have a ``run`` (misc: None).
            out = METHODS[name].run(replace(work, outcomes={}))  # type: ignore[misc]
        if METHODS[name].axis == "sources":
            labels = _source_labels(tokenizer, input_ids, out.layer_names)
            out = replace(out, layer_names=labels)
        results[name] = _method_result(out, mask, ig_lens.layer_names, cost)
    tokens, input_tokens = _token_labels(tokenizer, input_ids, work)
    metadata = dict(
        provenance(model, settings),
        n_steps=settings.steps,
        ig_lens_baseline=(
            "h_0" if settings.baselines is None else repr(settings.baselines)
        ),
        baseline_token=baseline_token,
        peak_memory=peak_memory_source(device),
    )
    return ComparisonResult(
        results,
        work.targets.cpu(),
        work.positions.cpu(),
        mask,
        list(ig_lens.layer_names),
        tokens,
        input_tokens,
        metadata,
    )


def method_names(methods: Union[str, Sequence[str]]) -> List[str]:
    r"""
    ``methods`` as a list without repeats, checked against the registry: names
    from :data:`COMPARED_METHODS` or :data:`SOURCE_METHODS`, each able to run in
    this version.

    Args:
        methods (str or list[str]): The names.

    Returns:
        *list[str]*, in the order given.
    """
    names = [methods] if isinstance(methods, str) else list(methods)
    known = COMPARED_METHODS + SOURCE_METHODS
    unknown = [m for m in names if m not in known]
    if unknown or not names:
        raise ValueError(f"methods: expected names from {list(known)}, got {names}")
    for name in names:
        reason = METHODS[name].why_not()
        if reason is not None:
            raise ValueError(f"methods: {reason}")
    return list(dict.fromkeys(names))


def _baseline_token(model: Module, baseline_token: Optional[int]) -> int:
    """The token of Captum's baseline input: ``baseline_token``, else the config's
    default, checked against the vocabulary."""
    if baseline_token is None:
        baseline_token = default_baseline_token(model)
    vocab = cast(Any, model).get_input_embeddings().num_embeddings
    if (
        isinstance(baseline_token, bool)
        or not isinstance(baseline_token, int)
        or not 0 <= baseline_token < vocab
    ):
        raise ValueError(
            f"baseline_token: expected a token id in [0, {vocab}), got "
            f"{baseline_token!r} (None takes the config's pad_token_id, else its "
            "bos_token_id)"
        )
    return baseline_token


def _source_labels(
    tokenizer: Optional[Any], input_ids: Tensor, names: Optional[List[str]]
) -> Optional[List[str]]:
    """The source columns of one sequence with a tokenizer, named by position
    and text (``3 ' capital'``); else ``names`` as they are."""
    if tokenizer is None or input_ids.shape[0] != 1:
        return names
    tokens = decode_tokens(tokenizer, input_ids[0].tolist())
    return [f"{i} {text!r}" for i, text in enumerate(tokens)]


def _token_labels(
    tokenizer: Optional[Any], input_ids: Tensor, work: Work
) -> Tuple[Optional[List[List[str]]], Optional[List[List[str]]]]:
    """The attributed tokens' and the given tokens' texts ``[B][P]``, with a
    tokenizer."""
    if tokenizer is None:
        return None, None
    given = input_ids[:, work.positions.to(input_ids.device)]
    tokens = [decode_tokens(tokenizer, row.tolist()) for row in work.targets]
    return tokens, [decode_tokens(tokenizer, row.tolist()) for row in given]


def _method_result(
    out: Outcome, mask: Tensor, layer_names: List[str], cost: Cost
) -> MethodResult:
    """A method's outcome on the CPU, zero at padding, with its cost."""
    delta = out.delta
    if delta is not None:
        real = mask if delta.dim() == 2 else mask[..., None]
        delta = delta.float().cpu() * real
    return MethodResult(
        scores=out.scores.float().cpu() * mask[..., None],
        layer_names=out.layer_names or list(layer_names),
        expected=out.expected.float().cpu() * mask,
        prob_change=out.prob_change.float().cpu() * mask,
        unit=out.unit,
        note=out.note,
        delta=delta,
        **{key: getattr(cost, key) for key in _COST_FIELDS},
    )


def compare_text(
    model: Module,
    tokenizer: Any,
    prompt: str,
    *,
    methods: Union[str, Sequence[str]] = COMPARED_METHODS,
    settings: Optional[Settings] = None,
    progress: bool = False,
    **options: Any,
) -> Tuple[ComparisonResult, Tensor]:
    r"""
    :func:`compare` on a model's greedy answer to a prompt, attributed by teacher
    forcing at ``settings.positions``, as :func:`~captum_iglens.attribute_text`
    does.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture;
                    a wrapper of one (TransformerLens bridge, nnsight model,
                    ``nn.DataParallel``), or its
                    :func:`~captum_iglens.hf.model_parts`.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompt (str): The user's text.
        methods (str or list[str], optional): As in :func:`compare`.
        settings (Settings, optional): As in :func:`compare`, with ``chat``,
                    ``max_new_tokens`` and ``positions`` for the text.
                    Default: ``Settings()``.
        progress (bool, optional): Progress bar for generation. Default: False.
        **options (Any): Fields of :class:`Settings` that override ``settings``.

    Returns:
        2-element tuple of the :class:`ComparisonResult` and the answer's token
        ids ``(n,)``.
    """
    settings = Settings.resolve(settings, options)
    parts = model_parts(model)  # unwrapped and looked up once
    model = parts.model
    ids, positions, targets, answer = answered_prompt(
        model,
        tokenizer,
        prompt,
        chat=settings.chat,
        max_new_tokens=settings.max_new_tokens,
        positions=settings.positions,
        progress=progress,
    )
    if positions.numel() == 0:
        raise ValueError(
            f"positions: nothing to attribute for positions={settings.positions!r}"
        )
    device = next(model.parameters()).device
    result = compare(
        parts,
        ids.to(device),
        positions=positions,
        target=targets.to(device),
        methods=methods,
        settings=settings,
        tokenizer=tokenizer,
    )
    return result, answer
