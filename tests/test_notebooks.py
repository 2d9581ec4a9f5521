"""The notebooks in notebooks/: fifteen of them, stored clean.

Each notebook runs top to bottom through the lab grader, in tests/lab/test_teacher_NN.py
(one file per notebook, slow): the grader's runs of the teacher's notebook fail on an error
in any cell, so a renamed function, a changed field or a scheduler that decides differently
makes its notebook fail there instead of in front of a class.

The kernel is this interpreter (the one with minicb installed), whatever kernelspecs the
machine has: the grader writes a kernelspec naming ``sys.executable`` (tested in
tests/lab/test_grader_runs.py), so a fresh venv in CI needs no ``ipykernel install`` step.

The notebooks are stored without outputs; a fast test checks that too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def _read(path: Path):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


def test_there_are_fifteen_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, 16)], NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_clean(path):
    """No outputs or execution counts in the repository: diffs stay readable."""
    nb = _read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: cell {i} has stored outputs"
            assert cell.execution_count is None, f"{path.name}: cell {i} has an execution count"
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "minicb" in sources, f"{path.name} does not use minicb"
