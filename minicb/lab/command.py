"""``minicb lab student`` and ``minicb lab check NOTEBOOK...``."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lab", help="graded labs: student notebooks and their checker")
    sub = p.add_subparsers(dest="lab_command", required=True)
    s = sub.add_parser("student", help="write the student versions of the notebooks")
    s.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    s.add_argument("--out", type=Path, help="folder (default: NOTEBOOKS/student)")
    s.set_defaults(func=run_student)
    c = sub.add_parser(
        "check", help="run notebooks with the teacher's checks: which answers are right"
    )
    c.add_argument("notebooks", nargs="+", type=Path)
    c.add_argument("--teacher", type=Path, help="the teacher's notebook (default: notebooks/NAME)")
    c.set_defaults(func=run_check)


def run_student(args: argparse.Namespace) -> int:
    from minicb.lab.student import write_student_versions

    for path in write_student_versions(args.notebooks, args.out):
        print(path)
    return 0


def run_check(args: argparse.Namespace) -> int:
    from minicb.lab.checker import check_notebook, report

    ok = True
    for path in args.notebooks:
        results = check_notebook(path, args.teacher)
        print(report(path, results), flush=True)
        ok &= all(r.correct for r in results)
    return 0 if ok else 1
