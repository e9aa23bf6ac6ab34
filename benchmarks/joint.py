r"""
The joint path against the telescoping one, on an embedded model's answer to a
prompt: how fast its per-block credits converge in ``n_steps``, and what its
maps cost beside the telescoping maps at the same ``n_steps``.

    python benchmarks/joint.py                        # smollm2, both parts
    python benchmarks/joint.py --model gemma3 --part convergence
    python benchmarks/joint.py --part reads --n-steps 50

Reads: the joint neuron and source maps with their components read through
their own products (as the library does) against the same maps with the
components built as ``(rows, columns, d)`` arrays, alternating, in this process.

Convergence: per-block credits (prediction-aware) at 4, 8, 16, 32, 64 and 128
steps against 512 steps: the largest and the mean ``|credit - credit_512|`` over
the answer tokens and blocks, and the largest ``|Σ - Δp|`` (exact at any
``n_steps``). Cost: the median wall time of each map over ``--repeats`` runs in
this process, and the ratio joint / telescoping per granularity (the goals: the
block map within 2×, the head, source and neuron maps at least 5× cheaper).
"""

import argparse
import statistics
import time
from typing import Any, Callable, Dict

import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.granularities.neurons import NeuronComponents
from captum_iglens.attr.granularities.source_terms import SourceComponents
from captum_iglens.hf.models import load_embedded
from captum_iglens.hf.text import answered_prompt

PROMPT = "What is the capital of France?"
STEPS = (4, 8, 16, 32, 64, 128)
REFERENCE = 512


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def convergence(lens: LayerIGLens, kwargs: Dict[str, Any]) -> None:
    def credits(n_steps: int) -> Any:
        return lens.attribute_map(path="joint", n_steps=n_steps, **kwargs)

    reference = credits(REFERENCE)
    real = reference.mask
    print(f"n_steps | max |credit - credit_{REFERENCE}| | mean | max |Σ - Δp|")
    for n_steps in STEPS:
        found = credits(n_steps)
        error = (found.attributions - reference.attributions)[real].abs()
        change = found.model_prob - found.base_prob
        residual = (found.total - change)[real].abs().max()
        print(f"{n_steps:7d} | {error.max():.2e} | {error.mean():.2e} | {residual:.1e}")


def cost(lens: LayerIGLens, kwargs: Dict[str, Any], n_steps: int, repeats: int) -> None:
    print(f"n_steps={n_steps}")
    print("granularity | telescoping s | joint s | joint / telescoping")
    for granularity in ("block", "head", "source", "neuron"):
        seconds = {
            path: _median_seconds(
                lambda: lens.attribute_map(
                    path=path, granularity=granularity, n_steps=n_steps, **kwargs
                ),
                repeats,
            )
            for path in ("telescoping", "joint")
        }
        ratio = seconds["joint"] / seconds["telescoping"]
        print(
            f"{granularity:11s} | {seconds['telescoping']:13.2f} | "
            f"{seconds['joint']:7.2f} | {ratio:.2f}"
        )


def reads(
    lens: LayerIGLens, kwargs: Dict[str, Any], n_steps: int, repeats: int
) -> None:
    print(f"n_steps={n_steps}")
    print("granularity | read s | built s | read / built | max |difference|")
    for granularity, kind in (
        ("neuron", NeuronComponents),
        ("source", SourceComponents),
    ):
        own = {name: getattr(kind, name) for name in ("dots", "norms")}

        def joint_map() -> Any:
            return lens.attribute_map(
                path="joint", granularity=granularity, n_steps=n_steps, **kwargs
            )

        for _ in range(repeats):
            start = time.perf_counter()
            read = joint_map()
            read_s = time.perf_counter() - start
            for name in own:  # the component reads fall back to building rows
                delattr(kind, name)
            try:
                start = time.perf_counter()
                built = joint_map()
                built_s = time.perf_counter() - start
            finally:
                for name, method in own.items():
                    setattr(kind, name, method)
            gap = (read.attributions - built.attributions).abs().max()
            print(
                f"{granularity:11s} | {read_s:6.2f} | {built_s:7.2f} | "
                f"{read_s / built_s:12.2f} | {gap:.1e}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    parser.add_argument(
        "--part", choices=("convergence", "cost", "reads", "both"), default="both"
    )
    parser.add_argument("--n-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = load_embedded(args.model)
    ids, positions, targets, _ = answered_prompt(model, tokenizer, PROMPT)
    lens = LayerIGLens.from_model(model)
    kwargs = dict(inputs=ids, target=targets, positions=positions)
    print(
        f"{args.model}: {PROMPT!r}, {len(positions)} answer tokens, torch threads "
        f"{torch.get_num_threads()}"
    )
    if args.part in ("convergence", "both"):
        convergence(lens, kwargs)
    if args.part in ("cost", "both"):
        cost(lens, kwargs, args.n_steps, args.repeats)
    if args.part == "reads":
        reads(lens, kwargs, args.n_steps, args.repeats)


if __name__ == "__main__":
    main()
