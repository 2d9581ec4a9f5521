"""``minicb lab grade-code``: a student's admission policy in the real engine, graded by
what it does on workloads the student never sees.

Each submission runs in a fresh Python process (``python -m minicb.graded_labs.coding.grader``),
never in the grader's: the child loads the file, plugs its ``admit`` into the real
continuous scheduler (plug.py), serves every held-back workload (workloads.py) and sends
back what it measured as data. The grader judges that data against two runs of its own:

- the reference engine (minicb's own admission, in the grader's process): the greedy
  tokens every request must get, and how many iterations each run may take at most
  before it is stopped (three times the engine's, plus 100);
- the teacher's reference policy, in a child like a submission's: the bars for the
  longest wait and for the iterations.

Properties, each reported on its own line (a message names the property and what the
run did, never the reference's tokens):

- ``runs``: the file loads, defines ``admit``, and it returns without an error, a list
  of distinct ids of waiting requests (the admission contract);
- ``limits``: no choice admits more requests than free slots, a request after the token
  budget is spent, or more KV blocks than are free;
- ``greedy tokens``: every request finishes with the reference engine's tokens, on the
  fake runner and on the tiny real model;
- ``KV blocks returned``: the pool is whole again at the end of every workload;
- ``bounded wait``: no request waits in the queue longer than ``WAIT_FACTOR`` times the
  reference policy's longest wait on that workload, plus ``WAIT_SLACK`` iterations;
- ``performance``: on every workload, at most ``1 + STEPS_TOLERANCE`` times the reference
  policy's iterations, and a mean time to first token (in iterations) at most
  ``1 + TTFT_TOLERANCE`` times the reference policy's, plus ``TTFT_SLACK``.

Like ``lab check`` it runs the submissions' code as the teacher's user: not a sandbox.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minicb.graded_labs.coding.hidden_workloads import Workload, draw_all, run

PROPERTIES = ("runs", "limits", "greedy tokens", "KV blocks returned", "bounded wait",
              "performance")  # fmt: skip
# Performance, on every workload: the iterations to serve it and the mean time to first
# token, in iterations. Valid reorderings of FCFS measured within a few per cent of its
# iterations (the tail of the longest output sets them), and shortest-first even lowered
# the mean TTFT; admitting one request per iteration costs 35 to 55 % TTFT on the bursts, and
# leaving slots idle costs iterations. The bars: 10 % iterations, 20 % TTFT (+1 step).
STEPS_TOLERANCE = 0.10
TTFT_TOLERANCE, TTFT_SLACK = 0.20, 1
# Reordering for throughput may make a request wait longer than under FCFS, but by a
# bounded amount; starvation is waiting until the stream that passes it dries up.
WAIT_FACTOR, WAIT_SLACK = 2, 10
TIMEOUT_S = 300


@dataclass
class Graded:
    """One submission's verdicts: per property, None when it holds, else what broke it."""

    path: Path
    verdicts: dict[str, str | None] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return len(self.verdicts) == len(PROPERTIES) and not any(self.verdicts.values())


def submissions_in(paths: list[Path]) -> list[Path]:
    """The files to grade: each file given, and every ``.py`` file of each folder given."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix == ".py")
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"no submission {path}")
    if not files:
        raise ValueError("no .py submission found in " + ", ".join(map(str, paths)))
    return files


def grade_code(paths: list[Path], teacher: Path, seed: int | None = None,
               real_model: bool = True) -> list[Graded]:  # fmt: skip
    """Grade every submission in ``paths`` with the hidden tests of the ``teacher`` folder
    (its hidden.json: the seed, the shapes, the reference policy's file)."""
    hidden_file = Path(teacher) / "hidden.json"
    if not hidden_file.is_file():
        raise ValueError(
            f"no hidden tests at {hidden_file}: --teacher names the teacher's coding-lab "
            "folder (teacher/coding_lab in the teacher's copy)"
        )
    hidden = json.loads(hidden_file.read_text(encoding="utf-8"))
    files = submissions_in(paths)
    shapes = [s for s in hidden["shapes"] if real_model or s != "tiny"]
    workloads = draw_all(hidden["seed"] if seed is None else seed, shapes)
    with tempfile.TemporaryDirectory(prefix="minicb-grade-code-") as tmp:
        model = None
        if "tiny" in shapes:
            from minicb.tiny_models import make_tiny_model_dir

            model = str(make_tiny_model_dir("llama", Path(tmp) / "tiny", seed=0))
        # As data, as a child's measurements come back (request ids as strings).
        engine = [json.loads(json.dumps(run(w, model=model if w.shape == "tiny" else None)))
                  for w in workloads]  # fmt: skip
        caps = [3 * r["steps"] + 100 for r in engine]
        reference = measure_in_child(Path(teacher) / hidden["reference"], workloads, caps, model)
        if "failed" in reference:
            raise RuntimeError(f"the teacher's reference policy fails: {reference['message']}")
        return [judge(f, measure_in_child(f, workloads, caps, model), engine, reference,
                      workloads) for f in files]  # fmt: skip


def measure_in_child(path: Path, workloads: list[Workload], caps: list[int],
                     model: str | None) -> dict[str, Any]:  # fmt: skip
    """Run the policy in ``path`` on every workload, in a fresh process; its measurements."""
    request = {"submission": str(Path(path).resolve()), "caps": caps, "model": model,
               "workloads": [w.to_data() for w in workloads]}  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-m", "minicb.graded_labs.coding.grader"],
                              input=json.dumps(request), capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=tempfile.gettempdir())  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"failed": "runs", "message": f"the runs did not end within {TIMEOUT_S} s"}
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        status = done.returncode
        return {"failed": "runs", "message": f"the process running it ended with status {status}"}


def judge(path: Path, sub: dict[str, Any], engine: list[dict], reference: dict[str, Any],
          workloads: list[Workload]) -> Graded:  # fmt: skip
    """The verdicts on one submission's measurements."""
    graded = Graded(path)
    if "failed" in sub:
        graded.verdicts["runs"] = sub["message"]
        return graded
    graded.verdicts["runs"] = None
    graded.verdicts["limits"] = sub["broken_limit"]
    runs = sub["runs"]
    named = [f"workload {i + 1} ({w.shape})" for i, w in enumerate(workloads)]
    graded.verdicts["greedy tokens"] = _tokens(runs, engine, named)
    held = [(n, r["blocks_held"]) for n, r in zip(named, runs, strict=True) if r["blocks_held"]]
    graded.verdicts["KV blocks returned"] = (
        f"{held[0][1]} KV blocks still held at the end of {held[0][0]}" if held else None
    )
    graded.verdicts["bounded wait"] = _waits(runs, reference["runs"], named)
    graded.verdicts["performance"] = _performance(runs, reference["runs"], named)
    return graded


def _tokens(runs: list[dict], engine: list[dict], named: list[str]) -> str | None:
    for name, got, want in zip(named, runs, engine, strict=True):
        wrong = sorted(int(r) for r, t in want["tokens"].items() if got["tokens"].get(r) != t)
        if wrong:
            unfinished = f"; {got['unfinished']} never finished" if got["unfinished"] else ""
            return (f"on {name}, {len(wrong)} of {len(want['tokens'])} requests did not end "
                    f"with the reference engine's greedy tokens (request {wrong[0]} first"
                    f"{unfinished} within {got['steps']} iterations)")  # fmt: skip
    return None


def mean_ttft(measured: dict[str, Any]) -> float:
    """Mean iterations from arrival to first token; one not yet given counts to the end."""
    first, end, arrived = measured["first_token"], measured["steps"] + 1, measured["arrived"]
    return sum(first.get(r, end) - at for r, at in arrived.items()) / len(arrived)


def _performance(runs: list[dict], reference: list[dict], named: list[str]) -> str | None:
    for name, got, ref in zip(named, runs, reference, strict=True):
        more = got["steps"] / ref["steps"] - 1
        if more > STEPS_TOLERANCE:
            return (f"on {name}, the workload took {more:.0%} more iterations than under the "
                    f"reference policy (the bar: {STEPS_TOLERANCE:.0%}): a slot or budget "
                    "left idle costs iterations")  # fmt: skip
        ttft, bar = mean_ttft(got), (1 + TTFT_TOLERANCE) * mean_ttft(ref) + TTFT_SLACK
        if ttft > bar:
            return (f"on {name}, the mean time to first token was {ttft:.1f} iterations, "
                    f"above the bar of {bar:.1f} ({TTFT_TOLERANCE:.0%} more than the reference "
                    f"policy's, plus {TTFT_SLACK}): requests that could start wait")  # fmt: skip
    return None


def longest_waits(measured: dict[str, Any]) -> dict[str, int]:
    """Each request's longest wait in the queue, counting a wait not over at the end."""
    waits = dict(measured["longest_wait"])
    for rid, since in measured["waiting_since"].items():
        waits[rid] = max(waits.get(rid, 0), measured["steps"] + 1 - since)
    return waits


def _waits(runs: list[dict], reference: list[dict], named: list[str]) -> str | None:
    for name, got, ref in zip(named, runs, reference, strict=True):
        bound = WAIT_FACTOR * max(longest_waits(ref).values()) + WAIT_SLACK
        rid, wait = max(longest_waits(got).items(), key=lambda kv: kv[1])
        if wait > bound:
            return (f"on {name}, request {rid} waited {wait} iterations in the queue; the "
                    f"bound is {bound} ({WAIT_FACTOR} times the reference policy's longest "
                    f"wait there, plus {WAIT_SLACK}): a request that keeps being passed "
                    "starves")  # fmt: skip
    return None


# ---- the child's side ----------------------------------------------------------------
def measure(request: dict[str, Any]) -> dict[str, Any]:
    """Load the submission, run it on every workload; measurements or what failed."""
    from minicb.graded_labs.coding.plug import ChoiceRefused, broken_limit

    path = request["submission"]
    try:
        spec = importlib.util.spec_from_file_location("submission", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        admit = module.admit
        if not callable(admit):
            raise AttributeError("admit is not a function")
    except BaseException as e:  # the student's file: any failure is its verdict
        return {"failed": "runs", "message": f"the file does not load or defines no function "
                                             f"admit: {type(e).__name__}: {e}"}  # fmt: skip
    broken: list[str] = []

    def on_choice(view: Any, ids: list[int]) -> None:
        if not broken and (why := broken_limit(view, ids)):
            broken.append(why)

    runs = []
    for data, cap in zip(request["workloads"], request["caps"], strict=True):
        workload = Workload.from_data(dict(data))
        model = request["model"] if workload.shape == "tiny" else None
        try:
            runs.append(run(workload, admit, model=model, step_cap=cap, on_choice=on_choice))
        except NotImplementedError:
            return {"failed": "runs", "message": "admit() is not written yet: it raises "
                                                 "NotImplementedError"}  # fmt: skip
        except ChoiceRefused as e:
            return {"failed": "runs", "message": f"the admission contract: {e}"}
        except BaseException as e:
            lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
            where = f" (your file, line {lines[-1]})" if lines else ""
            return {"failed": "runs", "message": f"admit() failed{where}: {type(e).__name__}: {e}"}
    return {"runs": runs, "broken_limit": broken[0] if broken else None}


def _child() -> None:
    """Read the request on stdin, write the measurements as JSON on the real stdout."""
    request = json.load(sys.stdin)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the submission's own prints go to stderr, not into the reply
    sys.stdout = sys.stderr
    out.write(json.dumps(measure(request)))
    out.flush()


if __name__ == "__main__":
    _child()
