r"""
MIB's circuit faithfulness on the embedded models and the shipped tasks: one
``captum-iglens circuits`` run per model and task (resumable, in
``--out/MODEL-TASK``), then a Markdown table of CPR and CMD with their 95%
intervals and the cost of each method, headed by the command, the commit and
the date, for docs/studies.md.

    python benchmarks/circuits.py --out runs                   # everything
    python benchmarks/circuits.py --models smollm2 --tasks ioi --pairs 8 \
        --methods eap,eap-ig-inputs,random,patching --out runs

Each run's own files are ``--out/MODEL-TASK.json`` (the result) and
``--out/MODEL-TASK/`` (the per-method records a rerun resumes from).
"""

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from captum_iglens.studies.circuits.generators import GENERATORS
from captum_iglens.studies.circuits.scorers import SCORERS
from captum_iglens.cli import main

#: The ground-truth scorers, one column of rank correlations each.
GROUND_TRUTH = [name for name, scorer in SCORERS.items() if scorer.truth]


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def _rows(result: Dict[str, Any], model: str, task: str) -> List[str]:
    rows = []
    for c in result["curves"]:
        cost = sum(c["seconds"].values())
        rho = [
            result["correlations"].get(truth, {}).get(c["method"])
            for truth in GROUND_TRUTH
        ]
        rows.append(
            f"| {model} | {task} | {result['counts']['scored']} | {c['method']} "
            f"| {c['cpr']:.3f} [{c['cpr_ci'][0]:.3f}, {c['cpr_ci'][1]:.3f}] "
            f"| {c['cmd']:.3f} [{c['cmd_ci'][0]:.3f}, {c['cmd_ci'][1]:.3f}] "
            f"| {' / '.join('—' if r is None else f'{r:+.2f}' for r in rho)} "
            f"| {cost:.0f} s |"
        )
    return rows


def run(args: argparse.Namespace) -> int:
    """Runs every model × task and prints the table, headed by the commit the
    run started at (the code it loaded) and the date."""
    commit, date = _commit(), datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    table = [
        "| model | task | pairs | method | CPR [95% CI] | CMD [95% CI] "
        f"| ρ with {' / '.join(GROUND_TRUTH)} | cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        for task in args.tasks:
            name = f"{Path(model).name}-{Path(task).stem}"  # names, folders or files
            command = ["circuits", "--task", task, "--model", model]
            command += ["--pairs", str(args.pairs), "--generate", str(args.generate)]
            command += ["--methods", args.methods, "--batch-size", str(args.batch_size)]
            command += ["--metric", args.metric, "--sample", str(args.sample)]
            command += ["--bootstrap", str(args.bootstrap)]
            command += [] if args.train is None else ["--train", str(args.train)]
            command += ["--out", str(out / name), "--json", str(out / f"{name}.json")]
            status = main(command)
            if status != 0:
                return status
            result = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
            table += _rows(result, Path(model).name, Path(task).stem)
    print(f"\n`python {' '.join(sys.argv)}` (commit {commit}, {date})\n")
    print("\n".join(table))
    return 0


def parse_args(
    doc: str = __doc__, methods: str = "eap,eap-ig-inputs,random,patching"
) -> argparse.Namespace:
    """The command line, described by ``doc``'s second paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[1])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2", "gemma3"],
        help="embedded model names or model folders",
    )
    parser.add_argument(
        "--tasks", nargs="+", default=list(GENERATORS), help="shipped tasks or files"
    )
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--generate", type=int, default=300, help="pairs generated before the filter"
    )
    parser.add_argument("--methods", default=methods)
    parser.add_argument("--metric", default="logit_diff")
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument(
        "--train", type=int, help="training pairs of search: methods (circuits --train)"
    )
    parser.add_argument("--out", required=True, help="folder of the runs")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(run(parse_args()))
