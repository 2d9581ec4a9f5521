"""The grader end to end on the toy notebook (tests/lab/toy.py), through real kernels:
right answers are right, and each way the review fooled the old checker now gets "wrong".

Slow: every submission is a kernel of its own, and the checks one more."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from minicb.graded_labs.checker import grade  # noqa: E402
from minicb.graded_labs.student import student_version  # noqa: E402

from .toy import toy_teacher  # noqa: E402

pytestmark = pytest.mark.slow

RIGHT = {"answer_sum": "answer_sum = sum(xs)",
         "answer_extremes": "answer_extremes = (min(xs), max(xs))",
         "def spread": "def spread(values):\n    return max(values) - min(values)"}  # fmt: skip


def submission(folder: Path, name: str, answers: dict[str, str], extra: str = "") -> Path:
    """The student copy with ``answers`` (by the start of the answer cell) and ``extra``
    (a cell after the first answer)."""
    nb = student_version(toy_teacher(), "00_toy.ipynb")
    for c in nb.cells:
        for start, source in answers.items():
            if c.cell_type == "code" and c.source.startswith(start):
                c.source = source
    if extra:
        first = next(i for i, c in enumerate(nb.cells) if c.source.startswith("answer_sum"))
        nb.cells.insert(first + 1, nbformat.v4.new_code_cell(extra))
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One class, graded at once: every submission below, against a teacher's notebook
    kept outside the students' folder. The temp folder is the test's own, to see what a
    grading leaves there."""
    root = tmp_path_factory.mktemp("class")
    private = root / "private"
    private.mkdir()
    teacher = private / "00_toy.ipynb"
    nbformat.write(toy_teacher(), teacher)
    nb = toy_teacher()
    nb.cells.append(nbformat.v4.new_code_cell("1 / 0"))  # a teacher's cell that breaks
    broken = private / "broken.ipynb"
    nbformat.write(nb, broken)
    subs = root / "submissions"
    subs.mkdir()
    solutions = "\n\n".join(c.source for c in toy_teacher().cells if c.source.startswith("# Sol"))
    paths = {
        "right": submission(subs, "alice.ipynb", RIGHT),
        "untouched": submission(subs, "bob.ipynb", {}),
        "hook": submission(subs, "carol.ipynb", {}, extra=(
            "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)")),
        "helpers": submission(subs, "dave.ipynb", {"answer_sum": "answer_sum = 99"}, extra=(
            "def expect(ok, violated):\n    pass\n"
            "def correct(*a):\n    print('correct: sure')\n"
            "xs = [99]")),
        "pasted": submission(subs, "erin.ipynb", {}, extra=solutions),
        "constant": submission(subs, "frank.ipynb", {**RIGHT, "def spread": (
            "def spread(values):\n    return 4  # right for xs, and only for xs")}),
        "cwd": submission(subs, "grace.ipynb", RIGHT, extra=(
            "import os, tempfile\n"
            "assert not os.path.exists('00_toy.ipynb') and not os.listdir('.')\n"
            "open(os.path.join(tempfile.gettempdir(), 'left-behind'), 'w').write('x')")),
    }
    tmp = root / "tmp"
    tmp.mkdir()
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), None
    try:
        results = grade(list(paths.values()), teacher)
        broken_run = grade([broken], broken)[0]
    finally:
        tempfile.tempdir = saved[1]
        if saved[0] is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = saved[0]
    return dict(zip(paths, results, strict=True)), broken_run, tmp


def verdicts(g):
    return [r.correct for r in g.results]


def test_right_answers_are_right(graded):
    right = graded[0]["right"]
    assert verdicts(right) == [True, True, True], right
    assert right.results[0].detail == "correct: 14" and right.errors == []


def test_an_untouched_notebook_is_told_to_write_each_answer(graded):
    g = graded[0]["untouched"]
    assert verdicts(g) == [False, False, False]
    assert g.results[0].detail == "the sum: write an int, not None (no answer yet)"
    assert g.results[2].detail == "spread is not the largest minus the smallest value"


def test_an_exception_hook_in_the_answer_cell_passes_nothing(graded):
    assert verdicts(graded[0]["hook"]) == [False, False, False]


def test_redefined_helpers_and_fixtures_reach_no_check(graded):
    g = graded[0]["helpers"]
    assert verdicts(g) == [False, False, False]
    assert g.results[0].detail == "that is not the sum of xs"


def test_pasted_worked_solutions_are_wrong(graded):
    g = graded[0]["pasted"]
    assert verdicts(g) == [False, False, False]
    assert all("teacher's worked solution" in r.detail for r in g.results)


def test_a_function_right_only_on_the_visible_case_fails_the_hidden_one(graded):
    assert verdicts(graded[0]["constant"]) == [True, True, False]


def test_the_kernel_runs_in_a_scratch_folder_and_leaves_nothing_behind(graded):
    """The submission's working directory is empty (no teacher's notebook beside it),
    and what it writes to the temp folder goes with the scratch folder."""
    assert verdicts(graded[0]["cwd"]) == [True, True, True], graded[0]["cwd"].errors
    assert list(graded[2].iterdir()) == []


def test_a_teachers_cell_that_fails_after_the_exercises_is_reported(graded):
    broken = graded[1]
    assert verdicts(broken) == [True, True, True]
    assert len(broken.errors) == 1, broken.errors
    assert broken.errors[0].endswith("ZeroDivisionError: division by zero")


def test_the_kernel_is_this_interpreter(tmp_path):
    """The grader's kernel runs the Python under test and this checkout's minicb,
    whatever kernelspecs the machine has."""
    import sys

    import minicb

    same = "from pathlib import Path as P\nassert P({}).resolve() == P({!r}).resolve()\n"
    nb = toy_teacher()
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "import sys, minicb\n" + same.format("sys.prefix", sys.prefix)
        + same.format("minicb.__file__", minicb.__file__)
    ))  # fmt: skip
    teacher = tmp_path / "00_toy.ipynb"
    nbformat.write(nb, teacher)
    assert grade([teacher], teacher)[0].errors == []
