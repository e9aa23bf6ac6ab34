"""Probability flow on the embedded models: exactness, convergence and cost.

    python benchmarks/flow.py exactness     # |Σ − Δm|, conservation at 1, 8, default
    python benchmarks/flow.py convergence   # max/mean |edge − edge_ref| per n_steps
    python benchmarks/flow.py cost          # one graph against its floor
    python benchmarks/flow.py plain --steps 4 16 64  # the plain terms' errors
    python benchmarks/flow.py long --tokens 1000 --n-steps 2 [--qkv]
    python benchmarks/flow.py long --shape llama-1b --tokens 128 --n-steps 2
    python benchmarks/flow.py long --dry-run  # a tiny random model (CI)
    python benchmarks/flow.py batch --batch-size 8 --n-steps 16 --repeat 3
    python benchmarks/flow.py batch --dry-run  # a tiny random model (CI)

``exactness`` runs both models at ``n_steps`` 1, 8 and the default (with
queries, keys and values separate) and the plain trapezoid terms against
Captum's LayerIntegratedGradients on the embeddings (mean of its left and right
Riemann sums at the same steps). ``convergence`` compares the exact estimator's
edges at each step count with a many-step reference. ``cost`` times one graph
of an IOI-sized prompt on SmolLM2 against its floor and against the same graph
without the sums of each edge's own effect, ``n_steps + 1`` forward and
backward passes of the model on the same points (the gradient of the target
with respect to the embeddings, the same batching), the same graph split by
receiver position against it, the graph from the mean embedding (where
every position moves, so none is skipped) against the floor, and the graph
with queries, keys and values separate (MIB's edges) against the circuit
harness's EAP-IG-inputs on the same pair, edges and ``p(y)`` at ``n_steps``
points, from one run (the median of ``--repeat`` timings of each,
interleaved). ``plain``
prints, per model and step count, what the plain trapezoid terms miss
(``|Σ − Δm|``, the worst conservation error) and how far the exact estimator
moves the embeddings' outflows from them (the plain ones are Captum's LIG): on
post-norm families the per-head conservation error does not shrink with the
steps. ``long`` runs one graph of a ``--tokens``-token prompt on SmolLM2 (a
paragraph repeated, then "The capital of France is" against "... Italy is",
target " Paris") within ``--max-chunk-mib``, and prints its wall time, the
process's peak resident memory and its exactness; run it once per process, so
that the peak is that graph's. With ``--shape`` (and ``--dtype``) it runs a
random model of ``benchmarks/scale.py``'s shapes, whole, on random tokens
against the same tokens with the second-to-last one changed, the target the
model's top token. ``batch`` times ``--batch-size`` IOI pairs of one token
length on SmolLM2 (``p(A) − p(B)``, the names differ per pair) as one batch
against the same pairs one at a time, within ``--max-chunk-mib`` (the median
of ``--repeat`` timings of each, interleaved), and prints the throughput per
pair of each, their ratio, and how far each pair's graph from the batch is
from its graph alone.
"""

import argparse
import resource
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from captum.attr import LayerIntegratedGradients

from captum_iglens.attr.flow import DEFAULT_STEPS, ProbabilityFlow
from captum_iglens.attr.flow import engine
from captum_iglens.attr.flow.budget import pairs_at_once
from captum_iglens.attr.flow.engine import EffectSums, first_block_inputs
from captum_iglens.graph.target import Target
from captum_iglens.studies.circuits.batches import Batch
from captum_iglens.studies.circuits.context import ScoringContext
from captum_iglens.studies.circuits.patching import CircuitModel
from captum_iglens.studies.circuits.scorers import eap_ig_inputs
from captum_iglens.hf.models import load_embedded

SHORT = ("The capital of France is", "The capital of Italy is", " Paris")
PARAGRAPH = (
    " The river ran slowly through the old town, past the market, the church"
    " and the long stone bridge, where the fishermen sold their catch each"
    " morning before the bells rang and the carts came in from the farms."
)
IOI = (
    "When Mary and John went to the store, John gave a drink to",
    "When Mary and John went to the store, Mary gave a drink to",
    " Mary",
)

#: IOI names (one SmolLM2 token each, with the leading space): pair ``(A, B)``
#: is ``IOI``'s template with ``A`` and ``B`` for Mary and John.
NAMES = (
    ("Mary", "John"),
    ("Tom", "Anna"),
    ("James", "Sarah"),
    ("David", "Emma"),
    ("Paul", "Lisa"),
    ("Mark", "Kate"),
    ("Peter", "Alice"),
    ("Jack", "Laura"),
)


def exactness(models):
    print("model    n_steps  qkv  edges   |Σ-Δm|     worst conservation  Δm")
    for name in models:
        model, tok = load_embedded(name, progress=False)
        flow = ProbabilityFlow(model, tok)
        for n in (1, 8, DEFAULT_STEPS):
            g = flow.attribute(
                SHORT[0], counterfactual=SHORT[1], target=SHORT[2], n_steps=n, qkv=True
            )
            print(
                f"{name:8} {n:7d}  yes  {len(g.edges):6d}  {g.completeness_error:.2e}"
                f"   {g.conservation_error:.2e}            {g.delta_m:+.4f}"
            )
        n = 8
        g = flow.attribute(
            SHORT[0],
            counterfactual=SHORT[1],
            target=SHORT[2],
            n_steps=n,
            method="first_order",
        )
        ids, other = (tok(t, return_tensors="pt").input_ids for t in SHORT[:2])
        target = Target("prob", g.settings["target"], ids.shape[1] - 1)
        lig = LayerIntegratedGradients(
            lambda x: target(model(x).logits), model.get_input_embeddings()
        )
        sums = [
            lig.attribute(ids, baselines=other, n_steps=n, method=r).sum(-1)[0]
            for r in ("riemann_left", "riemann_right")
        ]
        gap = torch.from_numpy(g.input_flows) - (sums[0] + sums[1]).double() / 2
        print(
            f"{name:8} Captum LIG (trapezoid, {n} steps): max |input outflow - LIG| "
            f"= {gap.abs().max():.2e} (largest |LIG| {sums[1].abs().max():.3f})"
        )


def convergence(models, steps, reference):
    print(
        "model    n_steps  max|edge-ref|  mean|edge-ref|  max|ref|   "
        f"(ref: {reference} steps)"
    )
    for name in models:
        model, tok = load_embedded(name, progress=False)
        flow = ProbabilityFlow(model, tok)

        def run(n):
            return flow.attribute(
                SHORT[0], counterfactual=SHORT[1], target=SHORT[2], n_steps=n
            ).flows

        ref = run(reference)
        for n in steps:
            gap = abs(run(n) - ref)
            print(
                f"{name:8} {n:7d}  {gap.max():.3e}      {gap.mean():.3e}       "
                f"{abs(ref).max():.3e}"
            )


def plain(models, steps):
    print("model    n_steps  plain |Σ-Δm|  plain conservation  max|exact-plain input|")
    for name in models:
        model, tok = load_embedded(name, progress=False)
        flow = ProbabilityFlow(model, tok)
        for n in steps:
            exact, first_order = (
                flow.attribute(
                    SHORT[0],
                    counterfactual=SHORT[1],
                    target=SHORT[2],
                    n_steps=n,
                    method=method,
                )
                for method in ("exact", "first_order")
            )
            moved = abs(exact.input_flows - first_order.input_flows).max()
            print(
                f"{name:8} {n:7d}  {first_order.completeness_error:.2e}      "
                f"{first_order.conservation_error:.2e}            {moved:.2e}"
            )


def _floor(flow, ids, other, target, n_steps, batch):
    """``n_steps + 1`` forward and backward passes of the model on the flow's
    points and batches: the gradient of the target at the first block's input."""
    parts, model = flow.parts, flow.parts.model
    x, x0 = first_block_inputs(parts, ids), first_block_inputs(parts, other)
    alphas = torch.linspace(0, 1, n_steps + 1)
    for first in range(0, n_steps + 1, batch):
        a = alphas[first : first + batch].view(-1, 1, 1)
        h0 = (x0 + a * (x - x0)).requires_grad_(True)
        handle = parts.blocks[0].register_forward_pre_hook(
            lambda m, args, kw: ((h0, *args[1:]), kw), with_kwargs=True
        )
        try:
            logits = model(
                input_ids=ids.expand(len(a), -1),
                use_cache=False,
                logits_to_keep=torch.tensor([target.position]),
            ).logits
            torch.autograd.grad(target.of_row(logits[:, -1]).sum(), h0)
        finally:
            handle.remove()


def _eap_ig_inputs(model, ids, other, answer, n_steps):
    """The circuit harness's EAP-IG-inputs on one pair, ``p(answer)``, at
    ``n_steps`` points (its left rule), as a call to time."""
    one = torch.tensor([answer])
    pair = Batch(ids, other, one, one, torch.tensor([0]))
    context = ScoringContext(CircuitModel(model), None, [pair], 1, "prob", n_steps)
    return partial(eap_ig_inputs, context)


class _NoEffects(EffectSums):
    """The walk without the sums of each edge's own effect (their cost only)."""

    def add_final(self, prev, grad, n_receivers):
        pass

    def add(self, rows, rho):
        pass

    def effects(self, last, n_steps):
        return None, None


def _without_effects(run):
    kept, engine.EffectSums = engine.EffectSums, _NoEffects
    try:
        return run()
    finally:
        engine.EffectSums = kept


def cost(n_steps, batch, repeat):
    model, tok = load_embedded("smollm2", progress=False)
    flow = ProbabilityFlow(model, tok)
    batch = batch or flow.plan(IOI[0], n_steps=n_steps).batch  # the default's choice
    ids, other = (tok(t, return_tensors="pt").input_ids for t in IOI[:2])
    graph = partial(
        flow.attribute,
        IOI[0],
        target=IOI[2],
        n_steps=n_steps,
        internal_batch_size=batch,
    )
    g = graph(counterfactual=IOI[1])  # also warms up
    target = Target("prob", g.settings["target"], ids.shape[1] - 1)
    # the pair with the budget's points per forward
    pair = partial(
        flow.attribute, IOI[0], counterfactual=IOI[1], target=IOI[2], n_steps=n_steps
    )
    runs = {
        "graph": partial(graph, counterfactual=IOI[1]),
        "no-effects": partial(_without_effects, partial(graph, counterfactual=IOI[1])),
        "floor": partial(_floor, flow, ids, other, target, n_steps, batch),
        "pairs": partial(pair, receiver_positions=True),
        "mean": graph,  # from the mean embedding: every position moves
        "qkv": partial(pair, qkv=True),
        "eap-ig": _eap_ig_inputs(model, ids, other, target.token, n_steps),
    }
    times = {name: [] for name in runs}
    for _ in range(repeat):  # interleaved, so that a slow spell hits them all
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    t = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"IOI prompt, {ids.shape[1]} tokens, SmolLM2, n_steps {n_steps}, "
        f"{batch} points per forward, {len(g.edges)} edges, median of {repeat}: "
        f"graph {t['graph']:.2f} s, floor ({n_steps + 1} forward and backward "
        f"passes) {t['floor']:.2f} s, ratio {t['graph'] / t['floor']:.2f}; by "
        f"receiver position {t['pairs']:.2f} s, {t['pairs'] / t['graph']:.2f} x "
        f"the graph; from the mean embedding (every position moves) "
        f"{t['mean']:.2f} s, ratio {t['mean'] / t['floor']:.2f}; with queries, "
        f"keys and values separate {t['qkv']:.2f} s against EAP-IG-inputs' "
        f"{t['eap-ig']:.2f} s ({n_steps} points, the same edges), ratio "
        f"{t['qkv'] / t['eap-ig']:.2f}; each edge's own effect costs "
        f"{t['graph'] / t['no-effects']:.3f} x the graph without it "
        f"({t['no-effects']:.2f} s)"
    )


def ioi_batch(tok, size):
    """``size`` IOI pairs of one token length: the prompts and counterfactuals
    ``(size, T)``, each pair's target (the indirect object) and foil."""
    template = "When {} and {} went to the store, {} gave a drink to"
    names = NAMES[:size]
    ids, other = (
        tok([template.format(a, b, c) for a, b, c in rows], return_tensors="pt")
        for rows in ([(a, b, b) for a, b in names], [(a, b, a) for a, b in names])
    )
    answer, foil = (
        torch.tensor([tok(" " + n, add_special_tokens=False).input_ids for n in col])
        for col in zip(*names)
    )
    return ids.input_ids, other.input_ids, answer[:, 0], foil[:, 0]


def _random_batch(model, size, length=12):
    """``size`` random pairs of a random model: two positions changed, random
    targets and foils."""
    generator = torch.Generator().manual_seed(size)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (size, length), generator=generator)
    other = ids.clone()
    other[:, [3, 7]] = torch.randint(3, vocab, (size, 2), generator=generator)
    answer = torch.randint(3, vocab, (size,), generator=generator)
    return ids, other, answer, (answer + 1) % vocab


def batch_throughput(size, n_steps, repeat, chunk_mib, dry_run=False):
    if dry_run:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from scale import build

        model, tok, name = build("tiny", torch.float32), None, "tiny"
        ids, other, answer, foil = _random_batch(model, size)
    else:
        if size > len(NAMES):
            sys.exit(f"--batch-size: at most {len(NAMES)} IOI pairs")
        model, tok = load_embedded("smollm2", progress=False)
        ids, other, answer, foil = ioi_batch(tok, size)
        name = "SmolLM2"
    flow = ProbabilityFlow(model, tok)
    settings = dict(
        target_kind="prob_diff", n_steps=n_steps, max_chunk_bytes=chunk_mib * 2**20
    )
    pairs = dict(counterfactual=other, target=answer, foil=foil)
    plan = flow.plan(ids, **pairs, **settings)
    together, _ = pairs_at_once(plan.batch, n_steps + 1, size)

    def alone():
        return [
            flow.run(flow.plan(ids[b : b + 1], **one, **settings))
            for b, one in enumerate(
                dict(counterfactual=c[None], target=int(y), foil=int(f))
                for c, y, f in zip(other, answer, foil)
            )
        ]

    runs = {"alone": alone, "batch": partial(flow.run_batch, plan)}
    found = {what: run() for what, run in runs.items()}  # also warms up
    clocks = {"wall": time.perf_counter, "CPU": time.process_time}
    times = {(what, clock): [] for what in runs for clock in clocks}
    for _ in range(repeat):  # interleaved, so that a slow spell hits them all
        for what, run in runs.items():
            start = {clock: read() for clock, read in clocks.items()}
            run()
            for clock, read in clocks.items():
                times[what, clock].append(read() - start[clock])
    t = {key: statistics.median(values) for key, values in times.items()}
    gaps = [
        max(
            abs(getattr(b, field) - getattr(a, field)).max()
            / max(abs(getattr(a, field)).max(), 1e-30)
            for field in ("flows", "effects", "input_flows")
        )
        for a, b in zip(found["alone"], found["batch"])
    ]
    same = sum(
        (a.flows == b.flows).all() and (a.effects == b.effects).all()
        for a, b in zip(found["alone"], found["batch"])
    )
    worst = max(max(g.completeness_error, g.conservation_error) for g in found["batch"])
    print(
        f"{name}, {size} pairs of {ids.shape[1]} tokens, n_steps {n_steps}, budget "
        f"{chunk_mib} MiB, {torch.get_num_threads()} thread(s): {plan.batch} path "
        f"points per forward, {together} pair(s) per forward; median of {repeat}:"
    )
    for clock in clocks:
        alone_s, batch_s = t["alone", clock], t["batch", clock]
        print(
            f"  {clock} time: one at a time {alone_s:.2f} s "
            f"({size / alone_s:.3f} pairs/s), batch of {size} {batch_s:.2f} s "
            f"({size / batch_s:.3f} pairs/s); throughput per pair "
            f"{alone_s / batch_s:.2f} x"
        )
    print(
        f"  {same}/{size} graphs bit-identical to alone, largest gap "
        f"{max(gaps):.1e} of the largest |value|; worst |Σ-Δm| or conservation "
        f"{worst:.1e}; peak resident {_resident_gib()[1]:.2f} GiB"
    )


def _resident_gib():
    """The process's resident memory now and its peak, in GiB (Linux)."""
    now = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return now / 2**20, peak / 2**20


def long_prompts(tok, tokens):
    """Token ids ``(1, tokens)`` of the paragraph repeated, then the short
    pair's prompt and its counterfactual."""
    tails = [tok(" " + t, add_special_tokens=False).input_ids for t in SHORT[:2]]
    first = tok(PARAGRAPH).input_ids
    filler = tok(PARAGRAPH, add_special_tokens=False).input_ids
    room = tokens - len(tails[0])
    context = (first + filler * (tokens // len(filler) + 1))[:room]
    return [torch.tensor([context + tail]) for tail in tails]


def long(tokens, n_steps, qkv, chunk_mib, shape=None, dtype="float32"):
    if shape is not None:  # a random model of benchmarks/scale.py's shapes
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from scale import DTYPES, build, inputs

        model, tok = build(shape, DTYPES[dtype]), None
        ids = inputs(model, tokens)[0]
        other = ids.clone()
        other[0, -2] = (other[0, -2] + 1) % model.config.vocab_size
        target, name = None, f"{shape} ({dtype})"
    else:
        model, tok = load_embedded("smollm2", progress=False)
        ids, other = long_prompts(tok, tokens)
        target, name = SHORT[2], "SmolLM2"
    flow = ProbabilityFlow(model, tok)
    budget = chunk_mib * 2**20
    batch = flow.plan(ids, n_steps=n_steps, qkv=qkv, max_chunk_bytes=budget).batch
    loaded, _ = _resident_gib()
    start = time.perf_counter()
    g = flow.attribute(
        ids,
        counterfactual=other,
        target=target,
        n_steps=n_steps,
        qkv=qkv,
        max_chunk_bytes=budget,
    )
    wall = time.perf_counter() - start
    _, peak = _resident_gib()
    print(
        f"{name}, {ids.shape[1]} tokens, n_steps {n_steps}, "
        f"qkv {'yes' if qkv else 'no'}, {len(g.edges)} edges, budget {chunk_mib} "
        f"MiB: {batch} path point(s) per "
        f"forward; {wall:.1f} s; resident {loaded:.2f} GiB after the load, peak "
        f"{peak:.2f} GiB; |Σ-Δm| {g.completeness_error:.1e}, worst conservation "
        f"{g.conservation_error:.1e}, Δm {g.delta_m:+.4f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what", choices=("exactness", "convergence", "plain", "cost", "long", "batch")
    )
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--reference", type=int, default=128)
    parser.add_argument("--n-steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument(
        "--batch", type=int, help="cost: points per forward (default: as fit)"
    )
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--qkv", action="store_true")
    parser.add_argument(
        "--repeat", type=int, default=3, help="cost: timings per run (the median)"
    )
    parser.add_argument("--max-chunk-mib", type=int, default=256)
    parser.add_argument(
        "--batch-size", type=int, default=8, help="batch: the pairs of the batch"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="long, batch: a tiny random model"
    )
    parser.add_argument(
        "--shape", help="long: a random model of benchmarks/scale.py's SHAPES"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="long, with --shape",
    )
    args = parser.parse_args()
    if args.shape is not None:
        from scale import SHAPES  # beside this script

        if args.what != "long" or args.shape not in SHAPES:
            parser.error(f"--shape: expected long and one of {list(SHAPES)}")
    elif args.dtype != "float32":
        parser.error("--dtype: only with --shape")
    if args.what == "exactness":
        exactness(args.models)
    elif args.what == "convergence":
        convergence(args.models, args.steps, args.reference)
    elif args.what == "plain":
        plain(args.models, args.steps)
    elif args.what == "cost":
        cost(args.n_steps, args.batch, args.repeat)
    elif args.what == "batch":
        if args.dry_run:
            batch_throughput(3, 2, 1, args.max_chunk_mib, dry_run=True)
        else:
            batch_throughput(
                args.batch_size, args.n_steps, args.repeat, args.max_chunk_mib
            )
    elif args.dry_run:
        long(16, 2, True, 1, shape="tiny")
    else:
        long(
            args.tokens,
            args.n_steps,
            args.qkv,
            args.max_chunk_mib,
            shape=args.shape,
            dtype=args.dtype,
        )


if __name__ == "__main__":
    main()
