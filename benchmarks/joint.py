r"""
The joint path against the telescoping one, on an embedded model's answer to a
prompt: how fast its per-block credits converge in ``n_steps``, and what its
maps cost beside the telescoping maps at the same ``n_steps``.

    python benchmarks/joint.py                        # smollm2, both parts
    python benchmarks/joint.py --model gemma3 --part convergence
    python benchmarks/joint.py --part reads --n-steps 50
    python benchmarks/joint.py --model gemma3 --part precision   # float32 vs float64
    python benchmarks/joint.py --dry-run              # tiny model, seconds

Reads: the joint neuron and source maps with their components read through
their own products (as the library does) against the same maps with the
components built as ``(rows, columns, d)`` arrays, alternating, in this process.

Convergence: per-block credits of every estimator at 32, 128 and 512 steps
against an independent reference (autograd through the model's final norm and
head, composite 8-point Gauss–Legendre on equal panels in ``t`` with ``α = t²``,
which crowds the points where the direction turns; float64 sums), at the first
``--positions`` answer tokens: the largest and the mean ``|credit - ref|``, the
largest ``|Σ - Δp|``, for ``adaptive`` whether its ``credit_error`` bounds
every error, and the time of each map. The reference is computed at two
resolutions and their largest difference printed (it must be far below the
errors it judges). Cost: the median wall time of each map over ``--repeats`` runs in
this process, and the ratio joint / telescoping per granularity (the goals: the
block map within 2×, the head, source and neuron maps at least 5× cheaper).
"""

import argparse
import copy
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from captum_iglens import ESTIMATORS, LayerIGLens
from captum_iglens.attr.granularities.neurons import NeuronComponents
from captum_iglens.attr.granularities.source_terms import SourceComponents
from captum_iglens.hf.models import load_embedded
from captum_iglens.hf.text import answered_prompt

PROMPT = "What is the capital of France?"
STEPS = (32, 128, 512)
#: Points of the finer reference (the coarser has half).
REFERENCE = 4096


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reference(
    model: Any,
    ids: Any,
    positions: Any,
    targets: Any,
    panels: int,
    readout: Optional[Callable[[Any], Any]] = None,
) -> Any:
    r"""Per-block ``∫ ∇f(γ(α)) · Δ_l dα`` ``(P, L)`` at ``positions``: the
    states by forward hooks, ``f`` by autograd through the final norm and head
    (with the model's logit softcap; ``readout`` from :func:`readout_of`, in
    its dtype), ``panels`` panels of 8 Gauss–Legendre points in ``t``,
    ``α = t²``."""
    readout = readout or readout_of(model, torch.float32)
    stream = residual_stream(model, ids, positions)
    x, w = (torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(8))
    t = ((torch.arange(panels)[:, None] + (x[None] + 1) / 2) / panels).flatten()
    weights = (w[None] / (2 * panels)).expand(panels, -1).flatten() * 2 * t
    out = []
    for row, target in zip(stream, targets.flatten().tolist()):
        total = torch.zeros(row.shape[0] - 1, dtype=torch.float64)
        for chunk in torch.split(torch.arange(len(t)), 256):
            alpha = (t[chunk] ** 2)[:, None]
            h = row[0] + alpha * (row[-1] - row[0])
            h = h.to(readout.dtype).requires_grad_(True)  # type: ignore[attr-defined]
            prob = readout(h).softmax(-1)[:, target]
            (grad,) = torch.autograd.grad(prob.sum(), h)
            total += (grad.double() @ row.diff(dim=0).T * weights[chunk, None]).sum(0)
        out.append(total)
    return torch.stack(out)


def readout_of(model: Any, dtype: Any) -> Callable[[Any], Any]:
    r"""The model's final norm, head and logit softcap, as a function of
    ``h``, in ``dtype`` (a copy where it is not the model's), with a ``dtype``
    attribute."""
    norm, head = model.model.norm, model.lm_head
    if dtype != head.weight.dtype:
        norm, head = copy.deepcopy(norm).to(dtype), copy.deepcopy(head).to(dtype)
    cap = getattr(model.config, "final_logit_softcapping", None)

    def read(h: Any) -> Any:
        logits = head(norm(h))
        return torch.tanh(logits / cap) * cap if cap else logits

    read.dtype = dtype  # type: ignore[attr-defined]
    return read


def residual_stream(model: Any, ids: Any, positions: Any) -> Any:
    r"""The first block's input and every block's output at ``positions``,
    ``(P, L + 1, d)`` float64."""
    states: List[Any] = []

    def keep(module: Any, args: Any, output: Any) -> None:
        states.append((output[0] if isinstance(output, tuple) else output)[0])

    layers = model.model.layers
    hooks = [layer.register_forward_hook(keep) for layer in layers]
    hooks.append(
        layers[0].register_forward_pre_hook(lambda m, a: states.insert(0, a[0][0]))
    )
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(states)[:, positions].transpose(0, 1).double()


def precision(model: Any, kwargs: Dict[str, Any], panels: int) -> None:
    r"""Whether the readout's gradient, integrated along each row's joint line
    (the reference's rule at ``panels`` and twice as many panels), gives back
    the change of ``f`` between the line's ends, in float32 and in float64:
    what separates float32 credits that add up to ``Δp`` from a float32
    reference."""
    ids, positions, targets = kwargs["inputs"], kwargs["positions"], kwargs["target"]
    stream = residual_stream(model, ids, positions)
    print("dtype | row | ∫∇f (panels) | ∫∇f (2× panels) | f(end) - f(start) | diff")
    for dtype in (torch.float32, torch.float64):
        read = readout_of(model, dtype)
        found = [
            reference(model, ids, positions, targets, n, read).sum(-1)
            for n in (panels, 2 * panels)
        ]
        for i, target in enumerate(targets.flatten().tolist()):
            with torch.no_grad():
                ends = read(stream[i, [0, -1]].to(dtype)).softmax(-1)[:, target]
            change = float(ends[1] - ends[0])
            print(
                f"{str(dtype).split('.')[-1]} | {i} | {float(found[0][i]):.9f} | "
                f"{float(found[1][i]):.9f} | {change:.9f} | "
                f"{float(found[1][i]) - change:+.2e}",
                flush=True,
            )


def convergence(
    lens: LayerIGLens, model: Any, kwargs: Dict[str, Any], steps: Sequence[int]
) -> None:
    positions, targets = kwargs["positions"], kwargs["target"]
    coarse = reference(model, kwargs["inputs"], positions, targets, REFERENCE // 16)
    fine = reference(model, kwargs["inputs"], positions, targets, REFERENCE // 8)
    print(
        f"reference: {REFERENCE} and {REFERENCE // 2} points, largest difference "
        f"{(coarse - fine).abs().max():.1e}"
    )
    print("method | n_steps | max |credit - ref| | mean | max |Σ - Δp| | bound | s")
    for method in ESTIMATORS:
        for n_steps in steps:
            start = time.perf_counter()
            found = lens.attribute_map(
                path="joint", method=method, n_steps=n_steps, **kwargs
            )
            seconds = time.perf_counter() - start
            error = (found.attributions[0] - fine).abs()
            change = found.model_prob - found.base_prob
            residual = (found.total - change).abs().max()
            bound = "-"
            if found.credit_error is not None:
                bound = "yes" if bool((found.credit_error[0] >= error).all()) else "NO"
            print(
                f"{method} | {n_steps} | {error.max():.1e} | {error.mean():.1e} | "
                f"{residual:.1e} | {bound} | {seconds:.1f}",
                flush=True,
            )


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


def _tiny() -> Dict[str, Any]:
    r"""A 2-block Llama from its config and a 6-token input (``--dry-run``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 64, (1, 6))
    with torch.no_grad():
        target = model(ids).logits[0, -1].argmax().view(1, 1)
    return dict(model=model, inputs=ids, target=target, positions=torch.tensor([5]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    parser.add_argument(
        "--part",
        choices=("convergence", "cost", "reads", "precision", "both"),
        default="both",
    )
    parser.add_argument(
        "--panels", type=int, default=48, help="reference panels of --part precision"
    )
    parser.add_argument("--n-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--positions", type=int, default=3, help="answer tokens in the convergence"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="the convergence on a tiny model"
    )
    args = parser.parse_args()
    if args.dry_run:
        tiny = _tiny()
        model = tiny.pop("model")
        convergence(LayerIGLens.from_model(model), model, tiny, (7, 16))
        precision(model, tiny, 4)
        return
    model, tokenizer = load_embedded(args.model)
    ids, positions, targets, _ = answered_prompt(model, tokenizer, PROMPT)
    lens = LayerIGLens.from_model(model)
    kwargs = dict(inputs=ids, target=targets, positions=positions)
    print(
        f"{args.model}: {PROMPT!r}, {len(positions)} answer tokens, torch threads "
        f"{torch.get_num_threads()}"
    )
    if args.part in ("convergence", "both"):
        first = dict(
            inputs=ids,
            target=targets[:, : args.positions],
            positions=positions[: args.positions],
        )
        convergence(lens, model, first, STEPS)
    if args.part in ("cost", "both"):
        cost(lens, kwargs, args.n_steps, args.repeats)
    if args.part == "reads":
        reads(lens, kwargs, args.n_steps, args.repeats)
    if args.part == "precision":
        first = dict(inputs=ids, target=targets[:, :1], positions=positions[:1])
        precision(model, first, args.panels)


if __name__ == "__main__":
    main()
