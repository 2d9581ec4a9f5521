"""Notebook 15 through the grader (tests/lab/teacher_runs.py): it runs top to bottom,
the teacher's answers are right, None and wrong answers are wrong, and no failure shows an
expected value."""

import pytest

pytest.importorskip("nbclient")

from .teacher_runs import grade_teachers_notebook  # noqa: E402

pytestmark = pytest.mark.slow


def test_notebook_15_grades_right_and_wrong():
    grade_teachers_notebook("15_fleet_in_production")
