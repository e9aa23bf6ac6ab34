r"""
The cost of fitting a lens (``captum-iglens fit-lens``) on an embedded model,
against the goal of at most 15 minutes per model on this project's 2-core CPU:

    python benchmarks/bench_fit.py --model smollm2
    python benchmarks/bench_fit.py --model gemma3 --tokens 4032 --threads 1

Prints the wall and CPU time of each stage (sampling and recording the states,
the held-out evaluation, the KL fine-tune when asked for), the total beside the
15-minute goal, the machine's load average at the start and the end (the CPU is
shared with other work: a loaded machine is slower, and says so here), and the
fit's held-out table.
"""

import argparse
import os
import time

import torch

from captum_iglens.hf import model_parts
from captum_iglens.hf.models import load_embedded
from captum_iglens.lens_fit import FitOptions, fit_lens

GOAL_SECONDS = 15 * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    parser.add_argument("--tokens", type=int, default=FitOptions().tokens)
    parser.add_argument("--eval-tokens", type=int, default=FitOptions().eval_tokens)
    parser.add_argument("--length", type=int, default=FitOptions().length)
    parser.add_argument("--batch", type=int, default=FitOptions().batch)
    parser.add_argument("--kl-steps", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads (1 is far faster on a loaded machine: see README)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    model, tokenizer = load_embedded(args.model, progress=False)
    loaded = time.perf_counter() - wall
    options = FitOptions(
        tokens=args.tokens,
        eval_tokens=args.eval_tokens,
        length=args.length,
        batch=args.batch,
        kl_steps=args.kl_steps,
    )
    fitted = fit_lens(model_parts(model), tokenizer, options, model_name=args.model)
    total = time.perf_counter() - wall
    seconds = fitted.report.settings["seconds"]
    print(fitted.report.format_table())
    print(
        f"\n{args.model}: {args.tokens} fitting tokens, {args.eval_tokens} held-out, "
        f"{args.threads} thread(s)"
    )
    print(
        "load "
        + f"{loaded:.1f}s, "
        + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items())
    )
    print(
        f"total {total:.0f}s wall ({total / GOAL_SECONDS:.2f} of the 15-minute goal), "
        f"{time.process_time() - cpu:.0f}s CPU; load average {load_start:.1f} at the "
        f"start, {os.getloadavg()[0]:.1f} at the end (2 cores, shared)"
    )


if __name__ == "__main__":
    main()
