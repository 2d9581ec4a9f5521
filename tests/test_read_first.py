"""The read-first path of docs/architecture.md is the walk of one request, at its real sizes.

One request on a tiny real model, with someone listening on the bus, crosses a set of
files of ``minicb/``; the table "Read these first, in this order" must list exactly those
(and the runner protocol, which is read, not run), each with its line count as it is
today, and the total. The table cannot drift from the code: a file the walk starts to
cross, or a file that grows, fails here until the table says so.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from minicb import EngineConfig, LLMEngine, SamplingParams
from minicb.tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minicb"
READ_NOT_RUN = {"minicb/core/runner/__init__.py"}  # the Runner protocol: the seam, no code runs
ROW = re.compile(r"^\| *(\d+) *\| `(minicb/[\w/]+\.py)` \| ([\d,]+) \|")
TOTAL = re.compile(r"^\| *\| \*\*(?:the path|the core)\*\* \| \*\*([\d,]+)\*\* \|")


def walk_of_one_request(tmp_path: Path) -> set[str]:
    """Files of minicb/ whose code runs from a request's arrival to its output."""
    model = make_tiny_model_dir("llama", tmp_path / "model")
    # float32: the same walk on every CPU ("auto" picks bfloat16 where the CPU has it, and
    # the linears then also cross runner/packed.py, oneDNN's packed weights)
    config = EngineConfig(num_kv_blocks=16, block_size=4, dtype="float32")
    engine = LLMEngine(str(model), config)
    heard: list = []
    engine.bus.subscribe(heard.extend)  # someone listens: the events are built and sent
    crossed: set[str] = set()
    prefix = str(PACKAGE) + "/"

    def note(frame, event, arg):
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename == "<string>" and frame.f_code.co_name == "__init__":
            # A dataclass's __init__ is code Python writes: it crosses the class's own file.
            owner = frame.f_locals.get("self")
            filename = getattr(sys.modules.get(type(owner).__module__), "__file__", "") or ""
        if filename.startswith(prefix):
            crossed.add("minicb/" + filename[len(prefix) :])

    sys.setprofile(note)
    try:
        engine.add_request([3, 4, 5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0))
        while engine.has_unfinished():
            engine.step()
    finally:
        sys.setprofile(None)
    assert heard, "nobody heard the request"
    return crossed


def read_first_table(heading: str = "## Read these first") -> tuple[list[tuple[str, int]], int]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows, total = [], None
    for line in section.splitlines():
        if m := ROW.match(line):
            rows.append((m.group(2), int(m.group(3).replace(",", ""))))
        elif m := TOTAL.match(line):
            total = int(m.group(1).replace(",", ""))
    assert rows and total is not None, f"the table under {heading!r} is missing or malformed"
    return rows, total


def lines_of(name: str) -> int:
    return len((ROOT / name).read_text(encoding="utf-8").splitlines())


def test_the_read_first_path_is_the_walk_of_one_request(tmp_path):
    rows, total = read_first_table()
    listed = [name for name, _ in rows]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    walked = walk_of_one_request(tmp_path) | READ_NOT_RUN
    assert set(listed) == walked, (
        f"listed but not crossed: {sorted(set(listed) - walked)}; "
        f"crossed but not listed: {sorted(walked - set(listed))}"
    )
    sizes = {name: lines_of(name) for name in listed}
    assert dict(rows) == sizes, "a file's size in the table is not its size today"
    assert total == sum(sizes.values())


def test_the_core_table_lists_every_file_of_the_core_at_its_size():
    """docs/architecture.md's "The core" lists every file of minicb/core/, once, with its
    size today and the total: the read a student is promised is the folder itself."""
    rows, total = read_first_table("## The core")
    listed = [name for name, _ in rows]
    core = sorted(p.relative_to(ROOT).as_posix() for p in (PACKAGE / "core").rglob("*.py"))
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert sorted(listed) == core, (
        f"listed but not in core: {sorted(set(listed) - set(core))}; "
        f"in core but not listed: {sorted(set(core) - set(listed))}"
    )
    assert dict(rows) == {name: lines_of(name) for name in listed}
    assert total == sum(size for _, size in rows)
