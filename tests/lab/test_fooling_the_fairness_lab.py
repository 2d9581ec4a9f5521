"""The review's attempts on the fairness lab (docs/labs.md's own example), each graded by
the real grader: right answers are right, and every trick gets "wrong".

The attempts (../shared/reviews/teaching-round4.md, section 4): aging 0 (plain head of line,
which the old "choose an aging" check accepted), an IPython exception hook in the answer
cell, a redefined ``runs`` helper returning waits of 0, and the teacher's solution cells
pasted in. Slow: five kernels for the submissions and one for the checks."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from minicb.graded_labs.checker import grade  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TEACHER = ROOT / "notebooks" / "lab_fairness.ipynb"
STUDENT = ROOT / "notebooks" / "student" / "lab_fairness.ipynb"


def submission(folder: Path, name: str, aging: str, reserve: str, extra: str = "") -> Path:
    nb = nbformat.read(STUDENT, as_version=4)
    for c in nb.cells:
        if c.source.startswith("answer_aging_steps = None"):
            c.source = f"answer_aging_steps = {aging}\n{extra}"
        if c.source.startswith("answer_reserve_blocks = None"):
            c.source = f"answer_reserve_blocks = {reserve}"
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    teacher = nbformat.read(TEACHER, as_version=4)
    pasted = "\n\n".join(c.source for c in teacher.cells if c.source.startswith("# Solution"))
    fake_runs = ("from types import SimpleNamespace as R\n"
                 "def runs(policy, **knobs):\n"
                 "    return [R(long_wait=0, short_wait_mean=0.0, occupancy=1.0)] * 4")  # fmt: skip
    paths = {
        "right": submission(folder, "s1.ipynb", "20", "17"),
        "aging 0": submission(folder, "s2.ipynb", "0", "17"),
        "hook": submission(folder, "s3.ipynb", "None", "None", extra=(
            "get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)")),
        "helper": submission(folder, "s4.ipynb", "30", "999", extra=fake_runs),
        "pasted": submission(folder, "s5.ipynb", "None", "None", extra=pasted),
    }
    return dict(zip(paths, grade(list(paths.values()), TEACHER), strict=True))


def verdicts(graded, name):
    return [r.correct for r in graded[name].results]


def test_the_right_answers_are_right(graded):
    assert verdicts(graded, "right") == [True, True], graded["right"]


def test_aging_0_is_not_the_answer(graded):
    assert verdicts(graded, "aging 0") == [False, True]
    assert "find the largest" in graded["aging 0"].results[0].detail


def test_an_exception_hook_passes_nothing(graded):
    assert verdicts(graded, "hook") == [False, False]


def test_a_redefined_helper_reaches_no_check(graded):
    assert verdicts(graded, "helper") == [False, False]
    assert "over 40 iterations" in graded["helper"].results[0].detail


def test_the_teachers_solution_cells_pasted_are_wrong(graded):
    assert verdicts(graded, "pasted") == [False, False]
