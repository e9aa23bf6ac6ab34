r"""
The onset by the probability flow through the attributed position, scored on
the facts and corruptions of a restoration study (``ig_lens_flow``).

For each fact and corruption the flow runs the whole model from the corrupted
prompt to the prompt (:class:`~captum_iglens.attr.flow.ProbabilityFlow`, exact
estimator). The flow that crosses the residual stream at one depth adds up to
``Δp`` over the positions (:meth:`~captum_iglens.attr.flow.graph.FlowGraph.crossings`),
so the share of ``Δp`` that crossed the attributed position's state after
block ``L`` is an exact quantity of the graph: the integrated counterpart of
restoring that state, which is what the study's causal tracing does. Its onset
is the first block where the share reaches the study's recovery threshold, as
the causal onset is the first block where the recovery does.

Under the noise, the share is pooled over the study's draws as the study pools
the restored probabilities: ``Σ crossing / Σ Δp`` over the seeds. The
counterfactual prompt is the study's (the next fact of the same relation whose
subject has as many tokens).

The flow's start depends on the corruption, while the study's other methods
score a fact once; so this runs beside :func:`run_restoration`, on its result,
rather than as one of its methods.
"""

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List

import numpy as np
from torch.nn import Module

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.flow import DEFAULT_STEPS, ProbabilityFlow
from captum_iglens.attr.flow.subject_start import noised_start
from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens.hf.architectures import model_parts
from captum_iglens.studies.validation.restoration_study import (
    counterfactual_subjects,
    gain_spearman,
    subject_tokens,
)
from captum_iglens.studies.validation.result import RestorationResult
from captum_iglens.studies.validation.stats import (
    causal_onset,
    onset_agreement,
)

#: The method's name in tables.
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

    def format_table(self, result: RestorationResult) -> str:
        r"""
        The flow's onset agreement beside the study's methods, per corruption,
        over the tokens the corruption affects.

        Args:

            result (RestorationResult): The study the flows were run on.

        Returns:
            *str*.
        """
        metrics = ("within_2", "mean_lateness", "mean_abs_diff", "gain_spearman")
        lines: List[str] = []
        for c, rows in self.summary.items():
            table = {FLOW_METHOD: rows, **result.summary[c]["all"]}
            lines += ["", f"[{c}] onsets against the causal onset"]
            lines.append(
                f"{'method':<22}{'n':>4}  " + "".join(f"{m:<26}" for m in metrics)
            )
            for method, row in table.items():
                cells = [_cell(row[m]) for m in metrics]
                lines.append(
                    f"{method:<22}{row['within_2']['n']:>4}  "
                    + "".join(f"{cell:<26}" for cell in cells)
                )
            lines.append(
                f"{FLOW_METHOD}: {self.settings['graphs'][c]} graphs at "
                f"n_steps={self.settings['n_steps']}, {self.seconds[c]:.0f} s"
            )
        return "\n".join(lines[1:])


def _cell(stats: Dict[str, Any]) -> str:
    if not stats["n"] or stats["mean"] is None or np.isnan(stats["mean"]):
        return "-"
    return f"{stats['mean']:+.3f} [{stats['lo']:+.3f}, {stats['hi']:+.3f}]"


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
    corruptions, noise draws and counterfactual prompts of ``result``.

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
    flow = ProbabilityFlow(parts.model, tokenizer)
    layers = [int(name) + 1 for name in result.layer_names]  # crossing rows
    encoded, subjects = zip(*(subject_tokens(tokenizer, f) for f in result.facts))
    swaps = counterfactual_subjects(result.facts, encoded, subjects)
    settings = result.settings
    seeds = range(settings["seed"], settings["seed"] + settings["noise_seeds"])
    n, k = len(result.facts), len(layers)
    shares = {c: np.full((n, k), np.nan) for c in result.corruptions}
    seconds = {c: 0.0 for c in result.corruptions}
    graphs = {c: 0 for c in result.corruptions}
    device = next(parts.model.parameters()).device
    for i, ids in enumerate(encoded):
        ids, swap = ids[None].to(device), swaps[i]
        for c in result.corruptions:
            tick = time.perf_counter()
            graph = partial(flow.attribute, ids, n_steps=n_steps, per_position=True)
            if c == "noise":
                scale = settings["noise_scale"]
                found = [
                    graph(baselines=noised_start(parts, ids, subjects[i], scale, s)[0])
                    for s in seeds
                ]
            else:
                found = [] if swap is None else [graph(counterfactual=swap[None])]
            seconds[c] += time.perf_counter() - tick
            graphs[c] += len(found)
            if found:
                _check_target(tokenizer, found[0], result, i)
                crossed = sum(g.crossings()[layers, -1] for g in found)
                shares[c][i] = crossed / sum(g.delta_m for g in found)
        if progress:
            print(f"flow onsets: fact {i + 1}/{n}", flush=True)
    threshold = settings["recovery_threshold"]
    onsets = {c: _onsets(rows, threshold) for c, rows in shares.items()}
    summary = {
        c: onset_agreement(
            onsets[c],
            result.causal_onsets[c],
            gain_spearman(
                np.diff(shares[c], axis=1, prepend=0.0),  # the share's gains
                result.recovery(c),
                ~np.isnan(result.causal_onsets[c]),
            ),
            settings["n_bootstrap"],
            settings["seed"],
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


def _check_target(
    tokenizer: Any, graph: FlowGraph, result: RestorationResult, i: int
) -> None:
    token = decode_tokens(tokenizer, [graph.settings["target"]])[0]
    if token != result.target_tokens[i]:
        raise ValueError(
            f"result: fact {result.facts[i].id} attributed "
            f"{result.target_tokens[i]!r}, but this model's greedy token is "
            f"{token!r}; pass the model and "
            "tokenizer the study was run with"
        )


def _onsets(shares: np.ndarray, threshold: float) -> np.ndarray:
    out = np.full(len(shares), np.nan)
    for i, row in enumerate(shares):
        if not np.isnan(row).any():
            onset = causal_onset(row, threshold)
            out[i] = np.nan if onset < 0 else onset
    return out


__all__ = ["FLOW_METHOD", "FlowOnsets", "flow_onsets"]
