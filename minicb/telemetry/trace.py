"""Recording a trace: a run's events in a JSONL file, to replay, measure and draw later.

Line 1 is a header (format, event schema version, engine config, model, hardware,
library versions); every later line is one event as ``minicb.telemetry.event_json.to_dict``
gives it. Step events carry only what their step changed in the KV pool; the whole map is
a ``kv_snapshot`` line written first and every ``SNAPSHOT_EVERY`` steps, so a reader can
seek to any step from the snapshot before it (``trace_reader.kv_states``).

    with record_trace(llm.engine, "run.jsonl"):
        llm.generate(prompts)
    header, events = read_trace("run.jsonl")      # minicb.telemetry.trace_reader

minicb.telemetry.trace_reader reads a trace back (converting older schema versions);
minicb.telemetry.perfetto exports one for ui.perfetto.dev. Pure Python.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import orjson

from minicb.core.events import (
    SCHEMA_VERSION,
    EngineReset,
    Event,
    KVSnapshotEvent,
    StepEvent,
)
from minicb.telemetry.event_json import to_dict

log = logging.getLogger(__name__)

TRACE_FORMAT = "minicb-trace"
# A whole KV map every this many steps: a replay seeks from the one before the step it
# wants. At a GPU's 30,000 blocks a map is a few hundred kB: a step every 256 stays small.
SNAPSHOT_EVERY = 256


def _encode_line(data: dict[str, Any]) -> bytes:
    """One compact JSON line in UTF-8. orjson, not the standard library: a step event of 16
    rows took about 470 us to encode with the C encoder of ``json`` and 7 us with orjson, on
    the per-step path of the engine thread (docs/performance.md, host costs). orjson writes
    a NaN or an infinity as null, so a line is always strict JSON."""
    # Integer keys (block tables by request id) become strings, as json.dumps makes them.
    return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


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
    if engine is not None:  # an LLMEngine, or anything shaped like one (a fleet's replica)
        described = engine.describe()
        header["config"] = described["config"]
        header["model"] = described["model"]
        header["hardware"].update(described["runner"])
        # A run on a simulated GPU (minicb/sim/simulated_runner.py) is no measurement: say so.
        header["simulated"] = bool(header["hardware"].get("simulated"))
    header.update(extra)
    return header


# ---- writing ---------------------------------------------------------------------------
# Seconds between two turns of a writer's thread: each turn writes the lines of every step
# handed over since the last. A trace is read when its run ends (close() writes the rest).
WRITE_EVERY_S = 0.1


class TraceWriter:
    """An event listener that appends each event to a JSONL file, header first.

    ``snapshot()``, if given, returns the engine's whole KV map as an event: taken after
    the header, after a reset, and after every ``SNAPSHOT_EVERY``-th step.

    The engine thread only hands a step's events over (one deque append); a thread of the
    writer's own turns them into lines (``to_dict``, orjson) and writes them. At 256 rows a
    step event's line took about a third of the bare step's CPU time in the engine thread
    (docs/performance.md, the live view at scale); with a real device that thread waits
    for the forward pass with the GIL released, which is when this one works. Events are
    read-only once published (the bus's contract, as for a Subscription), so a line
    written later says what it would have said at once. An error in the writer's thread
    (a full disk) is raised by the next call, so the bus logs it and unsubscribes this
    listener, as it did when the engine thread wrote; one when the file is closed (its
    buffer flushed) is logged in one line, not raised: the run it recorded is over."""

    def __init__(
        self,
        path: str | os.PathLike,
        header: dict[str, Any],
        snapshot: Callable[[], KVSnapshotEvent] | None = None,
    ) -> None:
        self.path = Path(path)
        self.num_events = 0
        self._snapshot = snapshot
        file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115
        file.write(_encode_line(header))
        self._lines = _Lines(file, f"trace writer {self.path.name}")
        # close() at the latest when this writer is collected or the interpreter exits,
        # so that no handed-over line is lost by a run that forgot to close it.
        self._close = weakref.finalize(self, self._lines.close)
        self._take_snapshot()

    def _take_snapshot(self) -> None:
        if self._snapshot is not None:  # taken now: the map as it is after this step
            self._lines.put((self._snapshot(),))
            self.num_events += 1

    def __call__(self, events: Sequence[Event]) -> None:
        """A step's events (a bus listener): handed to the writer's thread, one line each."""
        self._lines.put(events)
        self.num_events += len(events)
        last = events[-1] if events else None
        if isinstance(last, EngineReset) or any(
            isinstance(e, StepEvent) and e.plan.step % SNAPSHOT_EVERY == 0 for e in events
        ):
            self._take_snapshot()

    def close(self) -> None:
        """Write every line handed over, stop the writer's thread, close the file."""
        self._close()


class _Lines:
    """The writer's thread and what it has yet to write: sequences of events, in order."""

    def __init__(self, file: IO[bytes], name: str) -> None:
        self.file = file
        self.pending: deque[Sequence[Event]] = deque()  # appended and popped without a lock
        self.error: Exception | None = None
        self.closed = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def put(self, events: Sequence[Event]) -> None:
        if self.error is not None:
            raise self.error
        if self.closed:
            raise ValueError(f"{self.thread.name}: write to a closed trace")
        self.pending.append(events)

    def _run(self) -> None:
        while not self._stop.wait(WRITE_EVERY_S):
            self._write_pending()

    def _write_pending(self) -> None:
        pending, write = self.pending, self.file.write
        try:
            while pending and self.error is None:
                write(b"".join([_encode_line(to_dict(e)) for e in pending.popleft()]))
                time.sleep(0)  # let a waiting engine thread have the GIL between two steps
        except Exception as err:  # a full disk, a closed file: told by the next put()
            self.error = err
            log.error("%s: %s; the trace stops here", self.thread.name, err)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        self.thread.join()
        self._write_pending()
        try:
            self.file.close()  # flushes what is buffered: a full disk fails here too
        except OSError as err:
            if self.error is None:  # told once: a failed write already said it
                self.error = err
                log.error("%s: %s; the trace ends before its last lines", self.thread.name, err)


@contextmanager
def record_trace(
    engine: Any, path: str | os.PathLike | None, **extra: Any
) -> Iterator[TraceWriter | None]:
    """Record ``engine``'s events to ``path`` while the block runs; no-op if path is None."""
    if path is None:
        yield None
        return
    writer = TraceWriter(path, trace_header(engine, **extra), engine.kv_snapshot_event)
    engine.bus.subscribe(writer)
    try:
        yield writer
    finally:
        engine.bus.unsubscribe(writer)
        writer.close()


# The --trace FILE option of every subcommand that runs a workload:
#     add_trace_option(parser)              # when the parser is built
#     with traced(llm.engine, args):        # around the workload
def add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="FILE",
        default=None,
        help="record every event to a JSONL trace (read it with `minicb replay FILE`)",
    )


def traced(engine: Any, args: argparse.Namespace, **header: Any) -> AbstractContextManager:
    """Record ``engine``'s events to ``args.trace`` while the block runs; nothing if unset."""
    return record_trace(
        engine, getattr(args, "trace", None), command=getattr(args, "command", None), **header
    )
