"""Graded labs: the student notebooks are the teacher's without solutions (generated, never
drifting), and the checker fails an untouched student notebook and passes the teacher's.

The fast tests use a small notebook of plain Python in the notebooks' exercise shape; the
slow ones run every real notebook twice through the checker, the teacher's and the
student's, each its own test."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from minicb.lab.checker import check_notebook, graded_notebook, graded_run, report  # noqa: E402
from minicb.lab.exercises import find_exercises  # noqa: E402
from minicb.lab.student import student_version, write_student_versions  # noqa: E402

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


def toy_teacher() -> nbformat.NotebookNode:
    """Two exercises in the notebooks' shape, plain Python."""
    v4 = nbformat.v4
    cells = [v4.new_markdown_cell("# Toy"), v4.new_code_cell("xs = [3, 1, 4, 1, 5]")]
    for n, (answer, solution, check) in enumerate([
        ("answer_sum = None", "answer_sum = sum(xs)", "assert answer_sum == 14, answer_sum"),
        ("answer_max = None", "answer_max = max(xs)", "assert answer_max == 5, answer_max"),
    ], 1):  # fmt: skip
        cells += [
            v4.new_markdown_cell(f"**Exercise {n}.** ..."),
            v4.new_markdown_cell(f"**练习 {n}.** ..."),
            v4.new_code_cell(answer),
            v4.new_code_cell(f"# Solution\nif {answer.split()[0]} is None:\n    {solution}"),
            v4.new_code_cell(f"{check}\nprint('correct:', {answer.split()[0]})"),
        ]
    cells.append(v4.new_markdown_cell("the end"))
    return v4.new_notebook(cells=cells)


@pytest.fixture
def toy(tmp_path):
    teacher = tmp_path / "teacher" / "00_toy.ipynb"
    teacher.parent.mkdir()
    nbformat.write(toy_teacher(), teacher)
    student = tmp_path / "00_toy.ipynb"
    nbformat.write(student_version(toy_teacher(), teacher.name), student)
    return teacher, student


def test_the_checker_passes_the_teacher_and_fails_the_untouched_student(toy):
    teacher, student = toy
    assert [r.correct for r in check_notebook(teacher, teacher)] == [True, True]
    results = check_notebook(student, teacher)
    assert [r.correct for r in results] == [False, False]
    assert "AssertionError" in results[0].detail
    assert "0 of 2 right" in report(student, results)


def test_the_graded_run_is_this_interpreter_with_this_checkout(tmp_path):
    """The checker's kernel runs the Python under test and this checkout's minicb, whatever
    kernelspecs the machine has."""
    import sys

    import minicb

    same = "from pathlib import Path as P\nassert P({}).resolve() == P({!r}).resolve()\n"
    nb = toy_teacher()
    nb.cells.insert(1, nbformat.v4.new_code_cell(
        "import sys, minicb\n" + same.format("sys.prefix", sys.prefix)
        + same.format("minicb.__file__", minicb.__file__)
    ))  # fmt: skip
    teacher = tmp_path / "00_toy.ipynb"
    nbformat.write(nb, teacher)
    assert graded_run(teacher, teacher)[1] == []


def test_a_cell_that_fails_after_the_exercises_is_reported(tmp_path):
    """Errors anywhere in the run are listed, so a teacher's notebook that breaks after its
    last exercise fails its test even though every exercise is right."""
    nb = toy_teacher()
    nb.cells.append(nbformat.v4.new_code_cell("1 / 0"))
    teacher = tmp_path / "00_toy.ipynb"
    nbformat.write(nb, teacher)
    results, errors = graded_run(teacher, teacher)
    assert [r.correct for r in results] == [True, True]
    assert len(errors) == 1 and errors[0].endswith(": ZeroDivisionError: division by zero"), errors


def test_the_checker_grades_each_answer_and_ignores_an_edited_check(toy):
    teacher, student = toy
    nb = nbformat.read(student, as_version=4)
    answers = [i for i, c in enumerate(nb.cells) if c.source == "answer_sum = None"]
    nb.cells[answers[0]].source = "answer_sum = 3 + 1 + 4 + 1 + 5"
    maxes = [i for i, c in enumerate(nb.cells) if c.source == "answer_max = None"]
    nb.cells[maxes[0]].source = "answer_max = 4"  # wrong
    # a student who weakens a check still runs the teacher's
    nb.cells.insert(maxes[0] + 1, nbformat.v4.new_code_cell("assert True"))
    nbformat.write(nb, student)
    results = check_notebook(student, teacher)
    assert [r.correct for r in results] == [True, False]
    assert results[0].detail == "correct: 14"


def test_a_changed_check_cell_is_reported(toy):
    teacher, student = toy
    nb = nbformat.read(student, as_version=4)
    for c in nb.cells:
        c.source = c.source.replace("assert answer_max == 5", "assert answer_max")
    with pytest.raises(ValueError, match="exercise 2: its heading or its check cell"):
        graded_notebook(toy_teacher(), nb)


def test_the_fairness_lab_passes_the_teachers_notebook_and_fails_the_students():
    """The open-ended lab runs on a fake runner: quick enough to check on every run."""
    path = ROOT / "notebooks" / "lab_fairness.ipynb"
    teacher = check_notebook(path, path)
    assert [r.correct for r in teacher] == [True, True], report(path, teacher)
    student = check_notebook(ROOT / "notebooks" / "student" / path.name, path)
    assert [r.correct for r in student] == [False, False], report(path, student)


NUMBERED_LABS = [p for p in NOTEBOOKS if p.name[0].isdigit()]


# A lab's two runs are two tests (each runs the whole notebook, the exercises being at its
# end): a failure names which side broke, and neither test takes the time of both.
@pytest.mark.slow
@pytest.mark.parametrize("path", NUMBERED_LABS, ids=lambda p: p.stem)
def test_every_lab_passes_the_teachers_notebook(path):
    """The teacher's run is also the test that each notebook runs top to bottom, in the
    notebooks' folder, in a fresh kernel of this interpreter, without an error in any cell
    (it was tests/test_notebooks.py's own second run of every notebook)."""
    teacher, errors = graded_run(path, path)
    assert not errors, f"{path.name}: " + "; ".join(errors)
    assert teacher and all(r.correct for r in teacher), report(path, teacher)


@pytest.mark.slow
@pytest.mark.parametrize("path", NUMBERED_LABS, ids=lambda p: p.stem)
def test_every_lab_fails_the_untouched_students_notebook(path):
    student = ROOT / "notebooks" / "student" / path.name
    untouched = check_notebook(student, path)
    assert not any(r.correct for r in untouched), report(student, untouched)
