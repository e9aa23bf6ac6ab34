"""The docs pages generated from the code (docs/_ext/pagegen.py) and the rule that
no page reads another file by heading text. The whole site is built, with
warnings as errors, by the test command (.ci/test.sh)."""

import argparse
import re
import sys
from pathlib import Path

import pytest

from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.cli import build_parser
from captum_iglens.hf.table import BUILT_IN

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import pagegen  # noqa: E402


def _subcommands() -> dict:
    (commands,) = [
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return dict(commands.choices)


def test_the_cli_page_has_every_subcommand_and_option():
    page = pagegen.cli_page()
    sections = re.split(r"^## `captum-iglens ([\w-]+)`$", page, flags=re.M)
    by_name = dict(zip(sections[1::2], sections[2::2]))
    parsers = _subcommands()
    assert list(by_name) == list(parsers)
    for name, parser in parsers.items():
        for action in parser._actions:
            for option in action.option_strings:
                assert f"`{option}" in by_name[name], (name, option)
    assert "examples:" in page and "captum-iglens shell" in page


def test_the_architecture_table_has_a_row_per_entry():
    rows = [
        line.split("|")[1].strip().strip("`")
        for line in pagegen.architecture_table().splitlines()[2:]
    ]
    assert rows == sorted(BUILT_IN)
    table = pagegen.architecture_table()
    assert "| `gpt2` | `transformer.h` | `transformer.ln_f` (layer)" in table


def test_the_docs_name_every_granularity():
    # Issue 33: help and docs list every granularity (they once left out
    # neuron and expert). The CLI page takes the help text (granularity_help).
    rows = [
        line
        for line in (DOCS / "granularities.md").read_text(encoding="utf-8").splitlines()
        if line.startswith('| `"')
    ]
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    (choices,) = [line for line in readme.splitlines() if line.startswith("| granul")]
    for name in GRANULARITIES:
        assert any(f'`"{name}"`' in row for row in rows), name
        assert f"`{name}`" in choices, name
        assert f"'{name}': " in " ".join(pagegen.cli_page().split()), name


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_no_page_includes_a_slice_of_another_file(page):
    text = page.read_text(encoding="utf-8")
    assert ":start-after:" not in text and ":end-before:" not in text


def _layout_rows() -> list:
    """The paths named in the first column of docs/extending.md's package
    layout table (a folder ends with ``/``)."""
    table = (DOCS / "extending.md").read_text().split("## Package layout")[1]
    cells = re.findall(r"^\| ([^|]*) \|", table, flags=re.M)
    return [
        path for cell in cells for path in re.findall(r"`(captum_iglens/[^`]*)`", cell)
    ]


def test_the_layout_table_names_every_module_and_nothing_else():
    package = DOCS.parent / "captum_iglens"
    rows = _layout_rows()
    assert len(rows) > 20  # the table was found
    stale = [row for row in rows if not (DOCS.parent / row).exists()]
    assert not stale, f"rows for paths that do not exist: {stale}"
    modules = [
        path.relative_to(DOCS.parent).as_posix()
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    ]
    missing = [
        module
        for module in modules
        if not any(
            module == row or (row.endswith("/") and module.startswith(row))
            for row in rows
        )
    ]
    assert not missing, f"modules without a row in docs/extending.md: {missing}"
