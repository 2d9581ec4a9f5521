"""The notebooks are readable without running them: docs/notebooks/NAME.md holds each one
with its outputs and figures (scripts/render_notebooks.py), and stays in step with it.

The notebooks are stored without outputs (tests/test_notebooks.py); the renderings carry a
hash of the cells they were rendered from, so changing a notebook without rendering it
again fails here, naming the command."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
spec = importlib.util.spec_from_file_location("render", ROOT / "scripts" / "render_notebooks.py")
render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_has_a_rendering_in_step_with_it(path):
    page = ROOT / "docs" / "notebooks" / f"{path.stem}.md"
    command = f"PYTHONPATH=. .venv/bin/python scripts/render_notebooks.py {path.name}"
    assert page.exists(), f"no rendering of {path.name}: run {command}"
    text = page.read_text(encoding="utf-8")
    stored = re.match(r"<!-- source hash: (\w+)", text)
    assert stored, page
    nb = nbformat.read(path, as_version=4)
    assert stored[1] == render.source_hash(nb), f"{path.name} changed since rendered: {command}"
    for image in re.findall(r"!\[[^\]]*\]\((images/[^)]+)\)", text):
        assert (page.parent / image).is_file(), image
    plotted = sum(c.source.count("fig.show()") for c in nb.cells if c.cell_type == "code")
    assert len(re.findall(r"!\[figure", text)) >= plotted, (page.name, plotted)


def test_the_hash_sees_a_changed_cell():
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    before = render.source_hash(nb)
    nb.cells[1].source += " "
    assert render.source_hash(nb) != before
