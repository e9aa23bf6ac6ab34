r"""
The cost of a half-precision model on the CPU: the head and source maps
(``attribute_map``, prediction-aware) of the default model loaded in float16
against the same maps in float32, on the model's answer to a prompt. The
splits read through a float32 copy of the readout on the CPU, so the goal is a
ratio near 1 (before, about 30). Each run is its own child process:

    python benchmarks/bench_half.py                  # n_steps=16
    python benchmarks/bench_half.py --n-steps 50 --repeats 3 --dtype bfloat16

Prints the median CPU time of each map in each dtype and the ratio half /
float32 per granularity.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from captum_iglens import LayerIGLens
from captum_iglens.hf.models import load_default
from captum_iglens.hf.text import answered_prompt

PROMPT = "What is the capital of France?"
GRANULARITIES = ("head", "source")


def _child(granularity: str, dtype: str, n_steps: int, repeats: int) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_default(dtype=getattr(torch, dtype), progress=False)
    ids, positions, targets, _ = answered_prompt(model, tokenizer, PROMPT)
    lens = LayerIGLens.from_model(model)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        lens.attribute_map(
            ids,
            target=targets,
            positions=positions,
            granularity=granularity,
            n_steps=n_steps,
        )
        times.append(time.process_time() - start)
    print(json.dumps(dict(seconds=statistics.median(times), positions=len(positions))))


def _run(granularity: str, dtype: str, args: argparse.Namespace) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            granularity,
            "--dtype",
            dtype,
            "--n-steps",
            str(args.n_steps),
            "--repeats",
            str(args.repeats),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--dtype", choices=("float16", "bfloat16", "float32"), default="float16"
    )
    parser.add_argument("--child", choices=GRANULARITIES)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.dtype, args.n_steps, args.repeats)
        return
    print(
        f"default model, {PROMPT!r}, n_steps={args.n_steps}, 1 thread, CPU time, "
        f"median of {args.repeats}"
    )
    for granularity in GRANULARITIES:
        half = _run(granularity, args.dtype, args)
        full = _run(granularity, "float32", args)
        print(
            f"granularity={granularity!r}: {args.dtype} {half['seconds']:7.2f} s, "
            f"float32 {full['seconds']:7.2f} s ({half['positions']} positions); "
            f"ratio {half['seconds'] / full['seconds']:.2f} (goal about 1)"
        )


if __name__ == "__main__":
    main()
