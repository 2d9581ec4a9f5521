"""Notebook 14 through the grader (tests/lab/teacher_runs.py): it runs top to bottom,
the teacher's answers are right, None and wrong answers are wrong, and no failure shows an
expected value."""

import pytest

pytest.importorskip("nbclient")

from .teacher_runs import grade_teachers_notebook  # noqa: E402

pytestmark = pytest.mark.slow


def test_notebook_14_grades_right_and_wrong():
    grade_teachers_notebook("14_overlap_scheduling")
