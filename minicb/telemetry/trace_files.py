"""The traces a command records: one file per engine (``--trace FILE``).

The demo writes FILE for the continuous engine and FILE's stem + ``.static.jsonl`` for the
static one; ``serve --replicas`` one per replica. ``minicb replay FILE`` finds them all, and
so does ``minicb scenario export`` (minicb/scenarios/scenario_command.py): the names
live here, below every command that writes or reads them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine


def trace_paths(path: str) -> dict[str, Path]:
    """One trace per engine: FILE for continuous, FILE's stem + .static.jsonl for static."""
    main = Path(path)
    return {"continuous": main, "static": main.with_name(main.stem + ".static" + main.suffix)}


def replica_trace_paths(path: str, names: list[str]) -> dict[str, Path]:
    """One trace per replica: FILE for the first, FILE's stem + .replicaK.jsonl for the
    others (each replica numbers its own requests, so one file could not hold two)."""
    main = Path(path)
    return {
        name: main if k == 0 else main.with_name(f"{main.stem}.{name}{main.suffix}")
        for k, name in enumerate(names)
    }


def record_traces(
    engines: dict[str, LLMEngine], files: dict[str, Path], command: str
) -> Callable[[], None]:
    """Record each engine's events to its file until its settings change or the run ends;
    returns the function that closes the files. A rebuilt engine numbers its requests from
    0 again, and a trace must not mix the two: its "reset" event closes the trace."""
    from minicb.core.events import EVENT_KINDS
    from minicb.telemetry.trace import TraceWriter, trace_header

    writers: dict[str, TraceWriter] = {}

    def close(name: str, reset: bool = False) -> None:
        writer = writers.pop(name, None)
        if writer is None:
            return
        engines[name].bus.unsubscribe(writer)  # the bus that a rebuilt engine keeps
        writer.close()
        if reset:
            print(
                f"minicb {command}: settings changed; the {name} trace stops here", file=sys.stderr
            )

    def close_all() -> None:
        for name in list(writers):
            close(name)

    for name, file in files.items():
        bus = engines[name].bus
        header = trace_header(engines[name], command=command, panel=name)
        writers[name] = TraceWriter(file, header, engines[name].kv_snapshot_event)
        bus.subscribe(writers[name], kinds=EVENT_KINDS - {"reset"})
        bus.subscribe(lambda _events, name=name: close(name, reset=True), kinds=["reset"])
    return close_all
