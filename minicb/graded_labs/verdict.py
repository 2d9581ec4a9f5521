"""What a check cell says: ``correct: ...`` or what the answer violated, never the answer.

Every check in the notebooks ends in one of two ways. It prints ``correct: ...`` (the
grader counts an exercise as right only on that line from a check that ran without an
error), or it raises ``Wrong`` with a sentence saying what the answer got wrong ("that is
not the number of padding rows the static engine computed"). The sentences are written in
the check as plain strings, so a failure cannot print the expected value: a student who
could read it off the first wrong try would learn nothing, and a grader that showed it
would hand the answer to the next student (a test checks every check cell for this).

The helpers read like the checks they serve: ``expect_int`` (and friends) first, because
``None`` or a string deserves "write an int", not a TypeError; then ``expect`` with the
property; then ``correct``.
"""

from __future__ import annotations

from typing import Any


class Wrong(AssertionError):
    """The answer is not right; the message says what it violated."""


def _kind(answer: Any) -> str:
    return "None (no answer yet)" if answer is None else f"a {type(answer).__name__}"


def expect(ok: bool, violated: str) -> None:
    """Raise ``Wrong(violated)`` unless ``ok``."""
    if not ok:
        raise Wrong(violated)


def expect_int(answer: Any, what: str) -> int:
    """``answer`` as an int (a bool or a float is not one)."""
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise Wrong(f"{what}: write an int, not {_kind(answer)}")
    return answer


def expect_number(answer: Any, what: str) -> float:
    """``answer`` as a float (an int is fine)."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise Wrong(f"{what}: write a number, not {_kind(answer)}")
    return float(answer)


def expect_ints(answer: Any, n: int, what: str) -> tuple[int, ...]:
    """``answer`` as a tuple of ``n`` ints (a list is fine)."""
    if not isinstance(answer, (tuple, list)) or len(answer) != n:
        raise Wrong(f"{what}: write {n} ints, as a tuple, not {_kind(answer)}")
    return tuple(expect_int(a, what) for a in answer)


def expect_numbers(answer: Any, n: int, what: str) -> tuple[float, ...]:
    """``answer`` as a tuple of ``n`` numbers."""
    if not isinstance(answer, (tuple, list)) or len(answer) != n:
        raise Wrong(f"{what}: write {n} numbers, as a tuple, not {_kind(answer)}")
    return tuple(expect_number(a, what) for a in answer)


def correct(*message: Any) -> None:
    """The check's verdict that the answer is right (what the grader looks for)."""
    print("correct:", *message)
