r"""
The runners of the methods the restoration study runs from each corruption of
a fact rather than once per fact (registered in
:mod:`~captum_iglens.studies.methods.registry` with ``traced``). Each takes a
:class:`Trace` (one fact under one corruption) and returns the share of the
clean effect reached after each block, the counterpart of the recovery ``r(L)``
of restoring that block's output at the attributed position.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import numpy as np
from torch import Tensor

from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens.attr.flow.subject_start import noised_start
from captum_iglens.hf.parts import ModelParts


@dataclass
class Trace:
    r"""
    One fact under one corruption of the restoration study: the noise on its
    subject (``counterfactual`` None) or its counterfactual subject.

    Attributes:

        parts (ModelParts): The causal LM's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        input_ids (Tensor): ``(1, T)`` the prompt, on the model's device.
        target (int): The attributed token: the model's greedy next token.
        layers (list[int]): The study's blocks.
        n_steps (int): Steps of the method's path.
        subject (Tensor): ``(T,)`` bool: the subject's tokens, noised.
        noise_scale (float): The noise's standard deviation, in embedding
                    standard deviations.
        seeds (list[int]): One noise draw per seed.
        counterfactual (Tensor, optional): ``(1, T)`` the prompt with the
                    counterfactual subject; None under the noise.
    """

    parts: ModelParts
    tokenizer: Any
    input_ids: Tensor
    target: int
    layers: List[int]
    n_steps: int
    subject: Tensor
    noise_scale: float
    seeds: Sequence[int]
    counterfactual: Optional[Tensor] = None

    @property
    def runs(self) -> int:
        r"""The corrupted starts: one per noise draw, or the counterfactual."""
        return 1 if self.counterfactual is not None else len(self.seeds)


def ig_lens_flow(trace: Trace) -> np.ndarray:
    r"""
    The share of ``Δp`` that the probability flow from each corrupted start to
    the prompt carries across the attributed position's state after each
    block (:meth:`~captum_iglens.attr.flow.graph.FlowGraph.crossings`, exact
    estimator), pooled over the noise draws as the study pools its
    probabilities: ``Σ crossing / Σ Δp``.

    Args:

        trace (Trace): One fact under one corruption.

    Returns:
        *ndarray* ``(k,)``: 1 after the last block (every cut carries ``Δp``).
    """
    flow = ProbabilityFlow(trace.parts.model, trace.tokenizer)

    def graph(**start: Any) -> FlowGraph:  # one pair: one graph
        return flow.run(
            flow.plan(
                trace.input_ids,
                target=trace.target,
                n_steps=trace.n_steps,
                per_position=True,
                **start,
            )
        )

    if trace.counterfactual is not None:
        found = [graph(counterfactual=trace.counterfactual)]
    else:
        found = [
            graph(
                baselines=noised_start(
                    trace.parts, trace.input_ids, trace.subject, trace.noise_scale, s
                )[0]
            )
            for s in trace.seeds
        ]
    rows = [layer + 1 for layer in trace.layers]  # crossing rows: after each block
    crossed = sum(g.crossings()[rows, -1] for g in found)
    return np.asarray(crossed / sum(g.delta_m for g in found), dtype=float)
