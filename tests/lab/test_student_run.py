"""One real run of one untouched student notebook through the grader: every exercise is
wrong, each with "write ...", and the student's run itself has no error (the student copy
runs top to bottom). That every other student notebook is the generator's output and
leaves every answer None is checked fast (test_lab.py, test_grader_parts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nbclient")

from minicb.graded_labs.checker import grade  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_an_untouched_student_notebook_fails_every_exercise():
    student = ROOT / "notebooks" / "student" / "01_static_batching.ipynb"
    (graded,) = grade([student], ROOT / "notebooks" / student.name)
    assert graded.results and not any(r.correct for r in graded.results), graded
    assert all("write " in r.detail and "None (no answer yet)" in r.detail
               for r in graded.results), graded  # fmt: skip
    assert graded.errors == []
