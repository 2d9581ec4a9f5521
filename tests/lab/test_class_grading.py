"""docs/labs.md's class-grading loop, as written there: a folder of submissions with any
file names, the teacher's notebook kept outside it (``--teacher``), one table, a CSV for
the gradebook, exit status 1 when any answer is wrong. Slow: four kernels."""

from __future__ import annotations

import csv

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from minicb.cli import main  # noqa: E402

from .test_grader_runs import RIGHT, submission  # noqa: E402
from .toy import toy_teacher  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_class_folder_graded_into_one_table_and_a_csv(tmp_path, capsys):
    teacher = tmp_path / "private" / "lab.ipynb"
    teacher.parent.mkdir()
    nbformat.write(toy_teacher(), teacher)
    folder = tmp_path / "submissions"
    folder.mkdir()
    submission(folder, "Alice Smith - lab 1.ipynb", RIGHT)
    submission(folder, "bob_final_v2.ipynb", {**RIGHT, "answer_sum": "answer_sum = 13"})
    submission(folder, "x.ipynb", {})
    paths = sorted(folder.glob("*.ipynb"))
    gradebook = tmp_path / "grades.csv"
    code = main(["lab", "check", *map(str, paths), "--teacher", str(teacher),
                 "--csv", str(gradebook)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1  # not everyone is right
    lines = out.splitlines()
    assert lines[0].split() == ["submission", "right", "ex1", "ex2", "ex3"]
    assert lines[1].endswith("3/3   ok     ok     ok") and "Alice Smith - lab 1" in lines[1]
    assert lines[2].endswith("2/3   --     ok     ok") and "bob_final_v2" in lines[2]
    assert lines[3].endswith("0/3   --     --     --")
    assert f"{paths[1]}: exercise 1: that is not the sum of xs" in out
    rows = list(csv.reader(gradebook.open(encoding="utf-8")))
    assert rows[0] == ["submission", "right", "of", "exercise 1", "exercise 2", "exercise 3"]
    assert rows[1][1:] == ["3", "3", "right", "right", "right"]
    assert rows[2][1:] == ["2", "3", "wrong: that is not the sum of xs", "right", "right"]


def test_a_missing_teachers_notebook_is_named_before_any_kernel(tmp_path, capsys):
    folder = tmp_path / "submissions"
    folder.mkdir()
    path = submission(folder, "alice.ipynb", {})
    assert main(["lab", "check", str(path)]) == 2
    assert "no teacher's notebook" in capsys.readouterr().err
