r"""
One command for a GPU machine: IG-Lens on the random models of
``benchmarks/scale.py`` (Llama-3.2-1B, Qwen2.5-1.5B, Gemma 2 2B and Llama-3.1-8B
cut to 2 blocks; nothing downloaded), on CUDA, in float32, TF32 and bfloat16,
every granularity, every integration path (``captum_iglens.attr.paths.PATHS``)
and the probability flow's graph (path ``flow``, ``--flow-steps`` steps, queries,
keys and values separate), on one CUDA device and, where the machine has two,
the first shape again with its blocks split across two by accelerate's
``device_map``:

    python benchmarks/gpu_check.py               # about 5-10 minutes on one H100
    python benchmarks/gpu_check.py --shapes llama-1b --modes bfloat16
    python benchmarks/gpu_check.py --dry-run     # a tiny model on the CPU (CI)

After the README's install, it needs nothing else. It prints one table: per
device setup, shape, mode, path and granularity, the map's time (median of
``--repeats`` runs after a warm-up, synchronised), its floor (one forward pass
plus one readout of every path point the map reads, ``P·(k+1)`` rows), their
ratio, the attributed tokens per second, the peak memory above a plain
forward's peak (``torch.cuda.max_memory_allocated``; resident memory on the
CPU), the readout's chunk budget, and ``|Σ − Δp|`` (for the flow the larger of
``|Σ − Δm|`` and the worst conservation error; its floor is ``n_steps + 1``
forward and backward passes of one point, and it runs on one device only).
The main map (block granularity) attributes every position of a ``T``-token
input; the other granularities the last 8 positions. A combination a model
refuses (experts on a dense model; a learned readout on the joint path) is
listed as refused.
``--dry-run`` runs every code path on a tiny model on the CPU, the two-device
setup as a CPU ``device_map`` behind accelerate's hooks.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr.flow import ProbabilityFlow
from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.attr.paths import PATHS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import (  # noqa: E402  (the benchmark beside)
    ANSWER,
    MIB,
    SHAPES,
    build,
    inputs,
    last_positions,
)

MODES = ("float32", "tf32", "bfloat16")


class Clock:
    """Times and peak memory of calls on one device type."""

    def __init__(self, device: torch.device, repeats: int, warm_up: bool) -> None:
        self.cuda = device.type == "cuda"
        self.repeats = repeats
        self.warm_up = warm_up

    def sync(self) -> None:
        if self.cuda:
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)

    def peak(self) -> int:
        if self.cuda:
            return sum(
                torch.cuda.max_memory_allocated(i)
                for i in range(torch.cuda.device_count())
            )
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def reset(self) -> int:
        """Resets the peaks; the memory in use now."""
        if not self.cuda:
            return self.peak()
        used = 0
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
            used += torch.cuda.memory_allocated(index)
        return used

    def run(self, function: Callable[[], Any]) -> Tuple[float, int, Any]:
        """Median seconds (after a warm-up run), the peak bytes above the memory
        in use before, and the last result."""
        if self.warm_up:
            function()
            self.sync()
        before = self.reset()
        times = []
        out = None
        for _ in range(self.repeats):
            start = time.perf_counter()
            out = function()
            self.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times), self.peak() - before, out


def placements(dry_run: bool) -> List[Tuple[str, Any]]:
    """The device setups: one device, and two where there are two (in a dry
    run, the CPU, and the CPU behind accelerate's hooks)."""
    if dry_run:
        return [("cpu", "cpu"), ("cpu x2 (hooks)", "hooks")]
    found: List[Tuple[str, Any]] = [("cuda x1", "cuda:0")]
    if torch.cuda.device_count() >= 2:
        found.append(("cuda x2", "split"))
    return found


def place(model: Any, where: Any) -> Any:
    """The model on ``where``: a device, or its blocks split in two halves
    (``"split"``: ``cuda:0`` and ``cuda:1``; ``"hooks"``: the CPU, behind
    accelerate's alignment hooks) by accelerate's ``dispatch_model``."""
    if where not in ("split", "hooks"):
        return model.to(where)
    from accelerate import dispatch_model

    first, second = (0, 1) if where == "split" else ("cpu", "cpu")
    k = model.config.num_hidden_layers
    device_map: Dict[str, Any] = {
        name: first for name, _ in model.model.named_children() if name != "layers"
    }
    device_map = {f"model.{name}": d for name, d in device_map.items()}
    for i in range(k):
        device_map[f"model.layers.{i}"] = first if i < k // 2 else second
    device_map.update({"model.norm": second, "lm_head": second})
    return dispatch_model(model, device_map, force_hooks=True)


def check_one(
    model: Any,
    lens: LayerIGLens,
    clock: Clock,
    ids: torch.Tensor,
    following: torch.Tensor,
    granularity: str,
    path: str,
    n_steps: int,
) -> Dict[str, Any]:
    """One map against its floor."""
    length = ids.shape[1]
    positions = last_positions(length, length - 1 if granularity == "block" else ANSWER)
    target = following[:, positions]
    k = len(lens.layers)
    with torch.inference_mode():
        states = model(ids, use_cache=False, output_hidden_states=True)
        rows = torch.stack(states.hidden_states, 2)[0, positions.to(ids.device)]
        rows = rows.flatten(0, 1).to(lens.readout.device)
        flat = target[0].repeat_interleave(k + 1).to(lens.readout.device)
        del states

    def forward() -> None:
        with torch.inference_mode():
            model(ids, use_cache=False)

    def readout() -> None:
        with torch.inference_mode():
            lens.readout.log_prob(rows, flat)

    def attribution() -> Any:
        return lens.attribute_map(
            ids,
            target=target,
            positions=positions,
            granularity=granularity,
            path=path,
            n_steps=n_steps,
        )

    fwd_s, fwd_peak, _ = clock.run(forward)
    read_s = clock.run(readout)[0]
    map_s, map_peak, result = clock.run(attribution)
    return dict(
        P=len(positions),
        map_s=map_s,
        floor_s=fwd_s + read_s,
        tokens=len(positions) / map_s,
        extra_mib=(map_peak - fwd_peak) / MIB,
        delta=float(result.delta.abs().max()),
    )


def check_flow(
    model: Any, clock: Clock, ids: torch.Tensor, n_steps: int, chunk_mib: int
) -> Dict[str, Any]:
    """One flow graph (the prompt against its last token changed) against
    ``n_steps + 1`` forward and backward passes of one point."""
    other = ids.clone()
    other[0, -1] = (other[0, -1] + 1) % model.config.vocab_size
    flow = ProbabilityFlow(model)
    embed = model.get_input_embeddings()

    def forward_backward() -> None:
        inputs = embed(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=inputs, use_cache=False).logits[0, -1]
        torch.autograd.grad(logits.float().softmax(-1).max(), inputs)

    def graph() -> Any:
        return flow.attribute(
            ids,
            counterfactual=other,
            n_steps=n_steps,
            qkv=True,
            max_chunk_bytes=chunk_mib * MIB,
        )

    pass_s, pass_peak, _ = clock.run(forward_backward)
    graph_s, graph_peak, result = clock.run(graph)
    return dict(
        P=ids.shape[1],
        map_s=graph_s,
        floor_s=pass_s * (n_steps + 1),
        tokens=ids.shape[1] / graph_s,
        extra_mib=(graph_peak - pass_peak) / MIB,
        delta=max(result.completeness_error, result.conservation_error),
    )


def _row(head: str, r: Dict[str, Any], chunk_mib: int) -> str:
    return (
        f"{head}{r['P']:>5}{r['map_s']:>9.3f}{r['floor_s']:>9.3f}"
        f"{r['map_s'] / r['floor_s']:>8.2f}{r['tokens']:>9.1f}"
        f"{r['extra_mib']:>8.0f}{chunk_mib:>7}{r['delta']:>10.1e}"
    )


def shape_rows(
    args: argparse.Namespace, shape: str, setup: str, where: Any
) -> List[str]:
    """The table's rows of one shape on one device setup, every mode."""
    lines = []
    device = torch.device("cpu" if where in ("cpu", "hooks") else "cuda")
    clock = Clock(device, args.repeats, warm_up=not args.dry_run)
    for mode in args.modes:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
        dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
        model = place(build(shape, dtype, max_layers=args.max_layers), where)
        lens = LayerIGLens.from_model(model, max_chunk_bytes=args.chunk_mib * MIB)
        first = next(model.parameters()).device
        ids, following = inputs(model, args.length)
        ids, following = ids.to(first), following.to(first)
        for path in args.paths:
            for granularity in args.granularities:
                head = f"{setup:<15}{shape:<13}{mode:<9}{path:<12}{granularity:<12}"
                try:
                    r = check_one(
                        model,
                        lens,
                        clock,
                        ids,
                        following,
                        granularity,
                        path,
                        args.n_steps,
                    )
                except ValueError as refused:
                    lines.append(f"{head}refused: {str(refused)[:60]}")
                    print(lines[-1], flush=True)
                    continue
                lines.append(_row(head, r, args.chunk_mib))
                print(lines[-1], flush=True)
        if args.flow_steps and where not in ("split", "hooks"):
            r = check_flow(model, clock, ids, args.flow_steps, args.chunk_mib)
            lines.append(
                _row(
                    f"{setup:<15}{shape:<13}{mode:<9}{'flow':<12}{'edges':<12}",
                    r,
                    args.chunk_mib,
                )
            )
            print(lines[-1], flush=True)
        del model, lens
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model, CPU")
    parser.add_argument("--shapes", nargs="+", default=[s for s in SHAPES][1:])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--granularities", nargs="+", default=list(GRANULARITIES))
    parser.add_argument("--paths", nargs="+", default=list(PATHS))
    parser.add_argument("--length", type=int, default=1024, help="T, tokens")
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument(
        "--flow-steps", type=int, default=4, help="flow graph steps (0: no flow)"
    )
    parser.add_argument("--max-layers", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.shapes, args.length, args.n_steps, args.repeats = ["tiny"], 12, 2, 1
        args.modes = ["float32", "bfloat16"]
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 1
    began = time.perf_counter()
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(
        f"{name} x{torch.cuda.device_count()}, torch {torch.__version__}; "
        f"T={args.length} "
        f"(block: every position; others: the last {ANSWER}), n_steps={args.n_steps}, "
        f"median of {args.repeats}; floor = forward + P(k+1) readouts; +MiB = peak "
        "above a plain forward's; goal for block: ×floor <= 1.15"
    )
    print(
        f"{'devices':<15}{'shape':<13}{'mode':<9}{'path':<12}{'granularity':<12}"
        f"{'P':>5}{'map s':>9}{'floor s':>9}{'×floor':>8}{'tok/s':>9}{'+MiB':>8}"
        f"{'budget':>7}{'|Σ−Δp|':>10}"
    )
    for index, (setup, where) in enumerate(placements(args.dry_run)):
        for shape in args.shapes if index == 0 else args.shapes[:1]:
            shape_rows(args, shape, setup, where)
        if args.dry_run:  # the other setups: one mode is enough to run them
            args.modes = args.modes[:1]
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
