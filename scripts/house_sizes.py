"""The sizes docs/architecture.md reports for the house, counted from the source.

    PYTHONPATH=. .venv/bin/python scripts/house_sizes.py

Prints: the package's modules and lines; the core folder's; the walk of one greedy request
(the files tests/test_read_first.py traces, and their lines); the body of
``LLMEngine.step()``; the core config's fields (and the feature records beside them); and
the files of ``minicb/`` over 300 lines.
Lines are every line of a file, docstrings and blanks included, as ``wc -l`` counts them.
"""

from __future__ import annotations

import ast
import dataclasses
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minicb"


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def step_body_lines() -> int:
    """Lines of ``LLMEngine.step``'s body, its docstring left out."""
    tree = ast.parse((PACKAGE / "core" / "engine.py").read_text(encoding="utf-8"))
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LLMEngine")
    step = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "step")
    body = step.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return step.end_lineno - body[0].lineno + 1


def main() -> None:
    from minicb.core.config import EngineConfig
    from tests.test_read_first import READ_NOT_RUN, walk_of_one_request

    files = sorted(PACKAGE.rglob("*.py"))
    core = [p for p in files if p.is_relative_to(PACKAGE / "core")]
    with tempfile.TemporaryDirectory() as tmp:
        walk = sorted(walk_of_one_request(Path(tmp)) | READ_NOT_RUN)
    over = sorted(((lines(p), p.relative_to(ROOT).as_posix()) for p in files
                   if lines(p) > 300), reverse=True)  # fmt: skip
    print(f"minicb/: {len(files)} modules, {sum(map(lines, files)):,} lines")
    print(f"minicb/core/: {len(core)} modules, {sum(map(lines, core)):,} lines")
    outside = [name for name in walk if not name.startswith("minicb/core/")]
    walked = sum(lines(ROOT / name) for name in walk)
    print(f"walk of one greedy request: {len(walk)} files, {walked:,} lines; "
          f"outside core: {outside}")  # fmt: skip
    print(f"LLMEngine.step() body: {step_body_lines()} lines")
    import minicb.features  # noqa: F401  (every feature's settings record registered)
    from minicb.core.feature_settings import OPTIONS, RECORDS

    print(f"core EngineConfig fields: {len(dataclasses.fields(EngineConfig))} (the last one, "
          f"features, holds the feature records: {len(RECORDS)} records, "
          f"{len(OPTIONS)} options)")  # fmt: skip
    print(f"files over 300 lines: {len(over)}")
    for n, name in over:
        print(f"  {n:4d} {name}")


if __name__ == "__main__":
    main()
