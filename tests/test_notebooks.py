"""Every notebook in notebooks/ runs top to bottom against the code as it is now.

Each notebook is executed in a fresh Jupyter kernel by nbclient, one test per notebook, so
a renamed function, a changed field or a scheduler that decides differently makes its
notebook fail here instead of in front of a class. The exercises' check cells assert
against the engine's own results, so they are tested too.

The kernel must be this interpreter (the one with minicb installed), whatever kernelspecs
the machine has: the fixture writes a kernelspec that names ``sys.executable`` into a
temporary Jupyter data folder and puts it first on JUPYTER_PATH, so a fresh venv in CI
needs no ``ipykernel install`` step.

The notebooks are stored without outputs; a fast test checks that too.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
KERNEL_NAME = "minicb-tests"
CELL_TIMEOUT_S = 600


def _read(path: Path):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A kernelspec running ``sys.executable``, found first on JUPYTER_PATH."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    data_dir = tmp_path_factory.mktemp("jupyter")
    spec_dir = data_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minicb tests (this interpreter)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    with pytest.MonkeyPatch.context() as mp:
        paths = [str(data_dir), os.environ.get("JUPYTER_PATH")]
        mp.setenv("JUPYTER_PATH", os.pathsep.join(p for p in paths if p))
        yield KERNEL_NAME


def _execute(nb, kernel_name: str, cwd: Path) -> None:
    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()


def test_there_are_ten_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, 11)], NOTEBOOKS


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


def test_kernel_runs_this_interpreter(kernel_name, tmp_path):
    """The notebooks' kernel is the Python under test, with this checkout's minicb."""
    pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(
        cells=[
            new_code_cell(
                "import json, sys, minicb\n"
                "print(json.dumps({'prefix': sys.prefix, 'minicb': minicb.__file__}))"
            )
        ]
    )
    _execute(nb, kernel_name, tmp_path)
    seen = json.loads(nb.cells[0].outputs[0]["text"])
    assert Path(seen["prefix"]).resolve() == Path(sys.prefix).resolve()
    import minicb

    assert Path(seen["minicb"]).resolve() == Path(minicb.__file__).resolve()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_name):
    """Top to bottom, in the notebooks' own folder, as a reader would run it."""
    _execute(_read(path), kernel_name, NOTEBOOK_DIR)
