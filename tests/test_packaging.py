"""The package as it is distributed: one version number, the typing marker, and
every file the package opens at run time declared as package data (a wheel built
without it would pass every test run from the source tree). The wheel itself is
built, installed and run by .ci/wheel_check.sh."""

import fnmatch
import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import captum_iglens
from captum_iglens.cli import main

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "captum_iglens"


def _package_data() -> list:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]["captum_iglens"]


def _declared(path: Path) -> bool:
    relative = path.relative_to(PACKAGE).as_posix()
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in _package_data())


def test_one_version_number(capsys):
    # The metadata is that of the installed (editable) package: reinstall after
    # changing captum_iglens/version.py.
    assert importlib.metadata.version("captum-iglens") == captum_iglens.__version__
    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert capsys.readouterr().out.split() == [
        "captum-iglens",
        captum_iglens.__version__,
    ]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in config["project"]  # read from captum_iglens/version.py
    assert config["project"]["dynamic"] == ["version"]


def test_typed_marker_is_shipped():
    assert (PACKAGE / "py.typed").is_file()
    assert _declared(PACKAGE / "py.typed")


def test_every_non_python_file_of_the_package_is_package_data():
    files = [
        path
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and path.suffix not in (".py", ".pyc")
        and "__pycache__" not in path.parts
    ]
    assert files  # the viewer's assets and the facts at least
    undeclared = [str(p.relative_to(ROOT)) for p in files if not _declared(p)]
    assert not undeclared, f"add to [tool.setuptools.package-data]: {undeclared}"


_OPENED = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    import torch

    package = Path(sys.argv[1]).resolve()
    opened = set()

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, Path)):
            path = Path(args[0]).resolve()
            if package in path.parents and path.suffix not in (".py", ".pyc"):
                opened.add(path.relative_to(package).as_posix())

    sys.addaudithook(hook)
    from captum_iglens import IGLensResult
    from captum_iglens.studies.validation import load_facts

    load_facts()
    b, p, k = 1, 2, 3
    attributions = torch.full((b, p, k), 0.1)
    result = IGLensResult(
        attributions=attributions,
        levels=torch.full((b, p, k), 0.5),
        base_prob=torch.zeros(b, p),
        model_prob=torch.full((b, p), 0.3),
        delta=torch.zeros(b, p),
        targets=torch.zeros(b, p, dtype=torch.long),
        positions=torch.arange(p),
        mask=torch.ones(b, p, dtype=torch.bool),
        layer_names=[str(i) for i in range(k)],
        method="prediction_aware",
        n_steps=1,
    )
    with tempfile.TemporaryDirectory() as out:
        result.to_html(Path(out) / "map.html")
    print(json.dumps(sorted(opened)))
    """
)


@pytest.mark.slow
def test_files_opened_at_run_time_are_package_data():
    # The viewer page and the shipped facts, opened for real; an audit hook
    # records every file of the package that is opened.
    found = subprocess.run(
        [sys.executable, "-c", _OPENED, str(PACKAGE)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    opened = json.loads(found.stdout.strip().splitlines()[-1])
    assert "data/facts.jsonl" in opened
    assert any(name.startswith("viewer/static/") for name in opened)
    undeclared = [name for name in opened if not _declared(PACKAGE / name)]
    assert not undeclared, f"opened at run time, not package data: {undeclared}"


def test_the_public_names_import_from_the_top_level():
    from captum_iglens import (  # noqa: F401
        IGLensResult,
        LayerIGLens,
        LLMLayerAttribution,
        Settings,
        Translators,
        load_default,
        register_architecture,
    )

    public = {"LayerIGLens", "LLMLayerAttribution", "IGLensResult", "Settings"}
    public |= {"load_default", "Translators", "register_architecture"}
    assert public <= set(captum_iglens.__all__)
    missing = [n for n in captum_iglens.__all__ if not hasattr(captum_iglens, n)]
    assert missing == []
