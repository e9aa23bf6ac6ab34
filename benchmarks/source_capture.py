r"""
Peak memory of the source granularity's capture forward at long inputs:

    python benchmarks/source_capture.py                      # T = 4096 and 8192
    python benchmarks/source_capture.py --lengths 2048 16384

On the ``tiny`` shape of ``benchmarks/scale.py`` (random Llama, ``d = 64``, 2
blocks, 4 heads), one process, glibc's ``mmap`` threshold fixed as the command
line fixes it (freed arrays go back to the system), it prints the peak resident
memory of one forward under :class:`AttentionCapture` (8 attributed rows kept)
and of one plain forward, each above the resident memory just before it.
The capture's chunked eager attention holds about ``CHUNK_BYTES`` of weights at
once; what grows with ``T²`` beyond that is the additive mask, ``4 T²`` bytes
when built whole (256 MiB at ``T = 8192``).
"""

import argparse
import re
from pathlib import Path

import torch

from scale import _reset_peak, _vmhwm, build, inputs  # the sibling benchmark
from captum_iglens._utils.allocator import return_freed_memory
from captum_iglens.attr._utils.attention import AttentionCapture

MIB = 2**20


def _rss() -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) * 1024 if match else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192])
    args = parser.parse_args()
    torch.set_num_threads(1)
    return_freed_memory()
    model = build("tiny", torch.float32)
    attentions = [layer.self_attn for layer in model.model.layers]
    print("T       plain forward (MiB)   capture forward (MiB)   whole mask (MiB)")
    for length in args.lengths:
        ids, _ = inputs(model, length)
        positions = torch.arange(length - 9, length - 1)
        peaks = []
        with torch.inference_mode():
            model(ids, use_cache=False)  # warm-up
            for capture in (False, True):
                _reset_peak()
                before = _rss()
                if capture:
                    cpu = torch.device("cpu")
                    with AttentionCapture(attentions, [model], positions, cpu):
                        model(ids, use_cache=False)
                else:
                    model(ids, use_cache=False)
                peaks.append((_vmhwm() - before) / MIB)
        mask = 4 * length**2 / MIB
        print(f"{length:<7} {peaks[0]:>19.0f} {peaks[1]:>23.0f} {mask:>18.0f}")


if __name__ == "__main__":
    main()
