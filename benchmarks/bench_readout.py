r"""
The map under a learned readout per layer against the logit-readout map, on an
embedded model, from one run:

    python benchmarks/bench_readout.py                  # smollm2, 32 positions
    python benchmarks/bench_readout.py --model gemma3 --positions 16
    python benchmarks/bench_readout.py --granularity head --positions 8

The learned readout is the identity plus noise (``W_i ~ N(0, s²/d)``, ``b_i ~
N(0, s²)``, ``s = --noise``): the cost does not depend on the values, and every
translator differs, the worst case (equal neighbours share a readout). It
prints:

1. the CPU time of ``attribute_map`` (prediction-aware, ``--granularity``,
   block by default) with the logit readout and with the learned one, and
   their ratio (goal ≤ 1.3);
2. the readouts each reads (``T·k`` and ``T·3k``: the levels, plus each block's
   two cross values ``f_{l-1}(h_l)`` and ``f_l(h_{l-1})``);
3. completeness on real weights: ``max |Σ block + Σ lens − Δp|`` (goal ≤ 1e-6,
   fp32), with the prediction-aware map and, for the Captum rule
   ``gausslegendre``, ``max |Σ − Δp − delta|``;
4. with ``--identity``, also that identity translators give the logit map
   exactly;
5. with ``--breakdown``, where each map's CPU time goes, from one more call
   of each: the readouts' norm and head, the translators, the log-softmax and
   score of the levels and of the cross values, and the rest (the model's
   forward, the capture and the parts' arithmetic).

Times are medians over ``--repeats`` interleaved rounds of process CPU time, with
``--threads`` threads.
"""

import argparse
import contextlib
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from captum_iglens import LayerIGLens
from captum_iglens.attr import column_readout, lens_change
from captum_iglens.hf import model_parts
from captum_iglens.hf.models import load_embedded
from captum_iglens.readout.readout import Readout
from captum_iglens.readout.translators import Translators

TEXT = (
    "The Eiffel Tower is in Paris, the capital of France. The Colosseum is in "
    "Rome, the capital of Italy. The Brandenburg Gate is in Berlin, the capital "
    "of Germany. The Acropolis is in Athens"
)


def noisy_translators(n_layers: int, d: int, noise: float, seed: int) -> Translators:
    """Identity plus Gaussian noise, a different translator per state."""
    g = torch.Generator().manual_seed(seed)
    weight = noise / d**0.5 * torch.randn(n_layers, d, d, generator=g)
    return Translators(weight, noise * torch.randn(n_layers, d, generator=g))


def cpu_times(
    functions: Dict[str, Callable[[], Any]], repeats: int
) -> Dict[str, float]:
    """Median process CPU seconds of each function, interleaved, after one
    warm-up round."""
    found: Dict[str, List[float]] = {name: [] for name in functions}
    for round_index in range(repeats + 1):
        for name, function in functions.items():
            start = time.process_time()
            function()
            if round_index:
                found[name].append(time.process_time() - start)
    return {name: statistics.median(times) for name, times in found.items()}


@contextlib.contextmanager
def timed(spent: Dict[str, float], name: str, owner: Any, attr: str) -> Iterator[None]:
    """``owner.attr`` adds its CPU seconds to ``spent[name]`` (outermost calls
    only) while the context lasts."""
    original = getattr(owner, attr)
    depth = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                spent[name] = spent.get(name, 0.0) + time.process_time() - start

    setattr(owner, attr, wrapper)
    try:
        yield
    finally:
        setattr(owner, attr, original)


def breakdown(function: Callable[[], Any]) -> Dict[str, float]:
    """CPU seconds of one call of ``function``: reading the levels and the
    cross values (each with its log-softmax and score), of which the norm and
    head of every readout and the translators, and the rest."""
    spent = dict.fromkeys(["levels", "cross values", "norm + head", "translators"], 0.0)
    with contextlib.ExitStack() as stack:
        for name, owner, attr in (
            ("levels", lens_change, "path_levels"),
            ("levels", column_readout, "path_levels"),
            ("cross values", lens_change, "_values"),
            ("norm + head", Readout, "forward"),
            ("translators", Translators, "forward"),
        ):
            stack.enter_context(timed(spent, name, owner, attr))
        start = time.process_time()
        function()
        total = time.process_time() - start
    return {
        "levels (readout, log-softmax, score)": spent["levels"],
        "cross values (the same)": spent["cross values"],
        "  of which norm + head, every readout": spent["norm + head"],
        "  of which translators": spent["translators"],
        "rest (forward, capture, parts)": (
            total - spent["levels"] - spent["cross values"]
        ),
        "total": total,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    parser.add_argument("--positions", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--identity", action="store_true")
    parser.add_argument("--granularity", default="block")
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    begin = time.perf_counter()
    model, tokenizer = load_embedded(args.model, progress=False)
    parts = model_parts(model)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    positions = list(range(ids.shape[1]))[-args.positions :]
    n_layers, d = len(parts.blocks), model.config.hidden_size
    logit = LayerIGLens.from_model(parts)
    learned = LayerIGLens.from_model(
        parts, lens=noisy_translators(n_layers, d, args.noise, seed=0)
    )
    print(
        f"{args.model}: {n_layers} blocks, d = {d}, V = {logit.readout.vocab_size}, "
        f"T = {len(positions)} positions, {args.threads} thread(s), "
        f"granularity {args.granularity}"
    )
    kwargs = dict(positions=positions, granularity=args.granularity)

    def logit_map() -> Any:
        return logit.attribute_map(ids, **kwargs)

    def learned_map() -> Any:
        return learned.attribute_map(ids, **kwargs)

    times = cpu_times({"logit": logit_map, "learned": learned_map}, args.repeats)
    ratio = times["learned"] / times["logit"]
    t, k = len(positions), n_layers
    print(f"  map, logit readout          {times['logit']:8.3f} s CPU")
    print(f"  map, learned readout        {times['learned']:8.3f} s CPU")
    print(f"  ratio learned / logit       {ratio:8.2f}   (goal <= 1.3)")
    print(f"  readouts read: logit {t * k}, learned {t * 3 * k}")
    result = learned_map()
    change = result.model_prob - result.base_prob
    parts_sum = result.block_part.sum(-1) + result.lens_change.sum(-1)
    error = (parts_sum - change)[result.mask].abs().max().item()
    print(
        f"  completeness, prediction_aware: max |Σ block + Σ lens - Δp| = {error:.2e}"
    )
    print(f"    (mean |lens part| {result.lens_change.abs().mean().item():.3e})")
    rule = learned.attribute_map(
        ids,
        positions=positions[-4:],
        granularity=args.granularity,
        method="gausslegendre",
        n_steps=8,
    )
    off = rule.attributions.sum(-1) - (rule.model_prob - rule.base_prob) - rule.delta
    print(
        f"  gausslegendre (4 positions, n_steps=8): max |Σ - Δp - delta| = "
        f"{off.abs().max().item():.2e}, max |delta| = "
        f"{rule.delta.abs().max().item():.2e}"
    )
    if args.identity:
        same = LayerIGLens.from_model(parts, lens=Translators.identity(n_layers, d))
        found = same.attribute_map(ids, **kwargs)
        exact = torch.equal(found.attributions, logit_map().attributions)
        print(f"  identity translators give the logit map exactly: {exact}")
    if args.breakdown:
        for name, function in (("logit", logit_map), ("learned", learned_map)):
            print(f"  where the {name} map's time goes (CPU s, one call):")
            for stage, seconds in breakdown(function).items():
                print(f"    {stage:<40} {seconds:7.3f}")
    print(f"  wall time {time.perf_counter() - begin:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
