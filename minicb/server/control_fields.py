"""A browser's control, checked field by field before anything is touched.

Every field of a control (controls.py) is read through one of these checks: present and
what it must be (an integer in a range, one of the names allowed, true or false), absent
and its default, or anything else and a ``ControlError`` naming the field, what it must be
and what came. ``only`` refuses fields a control does not know. So a malformed control
gets an error and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ControlError(ValueError):
    """A control that cannot be carried out; its message goes back to the browser."""


def field(msg: dict, key: str, ok: Callable[[Any], bool], what: str, default: Any) -> Any:
    """``msg[key]`` if ``ok`` says it is ``what``, ``default`` if it is absent."""
    if key not in msg:
        return default
    if not ok(msg[key]):
        raise ControlError(f"{key} must be {what}, got {msg[key]!r}")
    return msg[key]


def number(msg: dict, key: str, lo: float, hi: float, default: Any = None, kind: type = int) -> Any:
    """An integer from ``lo`` to ``hi``; with ``kind`` float, any number."""
    what = f"{'an integer' if kind is int else 'a number'} from {lo} to {hi}"

    def ok(v: Any) -> bool:
        return isinstance(v, int | kind) and not isinstance(v, bool) and lo <= v <= hi

    return field(msg, key, ok, what, default)


def choice(msg: dict, key: str, allowed: tuple[str, ...], default: Any = None) -> Any:
    return field(msg, key, lambda v: v in allowed, f"one of {', '.join(allowed)}", default)


def only(msg: dict, allowed: set[str]) -> None:
    unknown = sorted(set(msg) - allowed - {"type", "id"})
    if unknown:
        raise ControlError(f"unknown field(s): {', '.join(unknown)}")


def boolean(msg: dict, key: str) -> Any:
    return field(msg, key, lambda v: isinstance(v, bool), "true or false", None)
