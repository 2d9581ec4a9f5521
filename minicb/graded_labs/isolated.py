"""A function answer, run in a process of its own.

Some exercises ask for a function (``merge``, ``occupancy``). The grader carries its
source, not the function, to the checks' kernel, and the check calls it through
``call_each``: one child Python process receives the source and the inputs, defines the
function in an empty namespace (with ``math``, ``collections``, ``statistics`` and
``torch`` as the only names given), calls it on each input and sends the results back as
data. Whatever the function does (print "correct", patch a builtin, install a hook) happens
in that child, never beside the check. In a student's own notebook the function is a plain
function and ``call_each`` just calls it.

The inputs travel by pickle (the check's own objects, into the child); the results come
back as JSON (``minicb.graded_labs.answers``), never by pickle, since they are the student's.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
from typing import Any

GIVEN_MODULES = ("math", "collections", "statistics", "torch")
TIMEOUT_S = 120


class IsolatedFunction:
    """A student's function, known by its source."""

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name = source, name

    def __call__(self, *args: Any) -> Any:
        return call_each(self, [args])[0]

    def __repr__(self) -> str:
        return f"<answer function {self.name}>"


def call_each(fn: Any, cases: list[tuple]) -> list[Any]:
    """``[fn(*case) for case in cases]``, in one child process when ``fn`` is isolated."""
    if not isinstance(fn, IsolatedFunction):
        return [fn(*case) for case in cases]
    from minicb.graded_labs.answers import decode
    from minicb.graded_labs.verdict import Wrong

    try:
        done = subprocess.run([sys.executable, "-m", "minicb.graded_labs.isolated"],
                              timeout=TIMEOUT_S, capture_output=True,
                              input=pickle.dumps((fn.source, fn.name, cases)))  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise Wrong(f"your function {fn.name} did not return within {TIMEOUT_S} s") from e
    try:
        reply = json.loads(done.stdout)
    except json.JSONDecodeError:
        reply = {"error": f"the process running it ended with status {done.returncode}"}
    if "error" in reply:
        raise Wrong(f"your function {fn.name} failed: {reply['error']}")
    return [decode(r) for r in reply["results"]]


def _child() -> None:
    """The child's side: define the function, call it on each case, print the results."""
    from minicb.graded_labs.answers import encode

    source, name, cases = pickle.load(sys.stdin.buffer)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the function's own prints go to stderr, not into the reply
    sys.stdout = sys.stderr
    namespace: dict[str, Any] = {"__name__": "answer"}
    for module in GIVEN_MODULES:
        if module in source:  # torch takes a second to import: only when it is used
            namespace[module] = importlib.import_module(module)
    try:
        exec(compile(source, f"<your {name}>", "exec"), namespace)
        if not callable(namespace.get(name)):
            raise NameError(f"the cell defines no function {name}")
        reply: dict[str, Any] = {"results": [encode(namespace[name](*case)) for case in cases]}
    except BaseException as e:  # the student's code: any failure is its verdict
        reply = {"error": f"{type(e).__name__}: {e}"}
    out.write(json.dumps(reply))
    out.flush()


if __name__ == "__main__":
    _child()
