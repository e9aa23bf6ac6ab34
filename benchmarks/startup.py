r"""
How long the command line takes to answer when it loads no model, each in a
fresh process, from one run:

    python benchmarks/startup.py              # 5 runs of each, medians
    python benchmarks/startup.py --repeats 11

It prints the wall time of ``captum-iglens --version``, ``--help``, a usage
error (``--n-steps x``), every subcommand's help and unknown ``--method`` and
``--granularity`` values (those read the registries' names, which import
nothing), beside ``import torch`` alone for scale, then value errors argparse's names
do not catch (``--n-steps 0``, ``--json /nonexist/x``...) and those checked
against the default model's config and tokenizer files (``--layers 999``,
``--foil``). The goal for all but the last is under 1 s (1.5 s for the
model-file checks): the parser is built, the registries' names and the model's
files read, without torch or transformers, which are imported only when a
command runs.
"""

import argparse
import statistics
import subprocess
import sys
import time
from typing import List, Sequence

#: What is timed: a label and the arguments of ``python``.
CASES = (
    ("--version", ["-m", "captum_iglens", "--version"]),
    ("--help", ["-m", "captum_iglens", "--help"]),
    ("usage error (--n-steps x)", ["-m", "captum_iglens", "--n-steps", "x", "p"]),
    *(
        (f"{name} --help", ["-m", "captum_iglens", name, "--help"])
        for name in ("attribute", "compare", "batch", "validate", "fit-lens", "shell")
    ),
    ("--method nope", ["-m", "captum_iglens", "--method", "nope", "p"]),
    ("--granularity nope", ["-m", "captum_iglens", "--granularity", "nope", "p"]),
    # Value errors argparse's types do not catch by name: goal under 1 s.
    *(
        (" ".join(option), ["-m", "captum_iglens", *option, "p"])
        for option in (
            ("--n-steps", "0"),
            ("--top-k", "-1"),
            ("--json", "/nonexist/x"),
            ("--baseline", "nan"),
            ("--lens", "foo"),
        )
    ),
    # Checked against the default model's config and tokenizer files (its
    # converted cache): goal under 1.5 s.
    *(
        (" ".join(option), ["-m", "captum_iglens", *option, "p"])
        for option in (
            ("--layers", "999"),
            ("--device", "gpu7"),
            ("--top-k", "100000"),
            ("--foil", " Lyon Paris"),
        )
    ),
    ("import torch (for scale)", ["-c", "import torch"]),
)


def _seconds(arguments: Sequence[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], capture_output=True, check=False)
    return time.perf_counter() - start


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"wall time, median of {args.repeats} fresh processes:")
    for label, arguments in CASES:
        times = [_seconds(arguments) for _ in range(args.repeats)]
        print(
            f"  {label:28s} {statistics.median(times):6.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f})"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
