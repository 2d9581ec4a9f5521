"""``minicb lab grade-code`` on a class folder, end to end: every submission in its own
process, the hidden workloads on the fake runner and on the tiny real model, one table and
a CSV (slow: 112 s on this loaded 2-core machine, mostly the real model's runs)."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minicb.graded_labs.coding.grader import PROPERTIES
from tests.lab.test_coding_lab import LEAKY, SHORTEST_FIRST, TEACHER

pytestmark = pytest.mark.slow


def test_a_class_folder_with_any_file_names_gives_one_table_and_a_csv(tmp_path):
    folder = tmp_path / "submissions"
    folder.mkdir()
    shutil.copy(TEACHER / "reference_admission.py", folder / "alice.py")
    (folder / "Bob Li v2.py").write_text(SHORTEST_FIRST)
    (folder / "c.py").write_text(LEAKY)
    (folder / "README.txt").write_text("not a submission")
    grades = tmp_path / "grades.csv"
    done = subprocess.run(
        [sys.executable, "-m", "minicb.cli", "lab", "grade-code", str(folder),
         "--teacher", str(TEACHER), "--csv", str(grades)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # not everyone passed
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["submission", "passed"]
    alice = next(line for line in lines if line.startswith(str(folder / "alice.py")))
    assert alice.split()[1:] == ["yes", *["ok"] * len(PROPERTIES)]  # the reference's copy
    assert "bounded wait" in done.stdout and "starves" in done.stdout
    assert "KV blocks: " in done.stdout
    with open(grades, encoding="utf-8") as f:
        rows = {Path(r["submission"]).name: r for r in csv.DictReader(f)}
    assert set(rows) == {"alice.py", "Bob Li v2.py", "c.py"}
    assert rows["alice.py"]["passed"] == "yes"
    assert all(rows["alice.py"][p] == "ok" for p in PROPERTIES)
    assert rows["Bob Li v2.py"]["bounded wait"].startswith("wrong: ")
    assert rows["Bob Li v2.py"]["greedy tokens"] == "ok"  # its tiny-model run included
    assert rows["c.py"]["limits"].startswith("wrong: KV blocks")
