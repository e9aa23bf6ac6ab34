r"""
The cost of what each layer believes, and of contrastive and token-set targets:

    python benchmarks/views.py            # about 3 minutes of CPU time
    python benchmarks/views.py --quick    # fewer rounds, memory at 128k only
    python benchmarks/views.py --quick --shape llama-1b --skip-memory

``--shape`` runs part 1 on a random model of one of ``benchmarks/scale.py``'s
shapes instead (``llama-1b``: ``d = 2048``, a 128k vocabulary): the views' work
per row grows with the vocabulary alone, the readout's with the vocabulary times
``d``, so their share of the map falls as ``1/d``.

1. Side by side in one process, on the default model at ``T = 64`` attributed
   positions and every block: ``attribute_map`` with views (``top_k = 10``: top
   tokens, entropy, KL, rank) against the map without them, and a contrastive
   (``foil``) and a token-set target (3 tokens) against a single target. Each
   round runs every variant once, in turn; the ratio is the median over rounds
   of each round's ratio (goal: at most 1.10).
2. The CPU time of each step of one readout chunk (where the views' cost is).
3. Peak memory of the readout with views at a 128k and a 262k vocabulary,
   ``T = 512``, on a thin random Llama (``d = 64``, 8 blocks), in a fresh child
   process each: the peak resident memory above the memory just before the
   readout of every path point (the model's logits, the captured states and the
   weights already exist), against the readout's budget ``max_chunk_bytes``.

Times are the CPU time of this process with one thread (``--threads`` to
change), which other jobs on a shared machine hardly disturb.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import torch

from bench import (  # the sibling benchmarks/bench.py
    PROMPT,
    _reset_peak,
    _status_kib,
    capture_path,
    llama_1b_vocab_model,
    random_case,
)
from captum_iglens import LayerIGLens
from captum_iglens.attr._utils.path_math import path_values
from captum_iglens.hf import encode_prompt
from captum_iglens.hf.models import load_default
from captum_iglens.readout.scores import TokenScore

MIB = 2**20


def _cpu_seconds(function: Callable[[], Any]) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


def bench_speed(rounds: int, shape: str = "") -> Dict[str, float]:
    """Median per-round ratios of the map's variants, at T = 64, on the
    default model or a random one of ``shape`` (prompted with the default
    tokenizer's ids, which every shape's vocabulary holds)."""
    model, tokenizer = load_default(progress=False)
    if shape:
        from scale import build  # the sibling benchmarks/scale.py

        model = build(shape, torch.float32)
    case = random_case(encode_prompt(tokenizer, PROMPT), 64, model.config.vocab_size)
    lens = LayerIGLens.from_model(model)
    common = dict(target=case.targets, positions=case.positions)
    spellings = [
        tokenizer(t, add_special_tokens=False).input_ids[0]
        for t in (" Paris", "Paris", " paris")
    ]
    variants: Dict[str, Callable[[], Any]] = {
        "map": lambda: lens.attribute_map(case.ids, **common),
        "map, top_k=10": lambda: lens.attribute_map(case.ids, top_k=10, **common),
        "contrastive": lambda: lens.attribute_map(
            case.ids, foil=spellings[0], **common
        ),
        "token set (3)": lambda: lens.attribute_map(
            case.ids, target_tokens=set(spellings), **common
        ),
    }
    for function in variants.values():  # warm-up
        function()
    times: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, function in variants.items():
            times[name].append(_cpu_seconds(function))
    out = {f"{name} (s)": statistics.median(t) for name, t in times.items()}
    for name in ("map, top_k=10", "contrastive", "token set (3)"):
        ratios = [a / b for a, b in zip(times[name], times["map"])]
        out[f"{name} / map"] = statistics.median(ratios)
    return out


def bench_breakdown(rounds: int) -> Dict[str, float]:
    """CPU milliseconds of each step of one readout chunk of the default model
    (random hidden states, ``rows_per_chunk()`` rows): what the views add."""
    from captum_iglens.readout.scores import (
        FinalDistribution,
        Views,
        log_softmax_in_place,
        top_tokens,
    )

    model, _ = load_default(progress=False)
    readout = LayerIGLens.from_model(model).readout
    rows, k = readout.rows_per_chunk(), 30
    hidden = torch.randn(rows, model.config.hidden_size) * 3
    score = TokenScore.build(torch.randint(0, readout.vocab_size, (rows,)))
    with torch.inference_mode():
        logits = readout(hidden).float()
        log_probs = torch.log_softmax(logits, -1)
        entropy = -log_probs.exp().mul_(log_probs).sum(-1)
        final = FinalDistribution.of(
            log_probs[: rows // k + 1], torch.arange(rows) // k
        )
        work, scratch = torch.empty_like(logits), torch.empty_like(logits)
        steps: Dict[str, Callable[[], Any]] = {
            "readout (norm + head)": lambda: readout(hidden),
            "log_softmax": lambda: torch.log_softmax(logits, -1),
            "copy (to subtract)": lambda: work.copy_(logits),
            "log_softmax + entropy": lambda: log_softmax_in_place(
                work.copy_(logits), scratch, entropy=True
            ),
            "score (gather)": lambda: score.of(log_probs),
            "views: all but entropy": lambda: Views.of(
                log_probs, score, 10, final, entropy
            ),
            "views: top-10": lambda: top_tokens(log_probs, 10),
            "(torch.topk over V)": lambda: log_probs.topk(10, -1),
            "views: KL": lambda: final.kl(log_probs),
            "views: rank": lambda: score.rank(log_probs),
        }
        out = {}
        for name, function in steps.items():
            function()
            out[name] = statistics.median(
                _cpu_seconds(function) * 1000 for _ in range(rounds)
            )
    out["log_softmax + entropy"] -= out.pop("copy (to subtract)")
    return out


def memory_child(vocab: int, n_positions: int, budget_mib: int) -> Dict[str, Any]:
    """Peak RSS of the readout of every path point, with and without views."""
    model = llama_1b_vocab_model(8, vocab=vocab, hidden=64)
    case = random_case(torch.tensor([[1] * 16]), n_positions, vocab)
    lens = LayerIGLens.from_model(model, max_chunk_bytes=budget_mib * MIB)
    points, logits = capture_path(model, list(range(8)), case)
    points = points[:, :-1].contiguous()  # the top is valued by the model's logits
    score = TokenScore.build(case.targets[0])
    rows = lens.readout.rows_per_chunk()
    k = points.shape[1]
    out: Dict[str, Any] = dict(V=vocab, T=n_positions, k=k, budget_mib=budget_mib)
    out["materialised_mib"] = n_positions * k * vocab * 4 / MIB

    def final(part: slice) -> torch.Tensor:
        return logits[part].float()

    def peak(name: str, function: Callable[[], Any]) -> None:
        before = _status_kib("VmRSS")
        out["resettable"] = _reset_peak()
        function()
        out[name] = (_status_kib("VmHWM") - before) / 1024

    with torch.inference_mode():
        peak("no views", lambda: path_values(lens.readout, points, score, rows))
        peak(
            "views, top_k=10",
            lambda: path_values(lens.readout, points, score, rows, 10, final),
        )
    return out


def bench_memory(vocabs: List[int], budget_mib: int) -> List[Dict[str, Any]]:
    found = []
    for vocab in vocabs:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(vocab), str(budget_mib)],
            capture_output=True,
            text=True,
            check=True,
        )
        found.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--shape", default="", help="a benchmarks/scale.py shape")
    parser.add_argument("--memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        vocab, budget = args.memory_child
        print(json.dumps(memory_child(vocab, 512, budget)))
        return
    model = args.shape or "default model"
    print(f"== speed: {model}, T=64, every block (CPU seconds, {args.threads} thread)")
    for name, value in bench_speed(3 if args.quick else 7, args.shape).items():
        goal = "  (goal <= 1.10)" if "/" in name else ""
        print(f"  {name:<24} {value:8.3f}{goal}")
    print("== one readout chunk of the default model (CPU ms, 1 thread)")
    for name, value in bench_breakdown(3 if args.quick else 5).items():
        print(f"  {name:<24} {value:8.1f}")
    if args.skip_memory:
        return
    vocabs = [128256] if args.quick else [128256, 262144]
    print(f"== memory: T=512, d=64, 8 blocks; budget {args.budget_mib} MiB")
    for out in bench_memory(vocabs, args.budget_mib):
        print(
            f"  V={out['V']}: readout of {out['T'] * out['k']} points, peak above "
            f"the RSS before (MiB): no views {out['no views']:.0f}, views "
            f"{out['views, top_k=10']:.0f}; budget {out['budget_mib']}; all "
            f"logits would be {out['materialised_mib']:.0f}"
            + ("" if out["resettable"] else " (VmHWM not resettable)")
        )


if __name__ == "__main__":
    main()
