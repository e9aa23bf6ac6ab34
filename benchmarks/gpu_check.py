r"""
IG-Lens map against its floor on one CUDA GPU, for a random model of the shape of
Llama-3.2-1B (16 blocks, d = 2048, V = 128256, tied embeddings), at T = 1024
answer positions and k = 16 layers, in float32, TF32 and bfloat16:

    python benchmarks/gpu_check.py      # about a minute on an H200, with the build
    python benchmarks/gpu_check.py --smoke --device cpu   # a tiny dry run of the script

The floor is one forward pass plus one :meth:`Readout.log_prob` of all
``T·(k+1)`` path points, as in ``benchmarks/bench.py``. Times are medians of 5
runs after a warm-up, with ``torch.cuda.synchronize()``; peaks are
``torch.cuda.max_memory_allocated`` above the memory in use before the call.
Nothing is downloaded.
"""

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from captum_iglens import LayerIGLens

N_POSITIONS, PROMPT_LENGTH, REPEATS = 1024, 16, 5
MIB = 2**20


def build(device: torch.device, smoke: bool) -> Any:
    """The random Llama-3.2-1B-shaped model (tiny with ``smoke``) on ``device``."""
    shape = dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    )
    if smoke:
        shape = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    config = LlamaConfig(
        vocab_size=128256,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        **shape,
    )
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def measure(function: Callable[[], Any], device: torch.device) -> Dict[str, float]:
    """Median seconds over REPEATS runs after one warm-up, and the peak memory (MiB)."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    function()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    times: List[float] = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return {
        "s": statistics.median(times),
        "peak_mib": (
            (torch.cuda.max_memory_allocated() - before) / MIB if cuda else float("nan")
        ),
    }


def check(model: Any, chunk_mib: int, n_positions: int) -> Dict[str, float]:
    lens = LayerIGLens.from_model(model, max_chunk_bytes=chunk_mib * MIB)
    device = model.device
    generator = torch.Generator().manual_seed(0)
    length = PROMPT_LENGTH + n_positions
    ids = torch.randint(100, model.config.vocab_size, (1, length), generator=generator)
    positions = torch.arange(PROMPT_LENGTH - 1, length - 1)
    ids, targets = ids.to(device), ids[:, positions + 1].to(device)
    with torch.inference_mode():
        states = model(ids, output_hidden_states=True, use_cache=False).hidden_states
        rows = (
            torch.stack(states, dim=2)[0, positions.to(device)]
            .flatten(0, 1)
            .contiguous()
        )
        row_targets = targets[0].repeat_interleave(len(states))
        del states

    def forward() -> None:
        with torch.inference_mode():
            model(ids, use_cache=False)

    def readout() -> None:
        with torch.inference_mode():
            lens.readout.log_prob(rows, row_targets)

    def attribute_map() -> Any:
        return lens.attribute_map(ids, target=targets, positions=positions)

    out = {
        name: measure(f, device)
        for name, f in (
            ("forward", forward),
            ("readout", readout),
            ("map", attribute_map),
        )
    }
    delta = attribute_map().delta.abs().max().item()
    floor = out["forward"]["s"] + out["readout"]["s"]
    return {
        "forward_s": out["forward"]["s"],
        "readout_s": out["readout"]["s"],
        "map_s": out["map"]["s"],
        "ratio": out["map"]["s"] / floor,
        "fwd_peak": out["forward"]["peak_mib"],
        "ro_peak": out["readout"]["peak_mib"],
        "map_peak": out["map"]["peak_mib"],
        "delta": delta,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--positions", type=int, default=N_POSITIONS)
    parser.add_argument("--smoke", action="store_true", help="a tiny model (dry run)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    began = time.perf_counter()
    model = build(device, args.smoke)
    k = model.config.num_hidden_layers
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    print(
        f"{name}, torch {torch.__version__}; random Llama-3.2-1B-shaped model "
        f"{'(SMOKE: tiny) ' if args.smoke else ''}built in "
        f"{time.perf_counter() - began:.0f}s; T={args.positions}, k={k}, rows "
        f"T(k+1)={args.positions * (k + 1)}; chunk budget in MiB; peaks (pk) in MiB "
        "above "
        "the memory in use before the call; target: map/floor <= 1.15"
    )
    head = (
        "mode",
        "chunk",
        "fwd s",
        "readout s",
        "map s",
        "map/floor",
        "fwd pk",
        "ro pk",
        "map pk",
        "max|delta|",
    )
    print(" ".join(f"{h:>10}" for h in head))
    for mode in ("float32", "tf32", "bfloat16"):
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        if mode == "bfloat16":
            model.to(torch.bfloat16)
        for chunk_mib in (256, 2048):
            r = check(model, chunk_mib, args.positions)
            print(
                f"{mode:>10} {chunk_mib:>10} {r['forward_s']:>10.4f} "
                f"{r['readout_s']:>10.4f} "
                f"{r['map_s']:>10.4f} {r['ratio']:>10.3f} {r['fwd_peak']:>10.0f} "
                f"{r['ro_peak']:>10.0f} {r['map_peak']:>10.0f} {r['delta']:>10.1e}",
                flush=True,
            )
    print(f"total {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
