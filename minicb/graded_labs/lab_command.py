"""``minicb lab student``, ``minicb lab check SUBMISSION... [--teacher PATH] [--csv FILE]``
and ``minicb lab grade-code FILE_OR_FOLDER... --teacher PATH [--seed N] [--csv FILE]``."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lab", help="graded labs: student notebooks and their grader")
    sub = p.add_subparsers(dest="lab_command", required=True)
    s = sub.add_parser("student", help="write the student versions of the notebooks")
    s.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    s.add_argument("--out", type=Path, help="folder (default: NOTEBOOKS/student)")
    s.set_defaults(func=run_student)
    c = sub.add_parser(
        "check", help="grade submitted notebooks against the teacher's checks: one table"
    )
    c.add_argument("notebooks", nargs="+", type=Path, help="submissions, any file names")
    c.add_argument("--teacher", type=Path,
                   help="the teacher's notebook, or a folder of them (default: notebooks/NAME "
                        "for a submission named like the teacher's)")  # fmt: skip
    c.add_argument("--csv", type=Path, help="also write the table here, for a gradebook")
    c.set_defaults(func=run_check)
    g = sub.add_parser(
        "grade-code", help="grade admission policies (the coding lab) by hidden tests: one table"
    )
    g.add_argument("submissions", nargs="+", type=Path,
                   help="a student's .py file, or a folder of them (any file names)")  # fmt: skip
    g.add_argument("--teacher", type=Path, required=True,
                   help="the teacher's coding-lab folder (hidden.json, the reference)")  # fmt: skip
    g.add_argument("--seed", type=int, help="draw the workloads from this seed instead")
    g.add_argument("--csv", type=Path, help="also write the table here, for a gradebook")
    g.set_defaults(func=run_grade_code)


def run_student(args: argparse.Namespace) -> int:
    from minicb.graded_labs.student import write_student_versions

    for path in write_student_versions(args.notebooks, args.out):
        print(path)
    return 0


def run_check(args: argparse.Namespace) -> int:
    from minicb.graded_labs.checker import grade, teachers_notebook

    for path in args.notebooks:  # every name checked before the first kernel starts
        if not path.is_file():
            raise ValueError(f"no submission {path}")
        teachers_notebook(path, args.teacher)
    graded = grade(args.notebooks, args.teacher)
    print(table(graded), flush=True)
    if args.csv:
        write_csv(graded, args.csv)
        print(f"wrote {args.csv}")
    return 0 if all(r.correct for g in graded for r in g.results) else 1


def table(graded: list) -> str:
    """One line per submission (right / of, then each exercise), then what each wrong
    answer violated."""
    width = max(len(str(g.path)) for g in graded)
    numbers = sorted({r.number for g in graded for r in g.results})
    lines = [f"{'submission':{width}}  right  " + "  ".join(f"ex{n:<3}" for n in numbers)]
    for g in graded:
        marks = {r.number: "ok" if r.correct else "--" for r in g.results}
        right = sum(r.correct for r in g.results)
        lines.append(f"{str(g.path):{width}}  {right:>2}/{len(g.results):<2}  "
                     + "  ".join(f"{marks.get(n, ''):5}" for n in numbers))  # fmt: skip
    lines = [line.rstrip() for line in lines]
    for g in graded:
        lines += [f"{g.path}: exercise {r.number}: {r.detail}" for r in g.results if not r.correct]
    return "\n".join(lines)


def write_csv(graded: list, path: Path) -> None:
    """submission, right, of, then per exercise "right" or what it violated."""
    numbers = sorted({r.number for g in graded for r in g.results})
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["submission", "right", "of", *(f"exercise {n}" for n in numbers)])
        for g in graded:
            by = {r.number: "right" if r.correct else f"wrong: {r.detail}" for r in g.results}
            out.writerow([str(g.path), sum(r.correct for r in g.results), len(g.results),
                          *(by.get(n, "") for n in numbers)])  # fmt: skip


def run_grade_code(args: argparse.Namespace) -> int:
    """One line per submission (passed, then ok / -- per property, blank where it was not
    judged because the runs failed), then what each failed property saw."""
    from minicb.graded_labs.coding.grader import PROPERTIES, grade_code

    graded = grade_code(args.submissions, args.teacher, args.seed)
    width = max(len(str(g.path)) for g in graded)
    lines = [f"{'submission':{width}}  passed  " + "  ".join(PROPERTIES)]
    for g in graded:
        marks = [_verdict(g, p, "ok", "--", "").ljust(len(p)) for p in PROPERTIES]
        passed = "yes" if g.passed else "no"
        lines.append(f"{str(g.path):{width}}  {passed:6}  " + "  ".join(marks))
    lines = [line.rstrip() for line in lines]
    lines += [f"{g.path}: {p}: {why}" for g in graded for p, why in g.verdicts.items() if why]
    print("\n".join(lines), flush=True)
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(["submission", "passed", *PROPERTIES])
            for g in graded:
                verdicts = [_verdict(g, p, "ok", "wrong: ", "not run") for p in PROPERTIES]
                out.writerow([str(g.path), "yes" if g.passed else "no", *verdicts])
        print(f"wrote {args.csv}")
    return 0 if all(g.passed for g in graded) else 1


def _verdict(graded, prop: str, ok: str, wrong: str, unjudged: str) -> str:
    """``ok``; ``wrong`` followed by what broke the property when ``wrong`` ends in a space;
    or ``unjudged`` for a property never judged (the runs failed first)."""
    if prop not in graded.verdicts:
        return unjudged
    why = graded.verdicts[prop]
    if why is None:
        return ok
    return wrong + why if wrong.endswith(" ") else wrong
