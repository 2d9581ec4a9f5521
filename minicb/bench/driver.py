"""The minicb driver: a workload fed to an LLMEngine at its arrival times, and one run
measured from the engine's own events.

``drive`` feeds a workload with exact lengths (``ignore_eos``) through the one arrival
loop, ``minicb.workload.feed``, on the engine's clock (the wall clock in the bench, a
VirtualClock in tests); ``run_minicb`` records its events into a ``RunRecord``.

``run_record`` is how every system's run becomes a record, transformers' included (their
runs are rebuilt as minicb events first): one ``measure_events`` for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from minicb.bench import RunRecord, measure_events
from minicb.engine import LLMEngine
from minicb.scheduler.plan import DECODE
from minicb.telemetry.events import Event, StepEvent
from minicb.telemetry.trace import record_trace
from minicb.workload import RequestSpec, Workload, feed

SLOs = tuple[float | None, float | None]  # (TTFT, TPOT) goodput targets


def run_record(
    system: str, w: Workload, events: list[Event], t0: float, end: float, slo: SLOs
) -> RunRecord:
    """The run's record: its events measured from ``t0``, its wall time up to ``end``."""
    summary, steps = measure_events(events, t0, *slo)
    return RunRecord(system, w.name, summary, end - t0, steps)


def drive(
    engine: LLMEngine, workload: Workload, sleep: Callable[[float], None] = time.sleep
) -> tuple[float, float]:
    """Feed a workload's requests with exact lengths (``ignore_eos``) and step until all are
    done: (start, end). See ``minicb.workload.feed``."""

    def add(r: RequestSpec, arrival: float) -> None:
        engine.add_request(r.prompt, r.params(workload.temperature), arrival_time=arrival)

    return feed(engine, workload.requests, add, sleep)


def run_minicb(
    engine: LLMEngine,
    workload: Workload,
    system: str,
    slo: SLOs = (None, None),
    trace_path: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRecord:
    """One measured run, from the engine's own events; ``trace_path`` also records them."""
    events: list[Event] = []
    listener = engine.bus.subscribe(events.extend)
    header = dict(command="bench", system=system, workload=workload.describe())
    try:
        with record_trace(engine, trace_path, **header):
            start, end = drive(engine, workload, sleep)
    finally:
        engine.bus.unsubscribe(listener)
    return run_record(system, workload, events, start, end, slo)


def decode_steps(engine: LLMEngine, batch: int) -> Iterator[StepEvent]:
    """Step until every request is done, yielding the steps in which ``batch`` rows all
    decode (prefill steps and partly filled batches are left out)."""
    while engine.has_unfinished():
        event = engine.step().event
        rows = event.plan.scheduled
        if len(rows) == batch and all(r.phase == DECODE for r in rows):
            yield event
