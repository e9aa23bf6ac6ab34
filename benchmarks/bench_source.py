r"""
The cost of ``granularity="source"``: the source map (``attribute_map`` with
``granularity="source"``, prediction-aware) against the head map
(``granularity="head"``) at the same ``n_steps``, on the default model's answer
to a prompt. Each is run in its own child process, so that its peak resident
memory is its own:

    python benchmarks/bench_source.py                 # n_steps=50
    python benchmarks/bench_source.py --n-steps 16 --repeats 3

Prints the median CPU time of each, their ratio (the goal: at most 2), and the
peak resident memory each added over the loaded model, beside the readout's
memory budget and the size of what the source map captures (the attention
weights of the attributed rows and the values, per block).
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
MODES = ("head", "source")


def _child(granularity: str, n_steps: int, repeats: int, threads: int) -> None:
    return_freed_memory()  # as the CLI does: freed chunks leave the RSS
    torch.set_num_threads(threads)
    model, tokenizer = load_default()
    ids, positions, targets, _ = answered_prompt(model, tokenizer, PROMPT)
    lens = LayerIGLens.from_model(model)
    kwargs = dict(target=targets, positions=positions, n_steps=n_steps)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(repeats):
        start = time.process_time()
        lens.attribute_map(ids, granularity=granularity, **kwargs)
        times.append(time.process_time() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    n_heads, blocks, length = lens.block_parts.n_heads, len(lens.layers), ids.shape[1]
    config = model.config
    values = config.num_key_value_heads * getattr(
        config, "head_dim", config.hidden_size // n_heads
    )
    captured = 4 * blocks * length * (n_heads * len(positions) + values)
    print(
        json.dumps(
            dict(
                seconds=statistics.median(times),
                peak_added=peak - before,
                positions=len(positions),
                sources=length,
                budget=lens.readout.max_chunk_bytes,
                captured=captured,
            )
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=MODES)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.n_steps, args.repeats, args.threads)
        return
    found = {}
    for mode in MODES:
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
    heads, sources = found["head"], found["source"]
    print(
        f"default model, {PROMPT!r}: {heads['positions']} answer positions, "
        f"{sources['sources']} sources, n_steps={args.n_steps}, {args.threads} "
        "thread(s), CPU time"
    )
    print(f"attribute_map, granularity='head':   {heads['seconds']:8.2f} s")
    print(f"attribute_map, granularity='source': {sources['seconds']:8.2f} s")
    print(
        f"ratio source map / head map: {sources['seconds'] / heads['seconds']:.2f} "
        "(goal <= 2)"
    )
    print(
        f"peak RSS added: head map {heads['peak_added'] / MIB:.0f} MiB, source map "
        f"{sources['peak_added'] / MIB:.0f} MiB; readout budget "
        f"{sources['budget'] / MIB:.0f} MiB + captured weights and values "
        f"{sources['captured'] / MIB:.1f} MiB"
    )


if __name__ == "__main__":
    main()
