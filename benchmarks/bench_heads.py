r"""
The cost of ``granularity="head"``: the head map (``attribute_map`` with
``granularity="head"``, prediction-aware) against the per-dimension ``attribute``
(``granularity="block"``) at the same ``n_steps``, on the default model's answer to
a prompt. Each is run in its own child process, so that its peak resident memory
is its own:

    python benchmarks/bench_heads.py                 # n_steps=50
    python benchmarks/bench_heads.py --n-steps 16 --repeats 3

Prints the median time of each, their ratio (the goal: at most 1.5), and the peak
resident memory each added over the loaded model, beside the readout's memory
budget and the size of the captured head outputs.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from captum_iglens import LayerIGLens
from captum_iglens._utils.allocator import return_freed_memory
from captum_iglens.hf.models import load_default
from captum_iglens.hf.text import answered_prompt

PROMPT = "What is the capital of France?"
MIB = 2**20


def _child(mode: str, n_steps: int, repeats: int, threads: int) -> None:
    return_freed_memory()  # as the CLI does: freed chunks leave the RSS
    torch.set_num_threads(threads)
    model, tokenizer = load_default()
    ids, positions, targets, _ = answered_prompt(model, tokenizer, PROMPT)
    lens = LayerIGLens.from_model(model)
    kwargs = dict(target=targets, positions=positions, n_steps=n_steps)
    if mode == "head_map":

        def run() -> None:
            lens.attribute_map(ids, granularity="head", **kwargs)

    else:

        def run() -> None:
            lens.attribute(ids, **kwargs)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    split = lens.block_parts
    heads_bytes = (
        len(positions)
        * len(lens.layers)
        * (split.n_heads + 1)
        * model.config.hidden_size
        * 4
    )
    print(
        json.dumps(
            dict(
                seconds=statistics.median(times),
                peak_added=peak - before,
                positions=len(positions),
                budget=lens.readout.max_chunk_bytes,
                heads_bytes=heads_bytes,
            )
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=("head_map", "attribute"))
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.n_steps, args.repeats, args.threads)
        return
    found = {}
    for mode in ("attribute", "head_map"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--n-steps",
                str(args.n_steps),
                "--repeats",
                str(args.repeats),
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        found[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    block, heads = found["attribute"], found["head_map"]
    print(
        f"default model, {PROMPT!r}: {block['positions']} answer positions, "
        f"n_steps={args.n_steps}, {args.threads} thread(s), CPU time"
    )
    print(f"attribute (per dimension, blocks): {block['seconds']:8.2f} s")
    print(f"attribute_map, granularity='head': {heads['seconds']:8.2f} s")
    print(
        f"ratio head map / attribute: {heads['seconds'] / block['seconds']:.2f} "
        "(goal <= 1.5)"
    )
    print(
        f"peak RSS added: attribute {block['peak_added'] / MIB:.0f} MiB, head map "
        f"{heads['peak_added'] / MIB:.0f} MiB; readout budget "
        f"{heads['budget'] / MIB:.0f} MiB + head outputs "
        f"{heads['heads_bytes'] / MIB:.1f} MiB"
    )


if __name__ == "__main__":
    main()
