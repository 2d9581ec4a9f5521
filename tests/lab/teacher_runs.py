"""A teacher's notebook through the grader, as the test_teacher_*.py files run it.

The teacher's notebook is graded as its own submission (its worked solutions are its
answers): that one run also tests that the notebook runs top to bottom without an error
in any cell. In the same checks' run, two more answer sets are graded: every answer left
as None, and every answer made wrong (a number moved, a function that returns a constant).
Both must fail every exercise, and no failure message may hold an expected value that
the check's own text does not already show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat

from minicb.graded_labs.checker import check_answers, harvest
from minicb.graded_labs.exercises import find_exercises

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def wrong(data: Any) -> Any:
    """An answer of the same shape as ``data`` and not equal to it."""
    if isinstance(data, bool):
        return not data
    if isinstance(data, int):
        return data + 1
    if isinstance(data, float):
        return data * 1.5 + 1
    if isinstance(data, list):
        return [wrong(d) for d in data]
    if isinstance(data, dict) and "dict" in data:
        return {"dict": [[k, wrong(v)] for k, v in data["dict"]] or [[0, 1]]}
    if isinstance(data, dict) and "tensor" in data:
        return {**data, "tensor": wrong(data["tensor"])}
    if isinstance(data, dict) and "function" in data:
        name = data["name"]
        return {"function": f"def {name}(*args):\n    return 0.5\n", "name": name}
    return data


def numbers(data: Any) -> list[float]:
    """The numbers in an answer's data (not a function's)."""
    if isinstance(data, bool) or data is None:
        return []
    if isinstance(data, (int, float)):
        return [data]
    if isinstance(data, list):
        return [n for d in data for n in numbers(d)]
    if isinstance(data, dict) and "function" not in data:
        return numbers(data.get("dict") or data.get("tensor") or [])
    return []


def leaks(message: str, expected: list[float], check_source: str) -> list[str]:
    """The numbers of ``message`` that equal an expected value and that the check's text
    does not contain (so the run computed them)."""
    written = set(NUMBER.findall(check_source))
    found = []
    for token in NUMBER.findall(message):
        if token in written:
            continue
        value = float(token)
        if any(abs(value - e) <= 1e-6 * max(1.0, abs(e)) for e in expected):
            found.append(token)
    return found


def grade_teachers_notebook(name: str, more: list[dict[str, Any]] | None = None) -> list[dict]:
    """Run the checks above on ``notebooks/NAME.ipynb``; the results of ``more`` answer
    sets (given as {name: value data}), graded in the same run, for the caller to assert."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    teacher = nbformat.read(path, as_version=4)
    own = harvest(path, teacher, own=True)
    assert not own.errors, f"{name}: " + "; ".join(own.errors)
    assert not own.problems, own.problems
    data = {n: a["data"] for n, a in own.answers.items()}
    sets = [{n: {"data": wrong(d)} for n, d in data.items()},
            {n: {"data": None} for n in data},
            own.answers]  # fmt: skip
    sets += [{n: {"data": d} for n, d in s.items()} for s in more or []]
    results, errors = check_answers(teacher, sets)
    assert not errors, f"{name}: " + "; ".join(errors)
    wrong_set, none_set, right = results[:3]
    assert all(r.correct for r in right.values()), right
    exercises = find_exercises(teacher)
    for e in exercises:
        expected = [n for answer in e.answers for n in numbers(data[answer])]
        for bad in (wrong_set, none_set):
            result = bad[e.number]
            assert not result.correct, (name, e.number, result)
            assert not leaks(result.detail, expected, teacher.cells[e.check].source), (
                f"{name} exercise {e.number}'s failure shows an expected value: {result.detail}")
    return results[3:]
