"""The house rules that keep the design one seam, one event path and a façade.

Whoever is outside the scheduler (server, bench, notebooks, command line) reads the
engine's views (``kv_snapshot``, ``queue_sizes``, ``block_table``, ``live_requests``,
``describe``), never ``engine.scheduler`` or the runner's KV tensors. Only the scheduler
package and the engine itself may touch the scheduler object; only the runner package may
read a runner's weights and files (``runner.model``, ``runner.files``). No other package,
the engine included, reads a runner's or a scheduler's private state (``_x``, whatever
name holds the object: ``runner._x``, ``engine.scheduler.blocks._take``) or imports a
private name from them. The performance lab (perflab/, beside the package) owns its
reach-ins into the model runner.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests import import_graph

ROOT = Path(__file__).resolve().parent.parent
# The engine (its step, its overlapped step, the views and controls LLMEngine inherits) and
# the scheduler.
ALLOWED = (
    "minicb/core/scheduler/",
    "minicb/core/engine.py",
    "minicb/core/engine_views.py",
    "minicb/core/engine_controls.py",
    "minicb/overlap/pipeline.py",
)
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
    (``minicb.core.scheduler.plan``) are not reads; imports hold none."""
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
        for line, text in reach_ins(source, runner_package=where.startswith("minicb/core/runner/"))
    ]
    assert not found, "reads of engine internals; use the engine's views:\n" + "\n".join(found)


def test_the_check_sees_reach_ins_and_leaves_module_paths_alone():
    source = (
        "from minicb.core.scheduler.plan import StepPlan\n"
        "import minicb.core.scheduler.block_manager\n"
        "x = minicb.core.scheduler.plan.StepPlan\n"
        "n = len(engine.scheduler.waiting)\n"
        "s = self.engine.scheduler\n"
        "b = llm.engine.runner.kv_cache.shape\n"
        "c = runner.kv_cache\n"
        "ok = engine.kv_snapshot().num_used, self.kv_cache, results['scheduler']\n"
    )
    assert [line for line, _ in reach_ins(source)] == [4, 5, 6, 7]


def test_the_check_sees_reads_of_a_runners_and_a_schedulers_private_state():
    source = (
        "from minicb.core.runner import model_runner\n"
        "import minicb.core.runner.model_runner\n"
        "w = engine.runner.model\n"
        "p = self.systems.continuous.runner.files.path\n"
        "g = runner._replays(meta)\n"
        "q = scheduler._waiting\n"
        "ok = runner.describe(), runner.dtype, self.model, engine.runner.model_path\n"
        "ok2 = minicb.core.runner.model_runner.ModelRunner, model.files\n"
    )
    assert [line for line, _ in reach_ins(source)] == [3, 4, 5, 6]
    # The runner package reads its own: only the scheduler's private state is flagged there.
    assert [line for line, _ in reach_ins(source, runner_package=True)] == [6]


# Private state (``_x``) of the runner and scheduler packages is theirs alone: another
# package reads it by no name at all (``engine.scheduler.blocks._take``, ``r._hidden`` with
# ``r = engine.runner``), and imports no private name from them.
OWNERS = ("minicb/core/runner/", "minicb/core/scheduler/")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_members(packages: tuple[str, ...] = OWNERS) -> set[str]:
    """The private names that classes of ``packages`` define: methods, attributes set on
    ``self``, and class-level ones."""
    names = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                for node in ast.walk(cls):
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(node.name)
                    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                        if isinstance(node.value, ast.Name) and node.value.id == "self":
                            names.add(node.attr)
                    elif isinstance(node, ast.AnnAssign | ast.Assign):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if _private(name)}


def private_reads(source: str, private: set[str]) -> Iterator[tuple[int, str]]:
    """(line, expression) of every ``<x>._name`` with ``_name`` among ``private``, except on
    ``self``, ``cls`` or ``super()`` (a subclass's own), and every private name imported from
    the runner or scheduler packages, in order."""
    found = []
    for node in ast.walk(compile(source, "<source>", "exec", PARSE_FLAGS)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            own |= isinstance(owner, ast.Call) and _names(owner.func, "super")
            if not own:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("minicb.core.runner", "minicb.core.scheduler")
        ):
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)
            ]
    yield from sorted(found)


def sources_outside(packages: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Every module of minicb/ outside ``packages`` (the engine included), and the
    notebooks' code cells."""
    for path in sorted((ROOT / "minicb").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(packages):
            yield name, path.read_text(encoding="utf-8")
    yield from notebook_cells()


def test_no_other_package_reads_a_runners_or_a_schedulers_private_state():
    private = private_members()
    assert {"_take", "_hidden"} <= private  # the check knows what it guards
    found = [
        f"{where}:{line}: {text}"
        for where, source in sources_outside(OWNERS)
        for line, text in private_reads(source, private)
    ]
    assert not found, "reads of the runner's or scheduler's private state:\n" + "\n".join(found)


def test_the_private_state_check_sees_reads_by_any_name():
    source = (
        "blocks = engine.scheduler.blocks\n"
        "blocks._take(2)\n"
        "r = engine.runner; h = r._hidden(batch)\n"
        "from minicb.core.runner.model_runner import _private_helper\n"
        "ok = self._take(1), super()._admit(plan, 4, True), d._unrelated, x.__class__\n"
        "from minicb.core.runner.model_runner import get_group\n"
    )
    found = list(private_reads(source, {"_take", "_hidden", "_admit"}))
    assert [line for line, _ in found] == [2, 3, 4], found


# The simulator and the parts of the engine a student reads first run without torch.
TORCH_FREE = ["minicb.core.request", "minicb.core.scheduler", "minicb.core.scheduler.plan",
              "minicb.core.events", "minicb.core.request_events",
              "minicb.telemetry.metrics"]  # fmt: skip


def test_the_simulator_scheduler_request_plan_events_and_metrics_never_import_torch():
    sim = sorted(f"minicb.sim.{p.stem}" for p in (ROOT / "minicb" / "sim").glob("*.py"))
    folder = ROOT / "minicb" / "core" / "scheduler"
    scheduler = sorted(f"minicb.core.scheduler.{p.stem}" for p in folder.glob("*.py"))
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


# The floors of the house, lowest first (docs/architecture.md draws them): a module may
# import its own floor and the floors below, never one above. The core is the engine a
# student reads; features enter it through its seams; the surface is what outsiders call;
# the products stand on all of it.
FLOORS = {
    "core": 0,
    **dict.fromkeys(("overlap", "speculation", "reservation", "host_tier", "parallel",
                     "cuda_graphs", "utilisation", "packing", "cost_model", "kernels",
                     "quant", "features"), 1),  # fmt: skip
    **dict.fromkeys(("telemetry", "llm", "workload", "chat_workload", "engine_options",
                     "tiny_models", ""), 2),  # fmt: skip
    **dict.fromkeys(("sim", "driver"), 3),
    **dict.fromkeys(("bench", "fleet"), 4),
    **dict.fromkeys(("scenarios", "graded_labs"), 5),
    "server": 6,
    "cli": 7,
}

def floor_of(module: str) -> int | None:
    room = module.split(".")[1] if "." in module else ""  # "" is the package's own __init__
    return FLOORS.get(room)


def upward_imports() -> set[tuple[str, str]]:
    return {
        (edge.importer, edge.imported)
        for edge in import_graph.edges()
        if floor_of(edge.imported) > floor_of(edge.importer)
    }


def test_every_module_stands_on_a_floor():
    unplaced = sorted(m for m in import_graph.modules() if floor_of(m) is None)
    assert not unplaced, f"place these in FLOORS (and in docs/architecture.md): {unplaced}"


def test_the_core_imports_only_the_core_and_no_floor_imports_a_higher_one():
    upward = sorted(upward_imports())
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(
        f"{a} -> {b}" for a, b in upward
    )


def test_the_floor_check_sees_an_upward_import_at_any_depth():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from minicb.overlap.pipeline import OverlapPipeline\n"
        "def f():\n"
        "    from minicb.core import events\n"
        "    import minicb.server.app\n"
    )
    tree = ast.parse(source)
    hidden = import_graph._type_checking_nodes(tree)
    seen = [(t, id(node) not in hidden) for node in ast.walk(tree)
            for t in import_graph._targets(node, import_graph.modules())
            if t.startswith("minicb")]  # fmt: skip
    assert seen == [
        ("minicb.overlap.pipeline", False),
        ("minicb.core.events", True),
        ("minicb.server.app", True),
    ]
    assert floor_of("minicb.core.events") < floor_of("minicb.overlap.pipeline")
    assert floor_of("minicb.fleet.fleet") < floor_of("minicb.server.app")


def test_no_import_cycle_closes_at_run_time():
    pairs = {
        (edge.importer, edge.imported)
        for edge in import_graph.edges()
        if edge.run_time and edge.importer != edge.imported
    }
    assert import_graph.cycles(pairs) == []
    assert import_graph.cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [
        ["a", "b", "c"]
    ]


def test_a_plain_engine_built_and_stepped_loads_nothing_outside_the_core(tiny_llama_dir):
    code = (
        "import sys\n"
        "from minicb.core.config import EngineConfig, SamplingParams\n"
        "from minicb.core.engine import LLMEngine\n"
        f"engine = LLMEngine({str(tiny_llama_dir)!r},\n"
        "                   EngineConfig(num_kv_blocks=16, block_size=4, dtype='float32'))\n"
        "engine.add_request([3, 4, 5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0))\n"
        "while engine.has_unfinished():\n"
        "    engine.step()\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('minicb.')\n"
        "                      and not m.startswith('minicb.core'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [], f"a plain engine loads {result.stdout.split()}"


def test_the_floors_drawn_in_docs_are_the_floors_held_here():
    """docs/architecture.md draws the house as a block of lines ``floor N: room room``;
    each room is a folder or a root module of minicb/ (``minicb`` is the package's own
    ``__init__``). The picture and FLOORS must agree."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The house", 1)[1].split("\n## ", 1)[0]
    drawn = {}
    for line in section.splitlines():
        if line.startswith("floor "):
            number, rooms = line[len("floor ") :].split(":", 1)
            drawn |= {room.strip("`/").removesuffix(".py"): int(number)
                      for room in rooms.split()}  # fmt: skip
    held = {room or "minicb": floor for room, floor in FLOORS.items()}
    assert drawn == held


# Issue 51's measure of a readable house: a file a student can hold in mind at once. A few
# may stay longer where one concept needs the room; more than that says concepts are sharing
# files (scripts/house_sizes.py prints the same count for docs/architecture.md).
MAX_LINES, MAX_LONG_FILES = 300, 4


def test_at_most_four_files_of_the_package_are_over_300_lines():
    """Lines as ``wc -l`` counts them, docstrings and blanks included."""
    long = {str(path.relative_to(ROOT)): n for path in sorted((ROOT / "minicb").rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}  # fmt: skip
    assert len(long) <= MAX_LONG_FILES, (
        f"{len(long)} files of minicb/ are over {MAX_LINES} lines (at most {MAX_LONG_FILES} "
        f"may be): {long}; split a second concept into its own module"
    )
