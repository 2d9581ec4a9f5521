"""The house rules that keep the design one seam, one event path and a façade.

Whoever is outside the scheduler (server, bench, notebooks, command line) reads the
engine's views (``kv_snapshot``, ``queue_sizes``, ``block_table``, ``live_requests``,
``describe``), never ``engine.scheduler`` or the runner's KV tensors. Only the scheduler
package and the engine itself may touch the scheduler object.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = ("minicb/scheduler/", "minicb/engine.py")
# Notebook cells may await at top level.
PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def reach_ins(source: str) -> Iterator[tuple[int, str]]:
    """(line, expression) of every ``<x>.scheduler`` and ``<x>.runner.kv_cache`` read, in
    order. Module paths (``minicb.scheduler.plan``) are not reads; imports hold none."""
    nodes = sorted(
        (
            n
            for n in ast.walk(compile(source, "<source>", "exec", PARSE_FLAGS))
            if isinstance(n, ast.Attribute)
        ),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for node in nodes:
        text = ast.unparse(node)
        if node.attr == "scheduler" and not text.startswith("minicb."):
            yield node.lineno, text
        elif node.attr == "kv_cache" and (
            isinstance(node.value, ast.Name)
            and node.value.id == "runner"
            or isinstance(node.value, ast.Attribute)
            and node.value.attr == "runner"
        ):
            yield node.lineno, text


def python_sources() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "minicb").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(ALLOWED):
            yield name, path.read_text(encoding="utf-8")


def notebook_cells() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for number, cell in enumerate(cells, start=1):
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            # IPython magics and shell lines are not Python: blank them, keep the numbering.
            code = "\n".join("" if line.lstrip()[:1] in "%!" else line for line in lines)
            yield f"{path.relative_to(ROOT).as_posix()} cell {number}", code


def test_nothing_outside_the_scheduler_and_engine_reads_their_internals():
    found = [
        f"{where}:{line}: {text}"
        for where, source in [*python_sources(), *notebook_cells()]
        for line, text in reach_ins(source)
    ]
    assert not found, "reads of engine internals; use the engine's views:\n" + "\n".join(found)


def test_the_check_sees_reach_ins_and_leaves_module_paths_alone():
    source = (
        "from minicb.scheduler.plan import StepPlan\n"
        "import minicb.scheduler.block_manager\n"
        "x = minicb.scheduler.plan.StepPlan\n"
        "n = len(engine.scheduler.waiting)\n"
        "s = self.engine.scheduler\n"
        "b = llm.engine.runner.kv_cache.shape\n"
        "c = runner.kv_cache\n"
        "ok = engine.kv_snapshot().num_used, self.kv_cache, results['scheduler']\n"
    )
    assert [line for line, _ in reach_ins(source)] == [4, 5, 6, 7]
