r"""
IG-Lens at the paper's scale: random models built from the configs of
Llama-3.2-1B, Qwen2.5-1.5B, Gemma 2 2B and Llama-3.1-8B (cut to 2 blocks, so that
the per-block costs of ``d = 4096`` and a 128k vocabulary show), nothing
downloaded. Random weights reproduce the cost and memory of the real shapes, and
exactness does not depend on the weights.

    python benchmarks/scale.py                                  # every shape, T, dtype
    python benchmarks/scale.py --shapes llama-1b --lengths 128 --dtypes float32
    python benchmarks/scale.py --shapes gemma2-2b --dtypes bfloat16 --max-layers 4

Each (shape, dtype) runs in its own child process, ``--jobs`` of them at once,
each timed by its own clock. With ``--jobs`` above 1, a (shape, dtype) whose weights
take over a third of the machine's physical memory runs alone first,
and a child killed beside another (as by the out-of-memory killer) runs again alone
at the end. Per input length ``T`` it measures the main map (``attribute_map``,
prediction-aware, block granularity) over all positions (``--map-positions answer``:
the last 8 only; ``--map-positions 1024``: every position up to ``T = 1024``, the
last 8 above) and the
``head``, ``source`` and ``neuron`` maps of the last 8 positions (the "answer"),
and prints one table from that run:

- ``s``: CPU time of the call (``--clock wall`` for wall-clock);
- ``floor``: the cost model, one forward pass plus one readout of every path
  point the map reads (``P·(k+1)`` rows), timed in the same process;
- ``×floor``: their ratio (goal for the main map: at most 1.15; the component
  maps integrate ``n_steps`` gradients per split segment on top);
- ``fwd MiB``: the peak resident memory of a plain inference forward of the
  input above the memory resident before it (activations, attention, logits);
- ``+MiB``: the peak of the call above the memory resident before it, minus the
  forward's (``/proc/self/status`` ``VmHWM``, reset before each);
- ``budget``: the readout's chunk budget plus what the granularity must keep
  (the head outputs; the attention rows and values; the neurons' activations);
- ``|Σ−Δp|``: the largest completeness error of the map.
"""

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch.nn import Module

from bench import _reset_peak as reset_vmhwm, _status_kib  # benchmarks/bench.py
from captum_iglens import LayerIGLens
from captum_iglens._utils.allocator import return_freed_memory

MIB = 2**20
ANSWER = 8

#: config class, then its arguments (from the models' published configs).
SHAPES: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "tiny": (
        "LlamaConfig",
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
        ),
    ),
    "llama-1b": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            rope_theta=500000.0,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
    ),
    "qwen2.5-1.5b": (
        "Qwen2Config",
        dict(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
        ),
    ),
    "gemma2-2b": (
        "Gemma2Config",
        dict(
            vocab_size=256000,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=4096,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
    ),
    # Llama-3.1-8B's blocks and vocabulary, 2 blocks; the embeddings are tied
    # (the real model's are not) so that fp32 fits in 8 GB: the same costs.
    "llama-8b-2l": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=500000.0,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
    ),
}
GRANULARITIES = ("block", "head", "source", "neuron")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(
    shape: str, dtype: torch.dtype, device: Any = "cpu", max_layers: int = 0
) -> Module:
    r"""
    The random model of ``shape`` (a key of :data:`SHAPES`), in
    ``dtype`` on ``device`` (a device or accelerate's ``device_map`` dict), cut
    to ``max_layers`` blocks when that is positive; seeded, so every run builds
    the same weights.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    name, kwargs = SHAPES[shape]
    kwargs = dict(kwargs)
    if max_layers > 0:
        kwargs["num_hidden_layers"] = min(kwargs["num_hidden_layers"], max_layers)
    config = getattr(transformers, name)(**kwargs)
    torch.manual_seed(0)
    with torch.device(device if isinstance(device, (str, torch.device)) else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def inputs(model: Module, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(1, T)`` and their next tokens ``(1, T - 1)``."""
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(3, model.config.vocab_size, (1, length), generator=generator)
    return ids, ids[:, 1:]


def last_positions(length: int, n: int) -> torch.Tensor:
    """The last ``n`` positions that have a next token (at most ``T - 1``), ``(n,)``."""
    n = min(n, length - 1)
    return torch.arange(length - 1 - n, length - 1)


def _reset_peak() -> None:
    """Frees what the allocator holds, then resets ``VmHWM`` to the RSS."""
    gc.collect()
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    reset_vmhwm()


def measure(function: Callable[[], Any], clock: str) -> Tuple[float, int, Any]:
    """Seconds, the peak resident bytes of the call above the memory resident
    before it, and its result."""
    tick = time.process_time if clock == "cpu" else time.perf_counter
    _reset_peak()
    resident = _status_kib("VmRSS")
    start = tick()
    out = function()
    return tick() - start, (_status_kib("VmHWM") - resident) * 1024, out


def captured_bytes(config: Any, k: int, granularity: str, n: int, length: int) -> int:
    """What the granularity must keep beyond the path states, float32 bytes."""
    d, heads = config.hidden_size, config.num_attention_heads
    if granularity == "head":
        return 4 * n * k * (heads + 1) * d
    if granularity == "source":
        e = getattr(config, "head_dim", None) or d // heads
        kv = config.num_key_value_heads
        return 4 * k * (n * heads * length + kv * length * e)
    if granularity == "neuron":
        return 4 * n * k * config.intermediate_size
    return 0


def child(args: argparse.Namespace, shape: str, dtype_name: str) -> List[Dict]:
    return_freed_memory()  # as the CLI does: freed chunks leave the RSS
    torch.set_num_threads(args.threads)
    model = build(shape, DTYPES[dtype_name], max_layers=args.max_layers)
    lens = LayerIGLens.from_model(model, max_chunk_bytes=args.chunk_mib * MIB)
    k = len(lens.layers)
    rows = []
    for length in args.lengths:
        ids, following = inputs(model, length)

        with torch.inference_mode():
            out = model(ids, use_cache=False, output_hidden_states=True)
        states = torch.stack(out.hidden_states, 2)[0]  # (T, k + 1, d)
        del out

        def forward() -> None:
            with torch.inference_mode():
                model(ids, use_cache=False)

        fwd_s, fwd_peak, _ = measure(forward, args.clock)
        for granularity in args.granularities:
            every = granularity == "block" and length <= args.map_positions
            positions = last_positions(length, length - 1 if every else ANSWER)
            n = len(positions)
            target = following[:, positions]
            path = states[positions].flatten(0, 1).contiguous()
            flat = target[0].repeat_interleave(k + 1)
            with torch.inference_mode():
                read_s = measure(lambda: lens.readout.log_prob(path, flat), args.clock)[
                    0
                ]
            try:
                map_s, map_peak, result = measure(
                    lambda: lens.attribute_map(
                        ids,
                        target=target,
                        positions=positions,
                        granularity=granularity,
                        n_steps=args.n_steps,
                    ),
                    args.clock,
                )
                delta = float(result.delta.abs().max())
            except (RuntimeError, MemoryError) as error:  # out of memory
                map_s, map_peak, delta = float("nan"), 0, float("nan")
                print(f"{shape} {granularity} T={length}: {error}", file=sys.stderr)
            rows.append(
                dict(
                    shape=shape,
                    dtype=dtype_name,
                    k=k,
                    T=length,
                    granularity=granularity,
                    P=n,
                    fwd_s=fwd_s,
                    floor_s=fwd_s + read_s,
                    map_s=map_s,
                    fwd_mib=fwd_peak / MIB,
                    extra_mib=(map_peak - fwd_peak) / MIB,
                    budget_mib=(
                        args.chunk_mib * MIB
                        + captured_bytes(model.config, k, granularity, n, length)
                    )
                    / MIB,
                    delta=delta,
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del states
    return rows


def table(rows: Sequence[Dict]) -> str:
    head = (
        f"{'shape':<13}{'dtype':<9}{'k':>3}{'T':>6} {'gran':<7}{'P':>5}"
        f"{'fwd s':>8}{'floor s':>9}{'map s':>9}{'×floor':>8}"
        f"{'fwd MiB':>9}{'+MiB':>8}{'budget':>8}{'|Σ−Δp|':>10}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['shape']:<13}{r['dtype']:<9}{r['k']:>3}{r['T']:>6} "
            f"{r['granularity']:<7}{r['P']:>5}{r['fwd_s']:>8.2f}{r['floor_s']:>9.2f}"
            f"{r['map_s']:>9.2f}{r['map_s'] / r['floor_s']:>8.2f}"
            f"{r['fwd_mib']:>9.0f}{r['extra_mib']:>8.0f}{r['budget_mib']:>8.0f}"
            f"{r['delta']:>10.1e}"
        )
    return "\n".join(lines)


def _all_positions_up_to(value: str) -> float:
    """``all``, ``answer`` or the longest ``T`` whose main map reads every position."""
    if value in ("all", "answer"):
        return float("inf") if value == "all" else 0
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected all, answer or a length: {value!r}")


def weight_bytes(shape: str, dtype: str) -> int:
    """The bytes of the weights of ``shape`` in ``dtype`` (built on the meta device)."""
    model = build(shape, DTYPES[dtype], device="meta")
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _run_child(passed: List[str], shape: str, dtype: str) -> Tuple[int, List[Dict]]:
    """The exit status and rows of one (shape, dtype), run in a child process."""
    done = subprocess.run(
        [sys.executable, __file__, *passed, "--child", shape, dtype],
        stdout=subprocess.PIPE,
        text=True,
    )
    if done.returncode:
        print(f"{shape} {dtype}: exit {done.returncode}", file=sys.stderr)
        return done.returncode, []
    return 0, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES)[1:])
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 1024, 4096])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--granularities", nargs="+", default=list(GRANULARITIES))
    parser.add_argument(
        "--map-positions",
        type=_all_positions_up_to,
        default="all",
        metavar="all|answer|T",
        help="the main map reads every position (at T up to this), else the last 8",
    )
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--max-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="children at once")
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "DTYPE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args, *args.child)))
        return 0
    passed = [a for a in sys.argv[1:]]
    pairs = [(shape, dtype) for shape in args.shapes for dtype in args.dtypes]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    alone = [p for p in pairs if args.jobs > 1 and 3 * weight_bytes(*p) > memory]
    runs = {pair: _run_child(passed, *pair) for pair in alone}
    rest = [pair for pair in pairs if pair not in runs]
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        runs.update(zip(rest, pool.map(lambda pair: _run_child(passed, *pair), rest)))
    for pair in rest:
        if runs[pair][0] < 0 and args.jobs > 1:  # killed (out of memory beside another)
            print(f"{' '.join(pair)}: again, alone", file=sys.stderr)
            runs[pair] = _run_child(passed, *pair)
    rows = [row for pair in pairs for row in runs[pair][1]]
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.clock} time, "
        f"n_steps={args.n_steps}, chunk budget {args.chunk_mib} MiB"
        + (f", cut to {args.max_layers} blocks" if args.max_layers else "")
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
