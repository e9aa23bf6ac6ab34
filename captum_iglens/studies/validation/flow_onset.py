r"""
The onset by the probability flow through the attributed position
(``ig_lens_flow``) on a restoration study's result, after the fact.

For each fact and corruption the flow runs the whole model from the corrupted
prompt to the prompt (:class:`~captum_iglens.attr.flow.ProbabilityFlow`, exact
estimator). The flow that crosses the residual stream at one depth adds up to
``Δp`` over the positions (:meth:`~captum_iglens.attr.flow.graph.FlowGraph.crossings`),
so the share of ``Δp`` that crossed the attributed position's state after
block ``L`` is an exact quantity of the graph: the integrated counterpart of
restoring that state, which is what the study's causal tracing does. Its onset
is the first block where the share reaches the study's recovery threshold, as
the causal onset is the first block where the recovery does.

The study runs it as one of its methods
(``run_restoration(..., methods=[..., "ig_lens_flow"])``: its traced runner,
:func:`~captum_iglens.studies.methods.traced_runners.ig_lens_flow`);
:func:`flow_onsets` runs the same runner on the facts, noise draws and
counterfactual subjects of a result that was run without it.
"""

import time
from dataclasses import dataclass
from typing import Any, Dict

import numpy as np
import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.flow import DEFAULT_STEPS
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import causal_lm_logits
from captum_iglens.hf.parts import ModelParts
from captum_iglens.studies.methods.registry import METHODS
from captum_iglens.studies.validation.options import StudyOptions
from captum_iglens.studies.validation.restoration_study import (
    counterfactual_subjects,
    fact_trace,
    gain_spearman,
    share_gains,
    share_onsets,
    subject_tokens,
)
from captum_iglens.studies.validation.result import RestorationResult
from captum_iglens.studies.validation.stats import onset_agreement

#: The method's name in tables and results.
FLOW_METHOD = "ig_lens_flow"


@dataclass
class FlowOnsets:
    r"""
    The flow's shares and onsets on a restoration study's facts, ``N`` facts
    and ``k`` blocks (:func:`flow_onsets`).

    Attributes:

        shares (dict[str, np.ndarray]): ``(N, k)`` per corruption: the share of
                    ``Δp`` that crossed the attributed position after each
                    block; NaN rows where the corruption was not traced.
        onsets (dict[str, np.ndarray]): ``(N,)`` per corruption: the first
                    block where the share reaches the threshold (NaN: none).
        summary (dict): Per corruption, the onset agreement with the study's
                    causal onsets over the tokens the corruption affects
                    (:func:`~captum_iglens.studies.validation.stats.onset_agreement`).
        seconds (dict[str, float]): Per corruption, the flows' time.
        settings (dict): ``n_steps``, ``graphs`` per corruption and
                    ``recovery_threshold``.
    """

    shares: Dict[str, np.ndarray]
    onsets: Dict[str, np.ndarray]
    summary: Dict[str, Dict[str, Dict[str, float]]]
    seconds: Dict[str, float]
    settings: Dict[str, Any]


def flow_onsets(
    model: Module,
    tokenizer: Any,
    result: RestorationResult,
    *,
    n_steps: int = DEFAULT_STEPS,
    progress: bool = False,
) -> FlowOnsets:
    r"""
    The onset by the flow through the attributed position, on the facts,
    corruptions, noise draws and counterfactual prompts of ``result``: what
    ``run_restoration`` gives as ``ig_lens_flow`` when asked for it.

    Args:

        model (PreTrainedModel): The model ``result`` was run on.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        result (RestorationResult): A restoration study's result
                    (:func:`~captum_iglens.studies.validation.run_restoration`).
        n_steps (int, optional): Steps of each flow. Default:
                    :data:`~captum_iglens.attr.flow.DEFAULT_STEPS`
        progress (bool, optional): Print a line per fact. Default: False

    Returns:
        :class:`FlowOnsets`.

    Raises:
        ValueError: If the model's greedy token of a fact is not the one
            ``result`` attributed (another model or tokenizer).
    """
    parts = model_parts(model)
    run = METHODS[FLOW_METHOD].trace
    assert run is not None  # a traced method
    layers = [int(name) for name in result.layer_names]
    encoded, subjects = zip(*(subject_tokens(tokenizer, f) for f in result.facts))
    swaps = counterfactual_subjects(result.facts, encoded, subjects)
    study = _study(result, n_steps)
    n, k = len(result.facts), len(layers)
    shares = {c: np.full((n, k), np.nan) for c in result.corruptions}
    seconds = {c: 0.0 for c in result.corruptions}
    graphs = {c: 0 for c in result.corruptions}
    for i, ids in enumerate(encoded):
        target = _target(parts, tokenizer, ids, result, i)
        for c in result.corruptions:
            trace = fact_trace(
                parts, tokenizer, ids, target, subjects[i], swaps[i], c, layers, study
            )
            if trace is None:
                continue
            tick = time.perf_counter()
            shares[c][i] = run(trace)
            seconds[c] += time.perf_counter() - tick
            graphs[c] += trace.runs
        if progress:
            print(f"flow onsets: fact {i + 1}/{n}", flush=True)
    threshold = study.recovery_threshold
    onsets = {c: share_onsets(rows, threshold) for c, rows in shares.items()}
    summary = {
        c: onset_agreement(
            onsets[c],
            result.causal_onsets[c],
            gain_spearman(
                share_gains(shares[c]),
                result.recovery(c),
                ~np.isnan(result.causal_onsets[c]),
            ),
            study.n_bootstrap,
            study.seed,
        )
        for c in result.corruptions
    }
    return FlowOnsets(
        shares=shares,
        onsets=onsets,
        summary=summary,
        seconds=seconds,
        settings=dict(n_steps=n_steps, graphs=graphs, recovery_threshold=threshold),
    )


def _study(result: RestorationResult, n_steps: int) -> StudyOptions:
    """The study options of ``result`` that the flows use, with ``n_steps``."""
    s = result.settings
    return StudyOptions(
        n_bootstrap=s["n_bootstrap"],
        seed=s["seed"],
        noise_scale=s["noise_scale"],
        noise_seeds=s["noise_seeds"],
        recovery_threshold=s["recovery_threshold"],
        flow_steps=n_steps,
    )


def _target(
    parts: ModelParts, tokenizer: Any, ids: Tensor, result: RestorationResult, i: int
) -> int:
    """The model's greedy next token of fact ``i``, checked against the one
    ``result`` attributed."""
    device = next(parts.model.parameters()).device
    with torch.inference_mode():
        logits = causal_lm_logits(parts.model, input_ids=ids[None].to(device))
    target = int(logits[0, -1].argmax())
    token = decode_tokens(tokenizer, [target])[0]
    if token != result.target_tokens[i]:
        raise ValueError(
            f"result: fact {result.facts[i].id} attributed "
            f"{result.target_tokens[i]!r}, but this model's greedy token is "
            f"{token!r}; pass the model and "
            "tokenizer the study was run with"
        )
    return target


__all__ = ["FLOW_METHOD", "FlowOnsets", "flow_onsets"]
