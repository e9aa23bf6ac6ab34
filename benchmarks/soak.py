r"""
Memory soak: the same CLI job run ``--runs`` times, each in a fresh process,
with each run's peak resident memory (``ru_maxrss`` of that child, from
``os.wait4``). Prints every peak, the median, the worst and worst / median (the
goal: at most 1.3).

The prompt is built the same way every time from the repository's LICENSE
text, repeated and cut to ``--tokens`` tokens of the default model's tokenizer
(no chat template, so the model reads exactly those tokens):

    python benchmarks/soak.py                     # block map, 1,494 tokens, 20 runs
    python benchmarks/soak.py --granularity source --tokens 600
    python benchmarks/soak.py --runs 3 --tokens 300          # a quick check
    python benchmarks/soak.py --n-steps 8                    # the same job, fewer steps
    python benchmarks/soak.py --granularity source --tokens 600 --layers 29 --n-steps 8

The job prints the other path's block map too (the second onset column): the
joint path's 128 gradient steps per position are most of a run (on 2 CPU cores
about 700 s of a 1,494-token run, against about 80 s for the telescoping map).
``--n-steps`` is passed to the command line: it leaves the telescoping block map
as it is (its prediction-aware credits read no steps) and shortens the joint one.
``--layers`` is passed on too: a source map of all 600 positions splits each
block's update over 600 source tokens at ``n_steps`` gradients per position (about
50 min a run on 2 CPU cores at ``--n-steps 8`` for all 30 blocks); one block keeps
every position and source and the same row groups, at a thirtieth of the work.

With ``--record FILE`` each run is appended to ``FILE`` (JSON Lines) as soon as
it ends, so an interrupted soak keeps its runs; started again with the same
``--record`` and the same job, it runs only the missing ones and summarizes
them all (``--runs`` is the total wanted).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def build_prompt(tokens: int) -> Tuple[str, int]:
    """The LICENSE text, repeated, cut to ``tokens`` tokens and decoded; and how
    many tokens the model reads in it (encoded again, the joins of the repeats
    may tokenize differently: 601 for 600, 1,497 for 1,494)."""
    from captum_iglens.hf.models import load_default

    _, tokenizer = load_default(progress=False)
    text = (ROOT / "LICENSE").read_text(encoding="utf-8") + "\n\n"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    repeated = ids * (tokens // max(1, len(ids)) + 1)
    prompt = str(tokenizer.decode(repeated[:tokens]))
    return prompt, len(tokenizer(prompt, add_special_tokens=False).input_ids)


def run_once(prompt_file: str, args: argparse.Namespace) -> tuple:
    """One CLI job in a fresh process: its peak RSS in bytes and wall seconds."""
    command = [
        sys.executable,
        "-m",
        "captum_iglens",
        "attribute",
        "--stdin",
        "--no-chat",
        "--quiet",
        "--positions",
        args.positions,
        "--granularity",
        args.granularity,
        "--max-chunk-mib",
        str(args.max_chunk_mib),
        "--max-new-tokens",
        "1",
        "--json",
        os.devnull,
    ]
    for option, value in _passed(args).items():
        command += [option, str(value)]
    start = time.perf_counter()
    with open(prompt_file, "rb") as stdin:
        child = subprocess.Popen(
            command, stdin=stdin, stdout=subprocess.DEVNULL, cwd=ROOT
        )
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"run failed with exit status {child.returncode}")
    return usage.ru_maxrss * 1024, time.perf_counter() - start


def _passed(args: argparse.Namespace) -> Dict[str, object]:
    """The optional command-line options given to this soak, passed on as they
    are: ``{"--n-steps": 8}``."""
    return {
        "--" + name.replace("_", "-"): getattr(args, name)
        for name in ("n_steps", "layers")
        if getattr(args, name) is not None
    }


def _job(args: argparse.Namespace) -> Dict[str, object]:
    """The settings a record must share to be summarized with this soak."""
    job: Dict[str, object] = {
        "tokens": args.tokens,
        "granularity": args.granularity,
        "positions": args.positions,
        "max_chunk_mib": args.max_chunk_mib,
    }
    job.update({o[2:].replace("-", "_"): v for o, v in _passed(args).items()})
    return job


def read_records(path: Optional[Path], job: Dict[str, object]) -> List[dict]:
    """The runs already recorded in ``path`` for ``job``; other jobs are refused."""
    if path is None or not path.exists():
        return []
    records = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
    ]
    for record in records:
        if record["job"] != job:
            raise SystemExit(
                f"--record {path}: holds runs of another job ({record['job']}); "
                "give another file"
            )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=1494)
    parser.add_argument("--granularity", default="block")
    parser.add_argument("--positions", default="all")
    parser.add_argument("--max-chunk-mib", type=int, default=32)
    parser.add_argument("--n-steps", type=int, default=None)
    parser.add_argument("--layers", default=None, help="as the command line takes it")
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args()
    job = _job(args)
    records = read_records(args.record, job)
    prompt, read = build_prompt(args.tokens)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(prompt)
    try:
        print(
            f"captum-iglens attribute: {args.tokens} tokens ({read} as the model "
            f"reads them), --positions "
            f"{args.positions}, --granularity {args.granularity}, --max-chunk-mib "
            f"{args.max_chunk_mib}"
            + "".join(f", {o} {v}" for o, v in _passed(args).items())
            + f"; {args.runs} fresh processes"
        )
        for record in records:
            _print_run(record)
        while len(records) < args.runs:
            peak, seconds = run_once(handle.name, args)
            record = {"run": len(records) + 1, "job": job}
            record.update(peak_bytes=peak, seconds=round(seconds, 1))
            records.append(record)
            _print_run(record)
            if args.record is not None:
                with args.record.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
    finally:
        os.unlink(handle.name)
    peaks = [record["peak_bytes"] for record in records]
    median, worst = statistics.median(peaks), max(peaks)
    print(
        f"median {median / MIB:.0f} MiB, worst {worst / MIB:.0f} MiB, "
        f"worst / median {worst / median:.2f} (goal <= 1.3)"
    )


def _print_run(record: dict) -> None:
    print(
        f"run {record['run']:2d}: peak RSS {record['peak_bytes'] / MIB:8.0f} MiB "
        f"({record['seconds']:.0f} s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
