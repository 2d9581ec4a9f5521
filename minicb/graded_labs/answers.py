"""A student's answers as data: how they leave the student's kernel and reach the checks.

The grader never runs a check beside the student's code (a student's cell could redefine
the helpers the check calls, or install a hook that hides its errors). It runs the
student's cells in one kernel, reads each ``answer_...`` there as data, and hands that data
to the teacher's checks in another kernel. What crosses is JSON:

- numbers, strings, ``None``, lists and tuples (tuples arrive as lists) as themselves;
- a dict (a ``Counter`` too) as ``{"dict": [[key, value], ...]}``, so int keys stay ints;
- a tensor (or an array) as ``{"tensor": nested lists, "dtype": "torch.bool"}``;
- a function as ``{"function": its source, "name": its name}``: in the checks' kernel it
  becomes an ``IsolatedFunction``, which runs that source in a process of its own.

Anything else cannot be graded, and the student is told its type.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import types
from collections.abc import Callable
from typing import Any

MARKER = "minicb-lab-answers:"  # the line the harvest cell prints, before the JSON


def encode(value: Any) -> Any:
    """``value`` as JSON data (see the module's docstring); TypeError for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, types.FunctionType):
        try:
            source = inspect.getsource(value)
        except (OSError, TypeError) as e:
            raise TypeError(f"the source of function {value.__name__} cannot be read: {e}") from e
        return {"function": textwrap.dedent(source), "name": value.__name__}
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        if getattr(value, "ndim", None) == 0:  # a numpy or torch scalar: a plain number
            return encode(value.item())
        return {"tensor": value.tolist(), "dtype": str(value.dtype)}
    raise TypeError(f"an answer of type {type(value).__name__} cannot be graded: write numbers, "
                    "lists, tuples, dicts, a tensor or a function")  # fmt: skip


def decode(data: Any, *, make_function: Callable[[str, str], Any] | None = None) -> Any:
    """The value ``encode`` gave ``data`` for; a function becomes ``make_function(source,
    name)`` (the grader passes ``IsolatedFunction``: this module never runs a student's
    code), and is refused where no ``make_function`` is given."""
    if isinstance(data, list):
        return [decode(v, make_function=make_function) for v in data]
    if not isinstance(data, dict):
        return data
    if "dict" in data:
        return {_key(decode(k)): decode(v, make_function=make_function)
                for k, v in data["dict"]}  # fmt: skip
    if "tensor" in data:
        import torch

        return torch.tensor(data["tensor"], dtype=getattr(torch, data["dtype"].split(".")[-1]))
    if "function" in data and make_function is not None:
        return make_function(data["function"], data["name"])
    raise ValueError(f"not an encoded answer: {sorted(data)}")


def _key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key  # a dict key must be hashable


def report_answers(namespace: dict[str, Any], names: list[str]) -> None:
    """Print each answer of ``names`` as data: ``{name: {"data": ...} or {"error": ...}}``."""
    found: dict[str, Any] = {}
    for name in names:
        try:
            found[name] = {"data": encode(namespace.get(name))}
        except (TypeError, ValueError, RecursionError) as e:
            found[name] = {"error": str(e)}
    print(MARKER, json.dumps(found))


def harvest_source(names: list[str]) -> str:
    """The cell the grader appends to a student's run to read the answers."""
    return ("from minicb.graded_labs.answers import report_answers\n"
            f"report_answers(globals(), {names!r})")


def inject_source(answers: dict[str, Any]) -> str:
    """A cell of the checks' kernel that sets each answer from its data (a string literal:
    nothing of the student's is code here)."""
    lines = ["from minicb.graded_labs.answers import decode as _decode",
             "from minicb.graded_labs.isolated import IsolatedFunction as _Function"]
    lines += [f"{name} = _decode(__import__('json').loads({json.dumps(data)!r}), "
              "make_function=_Function)"
              for name, data in answers.items()]  # fmt: skip
    return "\n".join(lines)


def read_harvest(text: str) -> dict[str, Any] | None:
    """The answers a harvest cell printed (its last marker line), or None."""
    lines = [line for line in text.splitlines() if line.startswith(MARKER)]
    if not lines:
        return None
    try:
        found = json.loads(lines[-1][len(MARKER):])
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None
