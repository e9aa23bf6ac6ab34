r"""
Where a map's memory peak comes from: the tensors alive at the peak of one
``attribute_map`` call, grouped by the code that allocated them, beside the
call's peak resident memory (which also counts what the C allocator and the
matrix-product library hold outside PyTorch's tensors).

    python benchmarks/peak_breakdown.py --shape llama-1b --dtype bfloat16 \
        --granularity neuron
    python benchmarks/peak_breakdown.py --shape default --granularity head   # SmolLM2

The model is a random one of a ``scale.py`` shape (``--max-layers`` cuts it), or
the embedded default model (``--shape default``, the answer to ``--prompt``).
The call runs twice: once for its peak resident memory (``VmHWM``, reset before
it), once under the PyTorch profiler, whose allocation events give the tensors
alive at the largest total and, for each, the innermost ``captum_iglens``
frames and the operator that allocated it. The profiler keeps every Python
call of the map in memory (gigabytes for a neuron map of 28 blocks): cut long
maps with ``--max-layers``; what one readout chunk and one block hold does not
depend on how many blocks there are.
"""

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

from captum_iglens import LayerIGLens
from captum_iglens._utils.allocator import return_freed_memory
from scale import (  # benchmarks/scale.py
    ANSWER,
    DTYPES,
    MIB,
    SHAPES,
    build,
    inputs,
    last_positions,
    measure,
)

PROMPT = "What is the capital of France?"


def _call(args: argparse.Namespace) -> Tuple[Callable[[], Any], LayerIGLens]:
    """The map call to measure, and its lens."""
    if args.shape == "default":
        from captum_iglens.hf.models import load_default
        from captum_iglens.hf.text import answered_prompt

        model, tokenizer = load_default()
        ids, positions, target, _ = answered_prompt(model, tokenizer, args.prompt)
    else:
        model = build(args.shape, DTYPES[args.dtype], max_layers=args.max_layers)
        ids, following = inputs(model, args.length)
        positions = last_positions(args.length, ANSWER)
        target = following[:, positions]
    lens = LayerIGLens.from_model(model, max_chunk_bytes=args.chunk_mib * MIB)
    return (
        lambda: lens.attribute_map(
            ids,
            target=target,
            positions=positions,
            granularity=args.granularity,
            n_steps=args.n_steps,
        )
    ), lens


def live_at_peak(events: List[Dict]) -> Tuple[int, float, Dict[int, Tuple[int, float]]]:
    r"""
    The largest total of tensor bytes allocated and not freed, from a Chrome
    trace's ``[memory]`` events (``Addr``, ``Bytes``: negative when freed).

    Returns:
        3-element tuple: the peak total in bytes, its time stamp, and the
        tensors alive then, ``{address: (bytes, time stamp of the allocation)}``.
    """
    live: Dict[int, Tuple[int, float]] = {}
    total, best, when, alive = 0, 0, 0.0, {}
    memory = [e for e in events if e.get("name") == "[memory]"]
    for event in sorted(memory, key=lambda e: e["ts"]):
        address, size = event["args"]["Addr"], event["args"]["Bytes"]
        total += size
        if size > 0:
            live[address] = (size, event["ts"])
        else:
            live.pop(address, None)
        if total > best:
            best, when, alive = total, event["ts"], dict(live)
    return best, when, alive


def allocated_by(events: List[Dict], stamp: float) -> str:
    """The innermost ``captum_iglens`` frames (up to three) and the operator
    running at ``stamp``."""
    spans = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X" and e["ts"] <= stamp <= e["ts"] + e["dur"]
        ),
        key=lambda e: e["ts"],
    )
    frames = [
        e["name"].split("captum_iglens/")[-1]
        for e in spans
        if e.get("cat") == "python_function" and "captum_iglens/" in e["name"]
    ]
    operators = [e["name"] for e in spans if e.get("cat") == "cpu_op"]
    return " > ".join(frames[-3:]) + (f" | {operators[-1]}" if operators else "")


def breakdown(
    call: Callable[[], Any], smallest: int
) -> Tuple[int, List[Tuple[str, int]]]:
    """The profiler's peak of tensor bytes during ``call()`` and the tensors
    alive then, grouped by where they were allocated (those under ``smallest``
    bytes as one group), largest first."""
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True
    ) as found:
        call()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        found.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    peak, when, alive = live_at_peak(events)
    groups: Counter = Counter()
    for size, stamp in alive.values():
        where = allocated_by(events, stamp) if size >= smallest else "smaller buffers"
        groups[where] += size
    return peak, groups.most_common()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "default"], default="default")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--granularity", default="head")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--max-layers", type=int, default=0)
    parser.add_argument("--n-steps", type=int, default=8)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument(
        "--group-kib",
        type=int,
        default=1024,
        help="tensors under this size are one group",
    )
    args = parser.parse_args()
    return_freed_memory()  # as the CLI does: freed chunks leave the RSS
    torch.set_num_threads(args.threads)
    call, lens = _call(args)
    _, resident, _ = measure(call, "cpu")
    peak, groups = breakdown(call, args.group_kib * 2**10)
    name = args.shape if args.shape == "default" else f"{args.shape} {args.dtype}"
    print(
        f"{name}, granularity={args.granularity}, {len(lens.layers)} blocks, "
        f"n_steps={args.n_steps}, chunk budget {args.chunk_mib} MiB"
    )
    print(f"peak resident memory above the call's start: {resident / MIB:8.1f} MiB")
    print(f"peak of live tensors (profiler):              {peak / MIB:8.1f} MiB")
    for where, size in groups:
        print(f"{size / MIB:8.1f} MiB  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
