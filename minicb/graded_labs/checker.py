"""Grades students' notebooks against the teacher's: which answers are right.

Two runs, and the student's code never runs beside a check:

1. **The student's run**, a fresh kernel per submission: the teacher's notebook with, for
   each exercise, the cells between its heading and its check replaced by the
   submission's cells there (the student's answers). The checks are left out; a last cell
   reads each exercise's answers as data (``minicb.graded_labs.answers``).
2. **The checks' run**, one fresh kernel per teacher's notebook, however many submissions:
   the teacher's notebook without its worked solutions, so every fixture is computed by
   the teacher's code. At each check, for one submission after another, a cell sets that
   exercise's answers from their data, the check runs, and the answers are deleted again.
   A check sees only its own answers (one that read another exercise's answer fails in
   the teacher's own run), and a function answer runs in a process of its own
   (``minicb.graded_labs.isolated``).

An exercise is right only when its check's reply was "ok" *and* it printed ``correct:``.
A submission that contains a teacher's worked solution (the same code, whatever its
comments or spacing) gets that exercise wrong; the real defence is to keep the teacher's
notebooks out of the students' copy (``minicb lab check --teacher PATH``).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minicb.graded_labs.answers import harvest_source, inject_source, read_harvest
from minicb.graded_labs.exercises import Exercise, find_exercises
from minicb.graded_labs.kernel import run_notebook

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Result:
    number: int
    correct: bool
    detail: str  # the check's "correct: ..." line, or what the answer violated


@dataclass
class Graded:
    path: Path
    results: list[Result]
    errors: list[str] = field(default_factory=list)  # "cell 12: NameError: ..." in either run


@dataclass
class Harvest:
    answers: dict[str, Any]  # name -> {"data": ...} or {"error": "..."}
    problems: dict[int, str]  # exercise -> why it is wrong before any check runs
    errors: list[str]  # every cell's error in the student's run


def _error(cell: Any) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}".strip()
    return None


def _stdout(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")


def _exercise_cells(teacher: Any, submitted: Any) -> dict[int, list[Any]]:
    """The submission's code cells between each exercise's heading and its check."""
    sources = [c.source for c in submitted.cells]
    spans = {}
    for e in find_exercises(teacher):
        title = f"**Exercise {e.number}.**"
        heading = next((i for i, c in enumerate(submitted.cells)
                        if c.cell_type == "markdown" and title in c.source), None)  # fmt: skip
        check = teacher.cells[e.check].source
        if heading is None or check not in sources[heading:]:
            raise ValueError(f"exercise {e.number}: its heading or its check cell is missing or "
                             "changed; restore it from the teacher's notebook")  # fmt: skip
        end = sources.index(check, heading)
        spans[e.number] = [copy.deepcopy(c) for c in submitted.cells[heading + 1 : end]
                           if c.cell_type == "code"]  # fmt: skip
    return spans


def students_run(teacher: Any, submitted: Any) -> Any:
    """The notebook of the student's run (see the module's docstring)."""
    import nbformat

    exercises = find_exercises(teacher)
    mine = _exercise_cells(teacher, submitted)
    out = copy.deepcopy(teacher)
    cells, start = [], 0
    for e in exercises:
        cells += out.cells[start : e.heading + 1] + mine[e.number]
        start = e.check + 1
    names = [n for e in exercises for n in e.answers]
    cells.append(nbformat.v4.new_code_cell(harvest_source(names)))
    return _clean(out, cells)


def _clean(nb: Any, cells: list[Any]) -> Any:
    for c in cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        c.pop("id", None)  # copies of one cell appear several times
    nb.cells = cells
    return nb


def _fingerprints(teacher: Any, exercises: list[Exercise]) -> dict[int, set[str]]:
    """Each worked solution's code, comments and spacing aside: its ``if ... is None:``
    blocks and the whole cell."""
    prints = {}
    for e in exercises:
        tree = ast.parse(teacher.cells[e.solution].source)
        prints[e.number] = {ast.dump(tree)} | {ast.dump(s) for s in tree.body
                                               if isinstance(s, ast.If)}  # fmt: skip
    return prints


def copied_solutions(teacher: Any, submitted: Any) -> dict[int, str]:
    """The exercises whose worked solution the submission contains, anywhere in it."""
    prints = _fingerprints(teacher, find_exercises(teacher))
    found = set()
    for cell in submitted.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        dumps = {ast.dump(tree)} | {ast.dump(s) for s in tree.body}
        found |= {number for number, p in prints.items() if dumps & p}
    return {n: "your notebook contains the teacher's worked solution to this exercise"
            for n in sorted(found)}  # fmt: skip


def harvest(path: Path, teacher: Any, *, own: bool = False) -> Harvest:
    """Run a submission's cells and read its answers (``own``: the teacher's own notebook,
    whose worked solutions are its answers)."""
    import nbformat

    exercises = find_exercises(teacher)
    submitted = nbformat.read(path, as_version=4)
    try:
        run = students_run(teacher, submitted)
    except ValueError as e:
        return Harvest({}, {x.number: str(e) for x in exercises}, [])
    problems = {} if own else copied_solutions(teacher, submitted)
    run_notebook(run)
    errors = [f"cell {i}: {err}" for i, c in enumerate(run.cells) if (err := _error(c))]
    answers = read_harvest(_stdout(run.cells[-1]))
    if answers is None:
        why = f"your answers could not be read: {errors[-1] if errors else 'no reply'}"
        return Harvest({}, {x.number: why for x in exercises}, errors)
    return Harvest(answers, problems, errors)


def _readable(answers: dict[str, Any], e: Exercise) -> str | None:
    """Why ``answers`` cannot reach ``e``'s check, or None."""
    for name in e.answers:
        got = answers.get(name)
        if not isinstance(got, dict) or ("data" not in got and "error" not in got):
            return f"{name} was not found in your notebook"
        if "error" in got:
            return f"{name}: {got['error']}"
    return None


def check_answers(
    teacher: Any, answer_sets: list[dict[str, Any]]
) -> tuple[list[dict[int, Result]], list[str]]:
    """The checks' run: each answer set's result per exercise, and the errors of the
    teacher's own cells (a teacher's notebook must have none)."""
    import nbformat

    exercises = find_exercises(teacher)
    by_check = {e.check: e for e in exercises}
    solutions = {e.solution for e in exercises}
    v4 = nbformat.v4
    out = copy.deepcopy(teacher)
    cells: list[Any] = []
    checks: dict[int, tuple[int, int]] = {}  # cell index -> (answer set, exercise)
    results: list[dict[int, Result]] = [{} for _ in answer_sets]
    for i, cell in enumerate(out.cells):
        if i in solutions:
            continue
        e = by_check.get(i)
        if e is None:
            cells.append(cell)
            continue
        for k, answers in enumerate(answer_sets):
            why = _readable(answers, e)
            if why is not None:
                results[k][e.number] = Result(e.number, False, why)
                continue
            given = {n: answers[n]["data"] for n in e.answers}
            cells.append(v4.new_code_cell(inject_source(given)))
            checks[len(cells)] = (k, e.number)
            cells.append(copy.deepcopy(cell))
            cells.append(v4.new_code_cell("del " + ", ".join(e.answers)))
    run = _clean(out, cells)
    status = run_notebook(run)
    errors = []
    for i, c in enumerate(run.cells):
        if i in checks:
            k, number = checks[i]
            results[k][number] = _verdict(number, c, status[i])
        elif err := _error(c):
            errors.append(f"cell {i}: {err}")
    return [dict(sorted(r.items())) for r in results], errors


def _verdict(number: int, cell: Any, status: str) -> Result:
    err = _error(cell)
    if err is not None:
        name, _, message = err.partition(": ")
        return Result(number, False, message if name == "Wrong" else err)
    lines = [line for line in _stdout(cell).splitlines() if line.startswith("correct:")]
    if status != "ok":
        return Result(number, False, "the check failed")
    if not lines:
        return Result(number, False, "the check printed no verdict")
    return Result(number, True, lines[-1])


def teachers_notebook(path: Path, teacher: Path | None) -> Path:
    """The teacher's notebook for ``path``: ``teacher`` (a notebook, or a folder of them),
    or by default the checkout's notebooks/ notebook of the same name."""
    if teacher is None:
        teacher = ROOT / "notebooks" / Path(path).name
    elif teacher.is_dir():
        teacher = teacher / Path(path).name
    if not teacher.exists():
        raise ValueError(f"no teacher's notebook {teacher} for {Path(path).name}: name it with "
                         "--teacher PATH")  # fmt: skip
    return teacher


def grade(paths: list[Path], teacher: Path | None = None) -> list[Graded]:
    """Grade each submission; one checks' run per teacher's notebook."""
    import nbformat

    groups: dict[Path, list[Path]] = {}
    for path in paths:
        groups.setdefault(teachers_notebook(path, teacher).resolve(), []).append(Path(path))
    graded: dict[Path, Graded] = {}
    for teacher_path, group in groups.items():
        nb = nbformat.read(teacher_path, as_version=4)
        harvests = [harvest(p, nb, own=p.resolve() == teacher_path) for p in group]
        verdicts, errors = check_answers(nb, [h.answers for h in harvests])
        for path, h, verdict in zip(group, harvests, verdicts, strict=True):
            results = [Result(e.number, False, h.problems[e.number]) if e.number in h.problems
                       else verdict[e.number] for e in find_exercises(nb)]  # fmt: skip
            graded[path] = Graded(path, results, h.errors + [f"checks' run, {e}" for e in errors])
    return [graded[Path(p)] for p in paths]


def check_notebook(path: Path, teacher: Path | None = None) -> list[Result]:
    """One submission's results."""
    return grade([path], teacher)[0].results
