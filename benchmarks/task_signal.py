r"""
Does a task move ``m``? For each model and task, the pairs the circuit harness
keeps (the model prefers the answer to the foil on the clean prompt) and the
mean ``Δm = m(clean) − m(counterfactual)`` of ``logit_diff`` with its 95%
interval: ``f``'s denominator. A task whose ``Δm`` is near 0 against its
spread gives faithfulness curves that compare no methods.

    python benchmarks/task_signal.py                                # shipped tasks
    python benchmarks/task_signal.py --tasks mcqa mcqa:1 mcqa:2     # MCQA, 0-2 shots
    python benchmarks/task_signal.py --models DIR --tasks FILE --pairs 20

``mcqa[:SHOTS]`` is MIB's multiple-choice format, written here because the
harness no longer ships it (docs/studies.md says why): a question with four
options, answered by its letter, after ``SHOTS`` solved questions; the
counterfactual swaps the right option with another, whose letter is the foil.
"""

import argparse
import datetime
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Tuple

import torch
from torch import Tensor

from captum_iglens.hf.models import EMBEDDED_MODELS, load_embedded, load_model
from captum_iglens.studies.circuits.batches import filter_pairs, make_batches
from captum_iglens.studies.circuits.generators import GENERATORS, generate
from captum_iglens.studies.circuits.tasks import Pair, encode_pairs, read_task

#: (question, right, wrong) of the multiple-choice task.
QUESTIONS = (
    ("Which one is an animal?", "dog", "table"),
    ("Which one is a fruit?", "apple", "chair"),
    ("Which one is a color?", "red", "spoon"),
    ("Which one can fly?", "bird", "stone"),
    ("Which one is a number?", "seven", "shoe"),
    ("Which one is a drink?", "water", "brick"),
    ("Which one is a planet?", "Mars", "lamp"),
    ("Which one is hot?", "fire", "snow"),
    ("Which one is a day of the week?", "Monday", "river"),
    ("Which one is a vehicle?", "car", "cloud"),
    ("Which one is a country?", "France", "pencil"),
    ("Which one lives in water?", "fish", "cat"),
)
#: The solved questions shown before the asked one.
SOLVED = (
    ("Which one is a tool?", "hammer", "cat"),
    ("Which one is a flower?", "rose", "bottle"),
    ("Which one is a metal?", "iron", "bread"),
    ("Which one is a bird?", "eagle", "door"),
)
DISTRACTORS = ("table", "chair", "spoon", "stone", "shoe", "brick", "lamp", "pencil")


def _options(rng: random.Random, right: str, wrong: str) -> List[str]:
    others = rng.sample([w for w in DISTRACTORS if w not in (right, wrong)], 2)
    options = [right, wrong, *others]
    rng.shuffle(options)
    return options


def _question(question: str, options: List[str]) -> str:
    lines = "\n".join(f"{letter}. {o}" for letter, o in zip("ABCD", options))
    return f"Question: {question}\n{lines}\nAnswer:"


def mcqa(rng: random.Random, shots: int) -> Pair:
    r"""One multiple-choice pair after ``shots`` solved questions."""
    solved = ""
    for question, right, wrong in rng.sample(SOLVED, shots):
        options = _options(rng, right, wrong)
        solved += f"{_question(question, options)} {'ABCD'[options.index(right)]}\n\n"
    question, right, wrong = rng.choice(QUESTIONS)
    options = _options(rng, right, wrong)
    i = options.index(right)
    j = rng.choice([k for k in range(4) if k != i])
    swapped = list(options)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    return Pair(
        clean=solved + _question(question, options),
        counterfactual=solved + _question(question, swapped),
        answer=" " + "ABCD"[i],
        foil=" " + "ABCD"[j],
    )


def task_pairs(task: str, tokenizer: Any, n: int) -> List[Pair]:
    r"""The pairs of a shipped task, ``mcqa[:SHOTS]`` or a task file, at equal
    token lengths."""
    if task in GENERATORS:
        return generate(task, tokenizer, n=n).pairs
    if task.split(":")[0] == "mcqa":
        rng, shots = random.Random(f"{task}:0"), int(task.partition(":")[2] or 0)
        pairs = [mcqa(rng, shots) for _ in range(n)]
        return [
            p
            for p in pairs
            if len(tokenizer(p.clean)["input_ids"])
            == len(tokenizer(p.counterfactual)["input_ids"])
        ]
    return read_task(task)[:n]


@torch.no_grad()
def signal(model: Any, tokenizer: Any, pairs: List[Pair]) -> Tuple[int, int, Tensor]:
    r"""The pairs, those kept, and ``(kept, 2)`` ``logit_diff`` on the clean
    and the counterfactual prompt of each kept pair."""
    kept, counts = filter_pairs(model, encode_pairs(pairs, tokenizer))
    rows = []
    for batch in make_batches(kept, 8, torch.device("cpu")):
        picked = torch.stack([batch.answer, batch.foil], 1)
        for ids in (batch.clean, batch.counterfactual):
            logits = model(input_ids=ids).logits[:, -1].double()
            rows.append(logits.gather(1, picked))
    m = torch.cat(rows[0::2]), torch.cat(rows[1::2])
    diff = torch.stack([x[:, 0] - x[:, 1] for x in m], 1)
    return counts["pairs"], counts["kept"], diff


def _row(model: str, task: str, n: int, kept: int, m: Tensor) -> str:
    delta = m[:, 0] - m[:, 1]
    mean, sd = float(delta.mean()), float(delta.std())
    half = 1.96 * sd / max(kept, 1) ** 0.5
    flips = float((m[:, 1] < 0).double().mean())
    return (
        f"| {model} | {task} | {kept} / {n} | {float(m[:, 0].mean()):.3f} "
        f"| {float(m[:, 1].mean()):.3f} | {mean:.3f} [{mean - half:.3f}, "
        f"{mean + half:.3f}] | {sd:.3f} | {mean / sd:.2f} | {flips:.2f} |"
    )


def run(args: argparse.Namespace) -> int:
    r"""Prints the table, headed by the command, the commit and the date."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    print(
        f"`python {' '.join(sys.argv)}` (commit {done.stdout.strip() or 'unknown'}, "
        f"{datetime.date.today().isoformat()})\n"
    )
    print(
        "| model | task | kept / pairs | m(clean) | m(counterfactual) "
        "| Δm [95% CI] | sd | Δm / sd | counterfactual prefers foil |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        loaded = load_embedded if name in EMBEDDED_MODELS else load_model
        model, tokenizer = loaded(name, progress=False)
        model.eval()
        for task in args.tasks:
            n, kept, m = signal(
                model, tokenizer, task_pairs(task, tokenizer, args.pairs)
            )
            print(_row(Path(name).name, Path(task).stem, n, kept, m), flush=True)
    return 0


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(GENERATORS),
        help="shipped tasks, mcqa[:SHOTS] or task files",
    )
    parser.add_argument("--pairs", type=int, default=150, help="pairs per task")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(run(parse_args()))
