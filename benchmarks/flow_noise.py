r"""
The flow's onset under the subject noise, taken apart (issue 59): why it comes
early on SmolLM2, and whether another onset rule fixes it without costing
another cell.

    python benchmarks/flow_noise.py smollm2 --cache runs/smollm2 --limit 182 \
        --state-paths 10
    python benchmarks/flow_noise.py gemma3 --cache runs/gemma3 --threshold 0.8
    python benchmarks/flow_noise.py --dry-run       # a tiny random model (CI)

The facts are the restoration study's (the shipped facts with a subject, their
counterfactual subjects found among all of them), taken in a shuffle of seed 0
so that ``--limit N`` samples every relation. Per fact, one JSON record in
``--cache`` (a killed run resumes where it stopped): the study's restoration
under its noise (3 draws) and under the counterfactual subject; the flow's
shares through the answer's position from each start (the study's own
``ig_lens_flow`` runner, 16 steps); the restoration under the same draws
scaled down (``--scales``: the partly noised inputs the flow's path crosses);
and for the first ``--state-paths`` facts the shares of a straight path in
each block's output from the noised run's states to the clean ones.

The facts are split before anything is looked at: even indices (of the 182
facts, in file order) are where a threshold is chosen, odd ones hold it out;
``--threshold`` applies one chosen elsewhere (SmolLM2's, to Gemma 3).
The table: per corruption and half, each rule's onset against the causal onset
(within ±2 blocks, mean lateness; BCa 95% intervals over the tokens the
corruption affects): the share reaching ½ (the study's rule), reaching the
threshold chosen on the even facts under the noise (or ``--threshold``), the
block of the share's largest gain, and the state path's share reaching ½.
Then the explanation's test: the causal onset of the restoration at each
reduced noise scale, and how close the flow's onset is to it.
"""

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from captum_iglens._utils.serialization import write_atomic
from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.attr.flow.engine import first_block_inputs
from captum_iglens.attr.flow.subject_start import noised_start
from captum_iglens.attr.subject_noise import embedding_std
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import causal_lm_logits
from captum_iglens.studies.methods.registry import METHODS
from captum_iglens.studies.validation import StudyOptions, load_facts
from captum_iglens.studies.validation.hooks import replace_output
from captum_iglens.studies.validation.restoration import restore
from captum_iglens.studies.validation.restoration_study import (
    counterfactual_subjects,
    fact_trace,
    subject_tokens,
)
from captum_iglens.studies.validation.stats import bootstrap_statistic, causal_onset

SCALES = (0.1, 0.25, 0.5)
THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50 ... 0.95
STUDY = StudyOptions()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=("smollm2", "gemma3"))
    parser.add_argument("--cache", type=Path, help="the per-fact records' folder")
    parser.add_argument("--limit", type=int, default=60, help="facts, shuffled")
    parser.add_argument("--scales", default=",".join(map(str, SCALES)))
    parser.add_argument("--state-paths", type=int, default=0, metavar="N")
    parser.add_argument("--threshold", type=float, help="instead of choosing one")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model")
    args = parser.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    if args.dry_run:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from flow_onset import tiny_study

        model, tokenizer, facts = tiny_study()
        # a random model's p barely moves: every token counts
        study = StudyOptions(noise_seeds=2, flow_steps=2, min_effect=1e-9)
    elif args.model is None or args.cache is None:
        parser.error("model and --cache: expected both (or --dry-run)")
    else:
        from captum_iglens.hf.models import load_embedded

        model, tokenizer = load_embedded(args.model, progress=False)
        facts, study = load_facts(), STUDY
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    records = run_facts(
        model, tokenizer, facts, study, scales, args.limit, args.state_paths, args.cache
    )
    print(report(records, scales, args.threshold, study))


def run_facts(
    model: Any,
    tokenizer: Any,
    facts: Sequence[Any],
    study: StudyOptions,
    scales: Sequence[float],
    limit: int,
    state_paths: int,
    cache: Optional[Path],
) -> List[Dict[str, Any]]:
    """Each fact's record, in the shuffled order, read from ``cache`` where it
    is there and written to it where it was not."""
    facts = [f for f in facts if f.subject_span()]
    encoded, subjects = zip(*(subject_tokens(tokenizer, f) for f in facts))
    swaps = counterfactual_subjects(facts, encoded, subjects)
    order = list(range(len(facts)))
    random.Random(0).shuffle(order)
    parts = model_parts(model)
    std = study.noise_scale * embedding_std(model)
    records = []
    for rank, i in enumerate(order[:limit]):
        path = None if cache is None else cache / f"{i:04d}.json"
        found = path is not None and path.exists()
        record = json.loads(path.read_text()) if path is not None and found else {}
        state_path = rank < state_paths
        if not record:
            record = fact_record(
                parts,
                tokenizer,
                encoded[i],
                subjects[i],
                swaps[i],
                study,
                scales,
                std,
                state_path,
            )
            record.update(index=i, id=facts[i].id)
        elif state_path and "state_path" not in record["noise"]:
            # asked for after the record was written
            record["noise"]["state_path"] = state_path_shares(
                parts, encoded[i], subjects[i], record["target"], study
            ).tolist()
        else:
            records.append(record)
            continue
        if path is not None:
            write_atomic(path, json.dumps(record))
        records.append(record)
        print(f"fact {rank + 1}/{min(limit, len(order))}: {facts[i].id}", flush=True)
    return records


def fact_record(
    parts: Any,
    tokenizer: Any,
    ids: torch.Tensor,
    subject: torch.Tensor,
    swap: Optional[torch.Tensor],
    study: StudyOptions,
    scales: Sequence[float],
    std: float,
    state_path: bool,
) -> Dict[str, Any]:
    """One fact under both corruptions: restorations, the flow's shares and,
    under the noise, the restorations at reduced scales and the state path."""
    with torch.no_grad():
        target = int(causal_lm_logits(parts.model, input_ids=ids[None])[0, -1].argmax())
    layers = list(range(len(parts.blocks)))
    seeds = range(study.seed, study.seed + study.noise_seeds)
    out: Dict[str, Any] = dict(target=target)
    for corruption in ("noise", "counterfactual"):
        trace = fact_trace(
            parts, tokenizer, ids, target, subject, swap, corruption, layers, study
        )
        if trace is None:
            continue
        shares = METHODS["ig_lens_flow"].trace(trace)  # type: ignore[misc]
        cell = dict(shares=shares.tolist())
        tg = torch.tensor([target])
        if corruption == "counterfactual":
            found = restore(parts, ids[None], targets=tg, corrupted_ids=swap[None])
        else:
            found = restore(
                parts,
                ids[None],
                targets=tg,
                subject_mask=subject[None],
                noise_std=std,
                seeds=seeds,
            )
            cell["partial"] = {}
            for s in scales:
                part = restore(
                    parts,
                    ids[None],
                    targets=tg,
                    subject_mask=subject[None],
                    noise_std=std * s,
                    seeds=seeds,
                )
                cell["partial"][str(s)] = [
                    float(part.corrupt[0]),
                    part.restored[0].tolist(),
                ]
            if state_path:
                cell["state_path"] = state_path_shares(
                    parts, ids, subject, target, study
                ).tolist()
        cell.update(
            clean=float(found.clean[0]),
            corrupt=float(found.corrupt[0]),
            restored=found.restored[0].tolist(),
        )
        out[corruption] = cell
    return out


def state_path_shares(
    parts: Any,
    ids: torch.Tensor,
    subject: torch.Tensor,
    target: int,
    study: StudyOptions,
) -> np.ndarray:
    """``(k,)``: per block ``L``, the share of ``Δp`` that a straight path in
    block ``L``'s output, from the noised run's states to the clean ones
    (trapezoid, ``study.flow_steps`` steps), credits to the last position;
    pooled over the draws as the flow's shares are."""
    clean, p_clean = block_outputs(parts, ids, first_block_inputs(parts, ids[None]))
    k = len(parts.blocks)
    credit, total = np.zeros(k), 0.0
    for seed in range(study.seed, study.seed + study.noise_seeds):
        start = noised_start(parts, ids[None], subject, study.noise_scale, seed)[0]
        noised, p_noised = block_outputs(parts, ids, start)
        total += float(p_clean[target] - p_noised[target])
        for layer in range(k):
            credit[layer] += last_position_credit(
                parts, ids, target, layer, noised[layer], clean[layer], study.flow_steps
            )
    return credit / total


def block_outputs(parts: Any, ids: torch.Tensor, start: torch.Tensor) -> Any:
    """``(k, T, d)`` every block's output, and the next-token probabilities,
    of a forward whose first block reads ``start`` ``(1, T, d)``."""
    found: List[torch.Tensor] = []
    hooks = [
        block.register_forward_hook(lambda m, a, o: found.append(hidden_of(o)[0]))
        for block in parts.blocks
    ]
    hooks.append(_first_input(parts, start))
    try:
        with torch.no_grad():
            logits = causal_lm_logits(parts.model, input_ids=ids[None])
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(found), logits[0, -1].float().softmax(-1)


def _first_input(parts: Any, start: torch.Tensor) -> Any:
    """A hook that gives the first block ``start`` as its input."""

    def replace(module: Any, args: Any, kwargs: Any) -> Any:
        if args:
            return (start, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": start}

    return parts.blocks[0].register_forward_pre_hook(replace, with_kwargs=True)


def last_position_credit(
    parts: Any,
    ids: torch.Tensor,
    target: int,
    layer: int,
    start: torch.Tensor,
    end: torch.Tensor,
    n_steps: int,
) -> float:
    """Integrated gradients of ``p(target)`` on block ``layer``'s output along
    the straight path ``start → end`` ``(T, d)``: the last position's credit."""
    alphas = torch.linspace(0, 1, n_steps + 1)[:, None, None]
    points = (start + alphas * (end - start)).detach().requires_grad_(True)
    hook = parts.blocks[layer].register_forward_hook(
        lambda m, a, o: replace_output(o, points.to(hidden_of(o).dtype))
    )
    try:
        with torch.enable_grad():
            logits = causal_lm_logits(
                parts.model, input_ids=ids[None].expand(n_steps + 1, -1)
            )
            p = logits[:, -1].float().softmax(-1)[:, target]
            (grad,) = torch.autograd.grad(p.sum(), points)
    finally:
        hook.remove()
    weights = torch.full((n_steps + 1,), 1.0 / n_steps)
    weights[0] = weights[-1] = 0.5 / n_steps
    mean_grad = (grad * weights[:, None, None]).sum(0)
    return float((mean_grad[-1] * (end[-1] - start[-1])).sum())


# ------------------------------------------------------------------ the report


def recovery(cell: Dict[str, Any]) -> np.ndarray:
    """``(k,)`` the restoration's recovery under a corruption."""
    gap = cell["clean"] - cell["corrupt"]
    return (np.asarray(cell["restored"]) - cell["corrupt"]) / gap


def causal(cell: Dict[str, Any], study: StudyOptions) -> float:
    """The causal onset, NaN where the corruption does not count (it lowers
    ``p`` by less than ``study.min_effect`` of ``p_clean``) or none is reached."""
    if cell["clean"] - cell["corrupt"] < study.min_effect * cell["clean"]:
        return np.nan
    onset = causal_onset(recovery(cell), study.recovery_threshold)
    return np.nan if onset < 0 else float(onset)


def first_at(row: Sequence[float], threshold: float) -> float:
    """The first block where ``row`` reaches ``threshold`` (NaN: none)."""
    onset = causal_onset(np.asarray(row, float), threshold)
    return np.nan if onset < 0 else float(onset)


def rules(threshold: float) -> Dict[str, Any]:
    """Each onset rule on a cell's record: NaN where it does not apply."""
    found = {
        "share >= 1/2": lambda c: first_at(c["shares"], 0.5),
        f"share >= {threshold:g}": lambda c: first_at(c["shares"], threshold),
        "largest gain": lambda c: float(np.argmax(np.diff(c["shares"], prepend=0.0))),
        "state path >= 1/2": lambda c: (
            first_at(c["state_path"], 0.5) if "state_path" in c else np.nan
        ),
        "share >= 1/2, state-path facts": lambda c: (
            first_at(c["shares"], 0.5) if "state_path" in c else np.nan
        ),
    }
    if threshold == 0.5:
        del found["share >= 0.5"]
    return found


def onsets(
    records: Sequence[Dict[str, Any]], corruption: str, rule: Any, study: StudyOptions
) -> np.ndarray:
    """``(N, 2)``: a rule's onset and the causal one per record (NaN rows where
    the corruption was not traced)."""
    rows = []
    for record in records:
        cell = record.get(corruption)
        rows.append((rule(cell), causal(cell, study)) if cell else (np.nan, np.nan))
    return np.array(rows, float).reshape(-1, 2)


def within_2(rows: np.ndarray) -> float:
    """The share of defined rows whose onsets are within 2 blocks."""
    ok = ~np.isnan(rows).any(1)
    return (
        float(np.mean(np.abs(rows[ok, 0] - rows[ok, 1]) <= 2)) if ok.any() else np.nan
    )


def choose_threshold(records: Sequence[Dict[str, Any]], study: StudyOptions) -> float:
    """The threshold of :data:`THRESHOLDS` with the most noise onsets within
    ±2 on the even facts (ties: the one nearest ½)."""
    even = [r for r in records if r["index"] % 2 == 0]
    scores = [
        within_2(onsets(even, "noise", lambda c, t=t: first_at(c["shares"], t), study))
        for t in THRESHOLDS
    ]
    if np.isnan(scores).all():
        return 0.5  # no even fact counts
    return THRESHOLDS[int(np.nanargmax(scores))]


def _interval(late: np.ndarray, stat: Any, study: StudyOptions, sign: str) -> str:
    """The statistic of ``late`` with its BCa interval."""
    found = bootstrap_statistic((late,), stat, study.n_bootstrap, study.seed)
    mean, lo, hi = (format(found[key], f"{sign}.2f") for key in ("mean", "lo", "hi"))
    return f"{mean} [{lo}, {hi}]"


def _near(late: np.ndarray, axis: int = -1) -> Any:
    return np.mean(np.abs(late) <= 2, axis=axis)


def _mean(late: np.ndarray, axis: int = -1) -> Any:
    return np.mean(late, axis=axis)


HALVES = {
    "even": lambda i: i % 2 == 0,
    "odd": lambda i: i % 2 == 1,
    "all": lambda i: True,
}


def rule_table(
    records: Sequence[Dict[str, Any]], threshold: float, study: StudyOptions
) -> List[str]:
    """Per corruption, half and rule: tokens, within ±2, mean lateness and the
    tokens more than 2 blocks early or late."""
    lines = [
        "| corruption | facts | rule | n | within ±2 | mean lateness | > 2 early "
        "| > 2 late |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for corruption in ("noise", "counterfactual"):
        for half, member in HALVES.items():
            picked = [r for r in records if member(r["index"])]
            for name, rule in rules(threshold).items():
                rows = onsets(picked, corruption, rule, study)
                late = rows[:, 0] - rows[:, 1]
                late = late[~np.isnan(late)]
                if not late.size:
                    continue
                lines.append(
                    f"| {corruption} | {half} | {name} | {late.size} | "
                    f"{_interval(late, _near, study, '')} | "
                    f"{_interval(late, _mean, study, '+')} | "
                    f"{np.mean(late < -2):.2f} | {np.mean(late > 2):.2f} |"
                )
    return lines


def scale_table(
    records: Sequence[Dict[str, Any]], scales: Sequence[float], study: StudyOptions
) -> List[str]:
    """The restoration under the noise scaled by each of ``scales``: how much
    of ``p`` the scaled noise leaves on the tokens the full noise affects
    (median), and on those the scaled noise affects too, its causal onset
    beside the full noise's and the flow's (share ≥ ½, from the full noise)."""
    lines = [
        "| noise scale | n | p_corrupt / p_clean (median) | causal onset (mean) "
        "| full noise's (mean) | flow's (mean) | flow within ±2 of it "
        "| flow's mean lateness |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scale in scales:
        left, rows = [], []
        for record in records:
            cell = record.get("noise")
            if cell is None or np.isnan(causal(cell, study)):
                continue
            corrupt, restored = cell["partial"][str(scale)]
            left.append(corrupt / cell["clean"])
            row = (
                causal(dict(cell, corrupt=corrupt, restored=restored), study),
                causal(cell, study),
                first_at(cell["shares"], 0.5),
            )
            if not np.isnan(row).any():
                rows.append(row)
        if not rows:
            continue
        onset, full, flow = np.array(rows).T
        late = flow - onset
        lines.append(
            f"| {scale:g} | {len(rows)} | {np.median(left):.2f} | "
            f"{onset.mean():.1f} | {full.mean():.1f} | {flow.mean():.1f} | "
            f"{_near(late):.2f} | {late.mean():+.2f} |"
        )
    return lines


def before_the_jump(
    records: Sequence[Dict[str, Any]], study: StudyOptions
) -> List[str]:
    """Per corruption: the flow's share and the restoration's recovery one
    block before the causal onset, and at it (means over the tokens)."""
    lines = [
        "| corruption | n | share at onset − 1 | recovery at onset − 1 | "
        "share at onset | recovery at onset |",
        "|---|---|---|---|---|---|",
    ]
    for corruption in ("noise", "counterfactual"):
        rows = []
        for record in records:
            cell = record.get(corruption)
            onset = np.nan if cell is None else causal(cell, study)
            if np.isnan(onset) or onset < 1:
                continue
            at, shares, rec = int(onset), cell["shares"], recovery(cell)
            rows.append((shares[at - 1], rec[at - 1], shares[at], rec[at]))
        if rows:
            means = np.mean(rows, axis=0)
            lines.append(
                f"| {corruption} | {len(rows)} | "
                + " | ".join(f"{v:.2f}" for v in means)
                + " |"
            )
    return lines


def report(
    records: Sequence[Dict[str, Any]],
    scales: Sequence[float],
    threshold: Optional[float],
    study: StudyOptions,
) -> str:
    """The three tables, with the threshold chosen on the even facts where
    none is given, and the best threshold of the grid on all the facts (a
    ceiling, not a choice)."""
    records = sorted(records, key=lambda r: r["index"])  # the study's order
    chosen = threshold is None
    if threshold is None:
        threshold = choose_threshold(records, study)
    even = sum(r["index"] % 2 == 0 for r in records)
    ceiling = max(
        (
            within_2(
                onsets(records, "noise", lambda c, t=t: first_at(c["shares"], t), study)
            ),
            -t,  # ties: the one nearest ½
        )
        for t in THRESHOLDS
    )
    head = (
        f"{len(records)} facts ({even} even, {len(records) - even} odd); threshold "
        f"{threshold:g} "
        + ("(chosen on the even facts under the noise)" if chosen else "(given)")
        + f"; on all the facts under the noise the best threshold of the grid, "
        f"{-ceiling[1]:g}, puts {ceiling[0]:.2f} within ±2"
    )
    return "\n".join(
        [head, "", *rule_table(records, threshold, study), ""]
        + ["The restoration at reduced noise:", *scale_table(records, scales, study)]
        + ["", "Before the jump:", *before_the_jump(records, study)]
    )


if __name__ == "__main__":
    main()
