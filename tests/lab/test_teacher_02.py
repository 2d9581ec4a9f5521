"""Notebook 02 through the grader (tests/lab/teacher_runs.py): the teacher's answers
right, None and wrong answers wrong, no failure showing an expected value; and exercise 2
graded on its own, whatever exercise 1's answer (the review's coupled check: a wrong 2 for
exercise 1 once made a wrong 3 for exercise 2 right)."""

import pytest

pytest.importorskip("nbclient")

from .teacher_runs import grade_teachers_notebook  # noqa: E402

pytestmark = pytest.mark.slow


def test_notebook_02_grades_right_and_wrong():
    (coupled,) = grade_teachers_notebook("02_iteration_level_scheduling", more=[{
        "answer_admit_step": 2, "answer_tokens": 3, "answer_static": [10, 6]}])
    assert not coupled[1].correct and not coupled[2].correct, coupled
