"""Traces: a run's events in a JSONL file, to replay, measure and draw later.

Line 1 is a header (format, event schema version, engine config, model, hardware,
library versions); every later line is one event as ``minicb.events.to_dict`` gives it.

    with record_trace(llm.engine, "run.jsonl"):
        llm.generate(prompts)
    header, events = read_trace("run.jsonl")

A trace from an older event schema is upgraded when a migration for its version is
registered in ``MIGRATIONS``, and refused, saying which versions are readable, otherwise.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from minicb.event_bus import EventBus, attach
from minicb.events import SCHEMA_VERSION, Event, from_dict, to_dict

TRACE_FORMAT = "minicb-trace"
# One encoder for every line (json.dumps with options builds a new one per call).
# allow_nan=False: a NaN would make the file unreadable as strict JSON.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

# Event-schema version -> a function that upgrades one event dict to the next version.
# Version 1 is the first; when version 2 comes, MIGRATIONS[1] turns a v1 dict into v2.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class TraceError(ValueError):
    """A file that is not a minicb trace, or one this minicb cannot read."""


@dataclass
class Trace:
    header: dict[str, Any]
    events: list[Event]


# ---- the header ------------------------------------------------------------------------
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def trace_header(engine: Any = None, **extra: Any) -> dict[str, Any]:
    """Config, model, hardware and versions of the run; ``extra`` adds workload facts."""
    header: dict[str, Any] = {
        "type": "header",
        "format": TRACE_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "created": time.time(),
        "versions": {
            "minicb": _version("minicb"),
            "python": platform.python_version(),
            **{p: _version(p) for p in ("torch", "transformers", "triton", "prometheus_client")},
        },
        "hardware": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
    }
    if engine is not None:
        header["config"] = engine.config.to_dict()
        header["model"] = getattr(engine, "model_name", None)
        header["hardware"].update(_engine_hardware(engine))
    header.update(extra)
    return header


def _engine_hardware(engine: Any) -> dict[str, Any]:
    runner = getattr(engine, "runner", None)
    if runner is None:
        return {}
    info: dict[str, Any] = {
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "num_kv_blocks": runner.num_kv_blocks,
    }
    torch = sys.modules.get("torch")  # already imported by the engine; never import it here
    if torch is not None and runner.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(runner.device)
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


# ---- writing ---------------------------------------------------------------------------
class TraceWriter:
    """An event listener that appends each event to a JSONL file, header first."""

    def __init__(self, path: str | os.PathLike, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.num_events = 0
        self._file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._write(header)

    def _write(self, data: dict[str, Any]) -> None:
        self._file.write(_ENCODER.encode(data) + "\n")

    def __call__(self, event: Event) -> None:
        self._write(to_dict(event))
        self.num_events += 1

    def close(self) -> None:
        self._file.close()


@contextmanager
def record_trace(
    engine: Any, path: str | os.PathLike | None, **extra: Any
) -> Iterator[TraceWriter | None]:
    """Record ``engine``'s events to ``path`` while the block runs; no-op if path is None."""
    if path is None:
        yield None
        return
    bus: EventBus = attach(engine)
    writer = TraceWriter(path, trace_header(engine, **extra))
    bus.subscribe(writer)
    try:
        yield writer
    finally:
        bus.unsubscribe(writer)
        writer.close()


# ---- reading ---------------------------------------------------------------------------
def read_trace(path: str | os.PathLike) -> Trace:
    """Header and events of a trace file. Raises TraceError saying what is wrong."""
    with open(path, encoding="utf-8") as f:
        lines = iter(enumerate(f, start=1))
        first = next(lines, (1, ""))[1]
        if not first.strip():
            raise TraceError(f"{path} is empty: not a minicb trace")
        header = _parse(first, path, 1)
        if header.get("format") != TRACE_FORMAT:
            raise TraceError(
                f"{path} is not a minicb trace: its first line has no minicb-trace header"
            )
        upgrade = _upgrader(header.get("schema_version"), path)
        events = []
        for number, line in lines:
            if not line.strip():
                continue
            try:
                events.append(from_dict(upgrade(_parse(line, path, number))))
            except ValueError as err:
                raise TraceError(f"{path}, line {number}: {err}") from err
    return Trace(header, events)


def _parse(line: str, path: Any, number: int) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"{path}, line {number}: not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise TraceError(f"{path}, line {number}: expected a JSON object")
    return data


def _upgrader(version: Any, path: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function taking an event dict of ``version`` to the current schema."""
    if version == SCHEMA_VERSION:
        return lambda data: data
    readable = sorted({SCHEMA_VERSION, *_migratable()})
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise TraceError(
            f"{path} was written with event schema version {version!r}, newer than this "
            f"minicb understands (it reads versions {readable}); upgrade minicb to read it"
        )
    if version not in _migratable():
        raise TraceError(
            f"{path} was written with event schema version {version}, which this minicb can "
            f"no longer read (it reads versions {readable}); record the run again"
        )
    steps = [MIGRATIONS[v] for v in range(version, SCHEMA_VERSION)]

    def upgrade(data: dict[str, Any]) -> dict[str, Any]:
        for step in steps:
            data = step(data)
        return data

    return upgrade


def _migratable() -> set[int]:
    """Versions with an unbroken chain of migrations up to the current one."""
    versions, v = set(), SCHEMA_VERSION - 1
    while v in MIGRATIONS:
        versions.add(v)
        v -= 1
    return versions
