"""The house rules that keep the design one seam, one event path and a façade.

Whoever is outside the scheduler (server, bench, notebooks, command line) reads the
engine's views (``kv_snapshot``, ``queue_sizes``, ``block_table``, ``live_requests``,
``describe``), never ``engine.scheduler`` or the runner's KV tensors. Only the scheduler
package and the engine itself may touch the scheduler object; only the runner package may
read a runner's weights and files (``runner.model``, ``runner.files``) or its private
state (``runner._x``), and no other package a scheduler's (``scheduler._x``). The
performance lab (perflab/, beside the package) owns its reach-ins into the model runner.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = ("minicb/scheduler/", "minicb/engine.py", "minicb/overlap.py")  # the engine and its step
# Notebook cells may await at top level.
PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


# What of a runner only the runner package reads: its KV tensors, weights and files.
RUNNER_INTERNALS = ("kv_cache", "model", "files")


def _names(node: ast.expr, name: str) -> bool:
    """Whether ``node`` is ``name`` or ``<x>.name``."""
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def reach_ins(source: str, runner_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, expression) of every ``<x>.scheduler`` read, every ``scheduler._x``, and
    every ``<x>.runner.kv_cache`` / ``.model`` / ``.files`` / ``._x`` read (the last unless
    ``runner_package``: the runner's own modules), in order. Module paths
    (``minicb.scheduler.plan``) are not reads; imports hold none."""
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
        elif node.attr.startswith("_") and _names(node.value, "scheduler"):
            yield node.lineno, text
        elif (
            not runner_package
            and (node.attr in RUNNER_INTERNALS or node.attr.startswith("_"))
            and _names(node.value, "runner")
            and not text.startswith("minicb.")
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
        for line, text in reach_ins(source, runner_package=where.startswith("minicb/runner/"))
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


def test_the_check_sees_reads_of_a_runners_and_a_schedulers_private_state():
    source = (
        "from minicb.runner import model_runner\n"
        "import minicb.runner.model_runner\n"
        "w = engine.runner.model\n"
        "p = self.systems.continuous.runner.files.path\n"
        "g = runner._replays(meta)\n"
        "q = scheduler._waiting\n"
        "ok = runner.describe(), runner.dtype, self.model, engine.runner.model_path\n"
        "ok2 = minicb.runner.model_runner.ModelRunner, model.files\n"
    )
    assert [line for line, _ in reach_ins(source)] == [3, 4, 5, 6]
    # The runner package reads its own: only the scheduler's private state is flagged there.
    assert [line for line, _ in reach_ins(source, runner_package=True)] == [6]


# The simulator and the parts of the engine a student reads first run without torch.
TORCH_FREE = ["minicb.request", "minicb.scheduler", "minicb.scheduler.plan",
              "minicb.telemetry.events", "minicb.telemetry.metrics"]  # fmt: skip


def test_the_simulator_scheduler_request_plan_events_and_metrics_never_import_torch():
    sim = sorted(f"minicb.sim.{p.stem}" for p in (ROOT / "minicb" / "sim").glob("*.py"))
    scheduler = sorted(
        f"minicb.scheduler.{p.stem}" for p in (ROOT / "minicb" / "scheduler").glob("*.py")
    )
    modules = [*TORCH_FREE, *scheduler, *sim]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'torch' not in sys.modules, f'{name} imports torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
