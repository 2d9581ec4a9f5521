"""Graded labs: the student notebooks are the teacher's without solutions (generated, never
drifting from them).

With the answer cells' ``None`` (test_grader_parts.py) this is what proves that an
untouched student notebook fails every exercise of every lab; one real run of one
untouched student notebook (test_student_run.py) proves the grader says so. The grader's
own tests: test_grader_parts.py (fast), test_grader_runs.py, test_fooling_the_fairness_lab.py
and test_class_grading.py (slow); each teacher's notebook runs through the grader in a
test_teacher_*.py of its own (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from minicb.graded_labs.exercises import find_exercises  # noqa: E402
from minicb.graded_labs.student import student_version, write_student_versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LABS = [*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"), *(ROOT / "notebooks").glob("lab_*.ipynb")]
NOTEBOOKS = sorted(LABS)


def test_the_committed_student_notebooks_are_generated_from_the_teachers(tmp_path):
    written = write_student_versions(ROOT / "notebooks", tmp_path)
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]
    for path in written:
        committed = ROOT / "notebooks" / "student" / path.name
        assert committed.exists(), f"run `minicb lab student`: {committed} is missing"
        assert committed.read_text() == path.read_text(), (
            f"{committed} differs from the teacher's notebook: run `minicb lab student`"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_student_notebook_keeps_every_cell_but_the_solutions(path):
    teacher = nbformat.read(path, as_version=4)
    student = student_version(teacher, path.name)
    exercises = find_exercises(teacher)
    assert exercises, path.name
    assert len(student.cells) == len(teacher.cells) - len(exercises) + 1  # + the note
    assert not any(c.source.lstrip().startswith("# Solution") for c in student.cells)
    for e in exercises:  # each check is still there, unchanged
        assert teacher.cells[e.check].source in [c.source for c in student.cells]
