r"""
Benchmarks of IG-Lens on the CPU, all in one process (the memory run in one child
process, so that its peaks are clean):

    python benchmarks/bench.py            # about 4 minutes of CPU time
    python benchmarks/bench.py --quick    # about 1 minute: fewer, smaller cases

It measures, against the cost model of METHOD.md (one forward pass plus
``T·(k+1)`` readouts):

1. ``attribute_map`` (prediction-aware) against the floor, one forward plus one
   batched :meth:`Readout.log_prob` of all ``T·(k+1)`` path points, at
   ``T ∈ {8, 64, 256}`` answer positions and two values of ``n_steps`` (the
   median over rounds of each round's ratio; the map reads out ``T·k`` rows, the
   top point being valued by the model's own logits, so it can beat the floor);
2. a straightforward grid version, written here as the reference, that evaluates
   ``f`` at every grid point of every segment (``T·k·(m+1)`` readouts), on the
   46-token prompt with its 9-token answer: speed-up and largest difference (and,
   at larger ``T``, the speed-up the cost model predicts from the floor's times);
3. Captum's ``LayerIntegratedGradients`` on a few (block, token) pairs,
   extrapolated to the whole map;
4. per-dimension ``attribute`` against one forward and backward of the readout
   per grid point, in batched chunks, and its scaling in ``n_steps``;
5. peak resident memory on a model with a 128k vocabulary at ``T = 512``,
   ``k = 16`` (materialised logits would need about 4.5 GB);
6. precision of bfloat16 and float16 models;
7. scaling in ``T``, ``k``, ``V`` and ``n_steps`` for ours and the straightforward
   version, with log-log slopes next to the cost model's and a plot
   (``benchmarks/scaling.png``).

Times are medians of interleaved repeats (fewer where one run is long). By default
they are the CPU time of this process with one thread, which other jobs on a shared
machine hardly disturb; ``--clock wall --threads N`` measures wall-clock time.
Ratios are computed from times of the same run.
"""

import argparse
import copy
import json
import math
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens import LayerIGLens
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf import encode_prompt, generate, teacher_forcing
from captum_iglens.hf.models import load_default
from captum_iglens.readout import Readout

PROMPT = "What is the capital city of Vietnam? Answer in one short sentence, please."
HERE = Path(__file__).resolve().parent
MIB = 2**20


# ----------------------------------------------------------------------- timing


@dataclass
class Timer:
    """Interleaved, repeated timing with a wall-clock budget per measurement."""

    clock: Callable[[], float]
    repeats: int
    budget_s: float
    min_rounds: int = 1

    def rounds(self, functions: Dict[str, Callable[[], Any]]) -> List[Dict[str, float]]:
        r"""
        Times the functions round-robin: ``repeats`` rounds, fewer (down to
        ``min_rounds``) where the wall-clock budget is spent. The first round is
        a warm-up, discarded, when the budget allows it.

        Returns:
            *list[dict]*: the seconds of each function, one dict per round.
        """
        rounds: List[Dict[str, float]] = []
        start = time.perf_counter()
        while len(rounds) < self.repeats:
            rounds.append(self._round(functions))
            spent = time.perf_counter() - start
            if len(rounds) == 1 and spent * (self.repeats + 1) <= self.budget_s:
                rounds.clear()  # warm-up
            elif spent > self.budget_s and len(rounds) >= self.min_rounds:
                break
        return rounds

    def run(self, functions: Dict[str, Callable[[], Any]]) -> Dict[str, float]:
        """The median seconds of each function over :meth:`rounds`."""
        rounds = self.rounds(functions)
        return {n: statistics.median(r[n] for r in rounds) for n in functions}

    def _round(self, functions: Dict[str, Callable[[], Any]]) -> Dict[str, float]:
        times = {}
        for name, function in functions.items():
            begin = self.clock()
            function()
            times[name] = self.clock() - begin
        return times


@dataclass
class Report:
    """Rows of the final table: a measured value, its target and the verdict."""

    rows: List[Tuple[str, str, str, str]] = field(default_factory=list)
    data: Dict[str, Any] = field(default_factory=dict)

    def add(
        self, what: str, value: str, target: str = "", met: Optional[bool] = None
    ) -> None:
        verdict = "" if met is None else ("met" if met else "MISSED")
        self.rows.append((what, value, target, verdict))
        print(f"  {what:<58} {value:>14} {target:>10} {verdict}", flush=True)

    def table(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        lines = [f"{'measure':<{width}} {'value':>14} {'target':>10}  verdict"]
        lines += [f"{a:<{width}} {b:>14} {c:>10}  {d}" for a, b, c, d in self.rows]
        return "\n".join(lines)


_STARTED = time.perf_counter()


def _section(title: str) -> None:
    print(f"\n== [{time.perf_counter() - _STARTED:.0f}s] {title}", flush=True)


# ------------------------------------------------------------ inputs and paths


@dataclass
class Case:
    """Token ids ``(1, L)``, attributed positions ``(T,)`` and targets ``(1, T)``."""

    ids: Tensor
    positions: Tensor
    targets: Tensor


def answer_case(model: Module, tokenizer: Any) -> Case:
    """The 46-token chat prompt and the model's 9-token greedy answer."""
    prompt_ids = encode_prompt(tokenizer, PROMPT)
    (answer,) = generate(model, tokenizer, [prompt_ids], max_new_tokens=9)
    return Case(*teacher_forcing(prompt_ids, answer))


def random_case(
    prompt_ids: Tensor, n_positions: int, vocab: int, seed: int = 0
) -> Case:
    """The prompt, then ``n_positions`` random tokens attributed by teacher forcing."""
    generator = torch.Generator().manual_seed(seed)
    answer = torch.randint(100, vocab, (n_positions,), generator=generator)
    return Case(*teacher_forcing(prompt_ids, answer))


def spaced_blocks(n_blocks: int, k: int) -> List[int]:
    """``k`` block indices spread evenly over the model, the last one included."""
    return sorted(
        {round(i * (n_blocks - 1) / max(k - 1, 1)) for i in range(k)} | {n_blocks - 1}
    )


def capture_path(
    model: Module, blocks: Sequence[int], case: Case
) -> Tuple[Tensor, Tensor]:
    r"""
    The straightforward way to get the path: hooks on the model's blocks during one
    forward pass.

    Returns:
        2-element tuple of **points** ``(T, k + 1, d)`` (``h_0``, then each chosen
        block's output, at the attributed positions) and **logits** ``(T, V)``.
    """
    layers = model_parts(model).blocks
    states: List[Tensor] = []

    def first_input(
        module: Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> None:
        states.append((args[0] if args else kwargs["hidden_states"])[0])

    def output(module: Module, args: Tuple[Any, ...], out: Any) -> None:
        states.append((out[0] if isinstance(out, tuple) else out)[0])

    handles = [layers[0].register_forward_pre_hook(first_input, with_kwargs=True)]
    handles += [layers[i].register_forward_hook(output) for i in blocks]
    try:
        with torch.inference_mode():
            logits = model(case.ids, use_cache=False).logits[0, case.positions]
    finally:
        for handle in handles:
            handle.remove()
    points = torch.stack([s[case.positions] for s in states], dim=1)
    return points, logits


def straightforward_map(
    model: Module, readout: Readout, blocks: Sequence[int], case: Case, n_steps: int
) -> Tensor:
    r"""
    The reference to beat: the prediction-aware credits computed by evaluating
    ``f`` at every grid point of every segment, ``T·k·(m+1)`` readouts, one batch
    of ``T·(m+1)`` rows per segment, and summing each step's observed change.

    Returns:
        *Tensor* ``(T, k)``: each block's credit at each position.
    """
    points, _ = capture_path(model, blocks, case)
    targets = case.targets[0]
    alphas = torch.linspace(0, 1, n_steps + 1, dtype=points.dtype)[None, :, None]
    credits = []
    with torch.inference_mode():
        for j in range(points.shape[1] - 1):
            start, end = points[:, j : j + 1], points[:, j + 1 : j + 2]
            grid = start + alphas * (end - start)  # (T, m + 1, d)
            values = (
                readout.log_prob(
                    grid.flatten(0, 1), targets.repeat_interleave(n_steps + 1)
                )
                .exp()
                .view(len(targets), -1)
            )
            credits.append(values.diff(dim=1).sum(dim=1))
    return torch.stack(credits, dim=1)


def floor_functions(
    model: Module, readout: Readout, blocks: Sequence[int], case: Case
) -> Dict[str, Callable[[], Any]]:
    """The floor's two parts: one forward pass; one readout of every path point."""
    points, _ = capture_path(model, blocks, case)
    rows = points.flatten(0, 1).contiguous()
    row_targets = case.targets[0].repeat_interleave(points.shape[1])

    def forward() -> None:
        with torch.inference_mode():
            model(case.ids, use_cache=False)

    def readouts() -> None:
        with torch.inference_mode():
            readout.log_prob(rows, row_targets)

    return {"forward": forward, "readout": readouts}


def map_function(lens: LayerIGLens, case: Case, n_steps: int = 50) -> Callable[[], Any]:
    return lambda: lens.attribute_map(
        case.ids, target=case.targets, positions=case.positions, n_steps=n_steps
    )


# ------------------------------------------------------------------- sections


def bench_floor(
    model: Module,
    prompt_ids: Tensor,
    lens: LayerIGLens,
    timer: Timer,
    report: Report,
    sizes: Sequence[Tuple[int, Sequence[int]]],
) -> None:
    _section(
        "attribute_map against the floor (one forward + T·(k+1) readouts); the "
        "median over rounds of map / (forward + readout) of the same round"
    )
    blocks = list(range(len(model_parts(model).blocks)))
    k = len(blocks)
    for n_positions, steps in sizes:
        case = random_case(prompt_ids, n_positions, lens.readout.vocab_size)
        functions = floor_functions(model, lens.readout, blocks, case)
        functions.update({f"map@{m}": map_function(lens, case, m) for m in steps})
        rounds = timer.rounds(functions)
        forward = statistics.median(r["forward"] for r in rounds)
        floor = forward + statistics.median(r["readout"] for r in rounds)
        report.data[f"floor_T{n_positions}"] = rounds
        for m in steps:
            ratio = statistics.median(
                r[f"map@{m}"] / (r["forward"] + r["readout"]) for r in rounds
            )
            report.add(
                f"map/floor T={n_positions} n_steps={m} (floor {floor:.2f}s, "
                f"fwd {forward:.2f}s, {len(rounds)} rounds)",
                f"{ratio:.3f}x",
                "<= 1.15",
                ratio <= 1.15,
            )
        ours = statistics.median(r[f"map@{steps[-1]}"] for r in rounds)
        grid = forward + (floor - forward) * k * 65 / (k + 1)
        report.add(
            f"  grid/ours n_steps=64 at T={n_positions}, PREDICTED by the cost model",
            f"{grid / ours:.1f}x",
        )


def bench_straightforward(
    model: Module,
    case: Case,
    lens: LayerIGLens,
    timer: Timer,
    report: Report,
    steps: Sequence[int],
) -> float:
    _section(
        f"straightforward grid version, T={len(case.positions)}, k={len(lens.layers)}"
    )
    blocks = [int(n) for n in lens.layer_names]
    ours = map_function(lens, case)
    times = timer.run({"ours": ours})
    result = ours()
    for m in steps:
        times.update(
            timer.run(
                {
                    f"grid@{m}": lambda m=m: straightforward_map(
                        model, lens.readout, blocks, case, m
                    )
                }
            )
        )
        reference = straightforward_map(model, lens.readout, blocks, case, m)
        error = (reference - result.attributions[0]).abs().max().item()
        speedup = times[f"grid@{m}"] / times["ours"]
        report.add(
            f"grid/ours n_steps={m} (grid {times[f'grid@{m}']:.2f}s, "
            f"ours {times['ours']:.2f}s)",
            f"{speedup:.1f}x",
            ">= 40" if m == 64 else "",
            speedup >= 40 if m == 64 else None,
        )
        report.add(
            f"  max |grid - ours| n_steps={m}", f"{error:.1e}", "<= 1e-6", error <= 1e-6
        )
    report.data["straightforward"] = times
    return times["ours"]


def bench_lig(
    model: Module,
    case: Case,
    lens: LayerIGLens,
    ours_s: float,
    timer: Timer,
    report: Report,
    n_pairs: int,
) -> None:
    from captum.attr import LayerIntegratedGradients

    n_blocks, n_positions = len(lens.layers), len(case.positions)
    _section(
        f"Captum LayerIntegratedGradients, 16 steps: {n_pairs} of "
        f"{n_blocks}x{n_positions} "
        "(block, token) pairs measured, the whole map extrapolated"
    )
    layers = model_parts(model).blocks
    # The middle of each of n_pairs equal shares of blocks and tokens: the cost of a
    # block's LIG falls with its depth (the backward pass stops at it).
    pairs = [
        (int((i + 0.5) * n_blocks / n_pairs), int((i + 0.5) * n_positions / n_pairs))
        for i in range(n_pairs)
    ]
    per_pair = []
    for block, token in pairs:
        position = int(case.positions[token])

        def probability(ids: Tensor, position: int = position) -> Tensor:
            return model(ids, use_cache=False).logits[:, position].softmax(-1)

        lig = LayerIntegratedGradients(probability, layers[block])
        target = int(case.targets[0, token])
        seconds = timer.run(
            {"lig": lambda: lig.attribute(case.ids, target=target, n_steps=16)}
        )["lig"]
        per_pair.append(seconds)
        print(f"  block {block:>2}, token {token}: {seconds:.2f}s", flush=True)
    whole = statistics.mean(per_pair) * n_blocks * n_positions
    report.data["lig"] = dict(pairs=pairs, per_pair=per_pair, extrapolated=whole)
    report.add(
        f"LIG/ours whole map, EXTRAPOLATED from {n_pairs} pairs ({whole:.0f}s)",
        f"{whole / ours_s:.0f}x",
        ">= 500",
        whole / ours_s >= 500,
    )


def grad_reference(
    model: Module, readout: Readout, case: Case, blocks: Sequence[int], n_steps: int
) -> None:
    """One forward pass, then ``f`` and its gradient at every grid point, in chunks."""
    points, _ = capture_path(model, blocks, case)
    alphas = torch.arange(n_steps, dtype=points.dtype) / n_steps
    start, delta = points[:, :-1], points[:, 1:] - points[:, :-1]
    grid = start[:, :, None] + alphas[:, None] * delta[:, :, None]  # (T, k, m, d)
    rows = torch.cat([grid.flatten(0, 2), points[:, -1]])
    targets = torch.cat(
        [case.targets[0].repeat_interleave(grid.shape[1] * n_steps), case.targets[0]]
    )
    chunk = readout.rows_per_chunk()
    for begin in range(0, rows.shape[0], chunk):
        x = rows[begin : begin + chunk].clone().requires_grad_(True)
        prob = readout.log_prob(x, targets[begin : begin + chunk]).exp()
        torch.autograd.grad(prob.sum(), x)


def bench_per_dimension(
    model: Module,
    prompt_ids: Tensor,
    lens: LayerIGLens,
    timer: Timer,
    report: Report,
    steps: Sequence[int],
    n_positions: int,
) -> None:
    _section(
        f"per-dimension attribute (prediction-aware, IDGI split), T={n_positions}, "
        f"k={len(lens.layers)}, against one forward+backward per grid point"
    )
    case = random_case(prompt_ids, n_positions, lens.readout.vocab_size)
    blocks = [int(n) for n in lens.layer_names]
    ours_times = []
    for m in steps:
        times = timer.run(
            {
                "reference": lambda m=m: grad_reference(
                    model, lens.readout, case, blocks, m
                ),
                "attribute": lambda m=m: lens.attribute(
                    case.ids, target=case.targets, positions=case.positions, n_steps=m
                ),
            }
        )
        ours_times.append(times["attribute"])
        ratio = times["attribute"] / times["reference"]
        report.add(
            f"attribute/fwd+bwd per grid point n_steps={m} ({times['attribute']:.2f}s)",
            f"{ratio:.2f}x",
            "<= 3",
            ratio <= 3,
        )
    slope = _slope(steps, ours_times)
    report.data["per_dimension"] = dict(
        steps=list(steps), seconds=ours_times, slope=slope
    )
    report.add("attribute time vs n_steps, log-log slope", f"{slope:.2f}", "~1 (cost)")


def bench_precision(model: Module, case: Case, report: Report, quick: bool) -> None:
    _section(
        "precision: norm and head in the model's dtype, logits upcast for the softmax"
    )
    blocks = list(range(len(model_parts(model).blocks)))
    for dtype in (torch.float32, torch.bfloat16) + (() if quick else (torch.float16,)):
        typed = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        lens = LayerIGLens.from_model(typed)
        result = lens.attribute_map(
            case.ids, target=case.targets, positions=case.positions
        )
        points, logits = capture_path(typed, blocks, case)
        targets = case.targets[0]
        upcast = copy.deepcopy(lens.readout).float()
        with torch.inference_mode():
            p_model = logits.float().softmax(-1).gather(-1, targets[:, None])[:, 0]
            ours = lens.readout.log_prob(
                points.flatten(0, 1), targets.repeat_interleave(points.shape[1])
            )
            theirs = upcast.log_prob(
                points.flatten(0, 1).float(), targets.repeat_interleave(points.shape[1])
            )
        ours, theirs = (
            ours.exp().view(points.shape[:2]),
            theirs.exp().view(points.shape[:2]),
        )
        name = str(dtype).replace("torch.", "")
        top_ours = (ours[:, -1] - p_model).abs().max().item()
        top_upcast = (theirs[:, -1] - p_model).abs().max().item()
        completeness = result.delta.abs().max().item()
        levels = (ours - theirs).abs().max().item()
        report.data[f"precision_{name}"] = dict(
            completeness=completeness,
            top_ours=top_ours,
            top_upcast=top_upcast,
            levels=levels,
        )
        report.add(
            f"{name}: completeness max |Σ - Δp|",
            f"{completeness:.1e}",
            "<= 1e-6",
            completeness <= 1e-6,
        )
        report.add(
            f"{name}: |f(h_final) - p_model|, readout in model dtype", f"{top_ours:.1e}"
        )
        report.add(
            f"{name}: |f(h_final) - p_model|, upcast readout (= its completeness gap)",
            f"{top_upcast:.1e}",
        )
        report.add(f"{name}: max |f_dtype - f_upcast| over the path", f"{levels:.1e}")
        del typed


# ------------------------------------------------------------------- memory


def _status_kib(key: str) -> int:
    match = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) if match else 0


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def llama_1b_vocab_model(
    n_layers: int, vocab: int = 128256, hidden: int = 256
) -> Module:
    r"""
    A random Llama with the vocabulary (128256) and depth (16 blocks) of
    Llama-3.2-1B, tied embeddings, and a thin hidden size so that it builds and
    runs fast on a CPU. Nothing is downloaded.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def memory_child(n_positions: int, k: int, budget_mib: int) -> Dict[str, Any]:
    """Run in a fresh process: peak RSS of a forward, of the readout and of the map."""
    model = llama_1b_vocab_model(k)
    vocab = model.config.vocab_size
    case = random_case(torch.tensor([[1] * 16]), n_positions, vocab)
    lens = LayerIGLens.from_model(model, max_chunk_bytes=budget_mib * MIB)
    points, _ = capture_path(model, list(range(k)), case)
    rows = points.flatten(0, 1).contiguous()
    row_targets = case.targets[0].repeat_interleave(points.shape[1])
    del points
    out: Dict[str, Any] = dict(
        T=n_positions,
        k=k,
        V=vocab,
        d=model.config.hidden_size,
        budget_mib=budget_mib,
        resettable=True,
        materialised_gb=n_positions * (k + 1) * vocab * 4 / 1e9,
    )

    def peak(name: str, function: Callable[[], Any]) -> None:
        rss = _status_kib("VmRSS")
        out["resettable"] &= _reset_peak()
        function()
        out[name] = (_status_kib("VmHWM") - rss) / 1024  # MiB above the RSS before

    with torch.inference_mode():
        out["model_mib"] = _status_kib("VmRSS") / 1024
        peak("forward", lambda: model(case.ids, use_cache=False))
        peak("readout", lambda: lens.readout.log_prob(rows, row_targets))
        small = rows[: rows.shape[0] // 8]
        peak(
            "readout_eighth",
            lambda: lens.readout.log_prob(small, row_targets[: small.shape[0]]),
        )
    peak(
        "map",
        lambda: lens.attribute_map(
            case.ids, target=case.targets, positions=case.positions
        ),
    )
    return out


def bench_memory(report: Report, n_positions: int, k: int, threads: int) -> None:
    _section(
        "memory: V=128256 (Llama-3.2-1B vocabulary and depth, thin d=256), "
        f"T={n_positions}, "
        f"k={k}; peak RSS above the RSS just before each call (fresh process)"
    )
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-child",
            str(n_positions),
            str(k),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(child.stdout.strip().splitlines()[-1])
    report.data["memory"] = out
    budget = out["budget_mib"]
    if not out["resettable"]:
        print("  (VmHWM could not be reset: peaks are since the process started)")
    report.add("model weights, RSS (MiB)", f"{out['model_mib']:.0f}")
    report.add(
        f"plain forward, peak above the weights (MiB; its logits alone "
        f"{(n_positions + 16) * out['V'] * 4 / MIB:.0f})",
        f"{out['forward']:.0f}",
    )
    for rows, key in (
        (n_positions * (k + 1), "readout"),
        (n_positions * (k + 1) // 8, "readout_eighth"),
    ):
        report.add(
            f"readout.log_prob of {rows} rows, peak (MiB; chunk budget {budget})",
            f"{out[key]:.0f}",
            f"<= {budget}",
            out[key] <= budget * 1.05,
        )
    report.add(
        f"attribute_map, peak above the weights (MiB; materialised logits "
        f"{out['materialised_gb']:.1f} GB)",
        f"{out['map']:.0f}",
    )
    report.add(
        "attribute_map, peak above the plain forward's (MiB)",
        f"{out['map'] - out['forward']:.0f}",
        f"<= {budget}",
        out["map"] - out["forward"] <= budget * 1.05,
    )


# ------------------------------------------------------------------- scaling


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum(
        (a - mx) ** 2 for a in lx
    )


@dataclass
class Sweep:
    """One scaling sweep: measured and cost-model times of ours and of the grid."""

    name: str
    xs: List[float] = field(default_factory=list)
    ours: List[float] = field(default_factory=list)
    grid: List[float] = field(default_factory=list)
    floor: List[float] = field(default_factory=list)
    grid_model: List[float] = field(default_factory=list)


def _sweep_point(
    sweep: Sweep,
    x: float,
    model: Module,
    blocks: List[int],
    case: Case,
    n_steps: int,
    timer: Timer,
) -> None:
    lens = LayerIGLens.from_model(model, blocks)
    k = len(lens.layers)
    functions = floor_functions(model, lens.readout, lens_blocks(lens), case)
    functions["ours"] = map_function(lens, case, n_steps)
    functions["grid"] = lambda: straightforward_map(
        model, lens.readout, lens_blocks(lens), case, n_steps
    )
    times = timer.run(functions)
    sweep.xs.append(x)
    sweep.ours.append(times["ours"])
    sweep.grid.append(times["grid"])
    sweep.floor.append(times["forward"] + times["readout"])
    # The cost model: a forward plus rows × (time of one readout row at this V).
    sweep.grid_model.append(
        times["forward"] + times["readout"] * k * (n_steps + 1) / (k + 1)
    )
    print(
        f"  {sweep.name}={x:g}: ours {times['ours']:.3f}s  grid {times['grid']:.3f}s  "
        f"floor {sweep.floor[-1]:.3f}s",
        flush=True,
    )


def lens_blocks(lens: LayerIGLens) -> List[int]:
    return [int(n) for n in lens.layer_names]


def bench_scaling(
    model: Module, prompt_ids: Tensor, timer: Timer, report: Report, quick: bool
) -> List[Sweep]:
    n_blocks = len(model_parts(model).blocks)
    vocab = model.config.vocab_size
    base_t, base_k, base_m = 16, 8, 8
    grid = {
        "T": (4, 16) if quick else (4, 16, 64),
        "k": (2, 8) if quick else (2, 4, 8, 16, 30),
        "V": (8192, 32768) if quick else (8192, 32768, 131072),
        "n_steps": (1, 16) if quick else (1, 4, 16, 64),
    }
    _section(
        f"scaling (default T={base_t}, k={base_k}, n_steps={base_m}, V={vocab}; "
        "the grid "
        "version at the same n_steps)"
    )
    sweeps = {name: Sweep(name) for name in grid}
    base_case = random_case(prompt_ids, base_t, vocab)
    for t in grid["T"]:
        _sweep_point(
            sweeps["T"],
            t,
            model,
            spaced_blocks(n_blocks, base_k),
            random_case(prompt_ids, t, vocab),
            base_m,
            timer,
        )
    for k in grid["k"]:
        _sweep_point(
            sweeps["k"], k, model, spaced_blocks(n_blocks, k), base_case, base_m, timer
        )
    for m in grid["n_steps"]:
        _sweep_point(
            sweeps["n_steps"],
            m,
            model,
            spaced_blocks(n_blocks, base_k),
            base_case,
            m,
            timer,
        )
    for v in grid["V"]:
        wide = smollm_shaped(model, v, base_k)
        _sweep_point(
            sweeps["V"],
            v,
            wide,
            list(range(base_k)),
            random_case(prompt_ids % v, base_t, v),
            base_m,
            timer,
        )
        del wide
    for sweep in sweeps.values():
        ours, floor = _slope(sweep.xs, sweep.ours), _slope(sweep.xs, sweep.floor)
        grid_s, grid_model = (
            _slope(sweep.xs, sweep.grid),
            _slope(sweep.xs, sweep.grid_model),
        )
        report.data[f"scaling_{sweep.name}"] = sweep.__dict__
        report.add(
            f"slope vs {sweep.name}: ours {ours:.2f} / cost model {floor:.2f}",
            f"{ours - floor:+.2f}",
            "|d|<=0.15",
            abs(ours - floor) <= 0.15,
        )
        report.add(
            f"slope vs {sweep.name}: grid {grid_s:.2f} / cost model {grid_model:.2f}",
            f"{grid_s - grid_model:+.2f}",
            "|d|<=0.15",
            abs(grid_s - grid_model) <= 0.15,
        )
    return list(sweeps.values())


def smollm_shaped(model: Module, vocab: int, n_layers: int) -> Module:
    """A random model of the default model's shape, ``n_layers`` blocks, ``vocab``."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config.vocab_size, config.num_hidden_layers = vocab, n_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        wide = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return wide.eval()


def plot(sweeps: Sequence[Sweep], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    labels = {
        "T": "positions T",
        "k": "layers k",
        "V": "vocabulary V",
        "n_steps": "n_steps m",
    }
    figure, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 4))
    for axis, sweep in zip(axes, sweeps):
        for values, style, label in (
            (sweep.ours, "o-C0", "IG-Lens map"),
            (sweep.floor, "--C0", "cost model: forward + T(k+1) readouts"),
            (sweep.grid, "s-C3", "grid version"),
            (sweep.grid_model, "--C3", "cost model: forward + Tk(m+1) readouts"),
        ):
            axis.loglog(
                sweep.xs,
                values,
                style,
                label=f"{label} ({_slope(sweep.xs, values):.2f})",
            )
        axis.set_xticks(sweep.xs, [f"{x:g}" for x in sweep.xs])
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlabel(labels[sweep.name])
        axis.set_ylabel("seconds")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=6.5, title="(log-log slope)", title_fontsize=6.5)
    figure.suptitle(
        "IG-Lens map vs grid evaluation, CPU; dashed: cost model from the same run"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer, smaller cases (under a minute)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default: 1)"
    )
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: CPU time of this process (default; robust to other load with 1 "
        "thread); wall: wall-clock time",
    )
    parser.add_argument("--plot", type=Path, default=HERE / "scaling.png")
    parser.add_argument(
        "--json", type=Path, help="also write every measurement as JSON"
    )
    parser.add_argument("--memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child, budget_mib=256)))
        return 0

    began = time.perf_counter()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    long_timer = Timer(clock, repeats=3, budget_s=2.0 if args.quick else 8.0)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), clock: {args.clock} "
        f"({'CPU time of this process' if args.clock == 'cpu' else 'wall-clock'})"
        f"{', QUICK' if args.quick else ''}"
    )
    report = Report()
    model, tokenizer = load_default(progress=False)
    lens = LayerIGLens.from_model(model)
    prompt_ids = encode_prompt(tokenizer, PROMPT)
    case = answer_case(model, tokenizer)
    print(
        f"default model: {len(lens.layers)} blocks, V={lens.readout.vocab_size}; "
        "prompt "
        f"{prompt_ids.shape[1]} tokens, answer {len(case.positions)} tokens "
        f"{tokenizer.decode(case.targets[0])!r}"
    )
    with torch.inference_mode():  # warm-up
        lens.attribute_map(case.ids, target=case.targets, positions=case.positions)

    # Three measured rounds, after a warm-up round where that takes under 2-4 s.
    floor_timer = Timer(
        clock, repeats=3, budget_s=8.0 if args.quick else 16.0, min_rounds=3
    )
    bench_floor(
        model,
        prompt_ids,
        lens,
        floor_timer,
        report,
        (
            ((8, (64,)), (32, (64,)))
            if args.quick
            else ((8, (4, 64)), (64, (4, 64)), (256, (64,)))
        ),
    )
    ours_s = bench_straightforward(
        model, case, lens, long_timer, report, (16,) if args.quick else (4, 16, 64)
    )
    bench_lig(model, case, lens, ours_s, long_timer, report, 1 if args.quick else 3)
    bench_per_dimension(
        model,
        prompt_ids,
        lens,
        long_timer,
        report,
        (2, 4) if args.quick else (4, 8, 16),
        2 if args.quick else 4,
    )
    bench_memory(report, 64 if args.quick else 512, 16, args.threads)
    bench_precision(model, case, report, args.quick)
    sweeps = bench_scaling(model, prompt_ids, long_timer, report, args.quick)
    plot(sweeps, args.plot)

    print(f"\n== summary ({time.perf_counter() - began:.0f}s; plot: {args.plot})")
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.data, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
