"""The tutorial notebooks in tutorials/ run from top to bottom without an error.

Every ``*.ipynb`` in ``tutorials/`` is picked up, so new tutorials are tested without
editing this file. Notebooks are executed in memory (the committed files, with their
outputs, are left untouched) by a ``python3`` kernel, which ``jupyter_client`` starts
with the interpreter running the tests, in the ``tutorials/`` folder.
"""

from pathlib import Path

import nbclient
import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def test_tutorials_exist():
    assert NOTEBOOKS, f"no notebooks in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_is_committed_with_outputs(path):
    """Notebooks are committed executed, so that they can be read without running."""
    cells = [c for c in _read(path).cells if c.cell_type == "code"]
    assert cells, f"{path.name} has no code cell"
    unexecuted = [i for i, c in enumerate(cells) if c.get("execution_count") is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} were not executed"
    errors = [
        i
        for i, c in enumerate(cells)
        if any(o.get("output_type") == "error" for o in c.get("outputs", []))
    ]
    assert not errors, f"{path.name}: code cells {errors} were saved with an error"


@pytest.mark.real_model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_runs(path):
    notebook = _read(path)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(TUTORIALS)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback
