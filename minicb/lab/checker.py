"""Checks a student's notebook: which answers are right.

The graded run is the teacher's notebook with, for each exercise, the cells between its
heading and its check replaced by the submitted notebook's cells there (the student's
answers; in the teacher's own notebook, the answer cell and the worked solution). Every
other cell, the checks included, is the teacher's, so editing a check does not pass it.
The run goes top to bottom in a fresh kernel of this interpreter, errors allowed, and each
exercise is right when its cells and its check ran without an error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicb.lab.exercises import find_exercises

KERNEL_NAME = "minicb-lab"
CELL_TIMEOUT_S = 600


@dataclass(frozen=True)
class Result:
    number: int
    correct: bool
    detail: str  # the check's "correct: ..." line, or the error


def graded_notebook(teacher: Any, submitted: Any) -> tuple[Any, dict[int, list[int]]]:
    """The notebook to run, and for each exercise the indices of its cells in it (the
    submitted cells, then the teacher's check)."""
    import copy

    exercises = find_exercises(teacher)
    sources = [c.source for c in submitted.cells]
    out = copy.deepcopy(teacher)
    cells, spans, start = [], {}, 0
    for e in exercises:
        cells += out.cells[start : e.heading + 1]
        check = teacher.cells[e.check].source
        title = f"**Exercise {e.number}.**"
        heading = next((i for i, c in enumerate(submitted.cells)
                        if c.cell_type == "markdown" and title in c.source), None)  # fmt: skip
        end = None
        if heading is not None and check in sources[heading:]:
            end = sources.index(check, heading)
        if end is None:
            raise ValueError(f"exercise {e.number}: its heading or its check cell is missing or "
                             "changed; restore it from the teacher's notebook")  # fmt: skip
        mine = [copy.deepcopy(c) for c in submitted.cells[heading + 1 : end]
                if c.cell_type == "code"]  # fmt: skip
        spans[e.number] = list(range(len(cells), len(cells) + len(mine) + 1))
        cells += mine + [out.cells[e.check]]
        start = e.check + 1
    cells += out.cells[start:]
    for c in cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    out.cells = cells
    return out, spans


def _kernelspec_dir() -> str:
    """A Jupyter data folder whose kernel runs this interpreter (the one with minicb)."""
    data = tempfile.mkdtemp(prefix="minicb-lab-")
    spec = Path(data) / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minicb lab", "language": "python",
    }))  # fmt: skip
    return data


def _error(cell: Any) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}".strip()
    return None


def _printed(cell: Any) -> str:
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")
    lines = [line for line in text.splitlines() if line.startswith("correct")]
    return lines[-1] if lines else "ran without an error"


def check_notebook(path: Path, teacher: Path | None = None) -> list[Result]:
    """Run ``path`` against the teacher's checks; one Result per exercise."""
    return graded_run(path, teacher)[0]


def graded_run(path: Path, teacher: Path | None = None) -> tuple[list[Result], list[str]]:
    """``check_notebook``'s results, and every cell's error in the run, in order
    (``"cell 12: NameError: ..."``): a teacher's notebook must have none, after its
    exercises as well as before them, so its one graded run also tests it top to bottom."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    teacher = teacher or Path(__file__).resolve().parents[2] / "notebooks" / path.name
    if not teacher.exists():
        raise ValueError(f"no teacher's notebook {teacher} for {path.name}")
    run, spans = graded_notebook(nbformat.read(teacher, as_version=4),
                                 nbformat.read(path, as_version=4))  # fmt: skip
    data = _kernelspec_dir()
    env = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (data, env) if p)
    try:
        NotebookClient(run, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT_S, allow_errors=True,
                       resources={"metadata": {"path": str(teacher.parent)}}).execute()  # fmt: skip
    finally:
        if env is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = env
    first = min(i for span in spans.values() for i in span)
    before = [(i, _error(c)) for i, c in enumerate(run.cells[:first]) if c.cell_type == "code"]
    broken = [(i, err) for i, err in before if err]
    results = []
    for number, span in spans.items():
        errors = [_error(run.cells[i]) for i in span]
        err = next((e for e in errors if e), None)
        if broken and err:
            err = f"{err} (cell {broken[0][0]} before the exercises failed: {broken[0][1]})"
        results.append(Result(number, err is None, err or _printed(run.cells[span[-1]])))
    errors = [f"cell {i}: {err}" for i, c in enumerate(run.cells) if (err := _error(c))]
    return results, errors


def report(path: Path, results: list[Result]) -> str:
    right = sum(r.correct for r in results)
    lines = [f"{path}: {right} of {len(results)} right"]
    for r in results:
        lines.append(f"  exercise {r.number}: {'right' if r.correct else 'not yet'}: {r.detail}")
    return "\n".join(lines)
