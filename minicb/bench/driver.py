"""The minicb driver: a workload fed to an LLMEngine at its arrival times, and one run
measured from the engine's own events.

``feed`` is the one arrival loop of the bench, whatever the runner (real, fake or
simulated): before each step it adds every request whose arrival time has come on the
engine's clock (the wall clock in the bench, a VirtualClock in tests), and when nothing
runs it sleeps until the next one. ``drive`` feeds a workload with exact lengths
(``ignore_eos``); ``run_minicb`` records its events into a ``RunRecord``.

``run_record`` is how every system's run becomes a record, transformers' included (their
runs are rebuilt as minicb events first): one ``measure_events`` for all of them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from minicb.bench import RunRecord, measure_events
from minicb.bench.workloads import RequestSpec, Workload
from minicb.config import SamplingParams
from minicb.engine import LLMEngine
from minicb.scheduler.plan import DECODE
from minicb.telemetry.events import Event, StepEvent
from minicb.telemetry.trace import record_trace

SLOs = tuple[float | None, float | None]  # (TTFT, TPOT) goodput targets


def run_record(
    system: str, w: Workload, events: list[Event], t0: float, end: float, slo: SLOs
) -> RunRecord:
    """The run's record: its events measured from ``t0``, its wall time up to ``end``."""
    summary, steps = measure_events(events, t0, *slo)
    return RunRecord(system, w.name, summary, end - t0, steps)


def feed(
    engine: LLMEngine,
    requests: Iterable[Any],
    add: Callable[[Any, float], None],
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """The one arrival loop of the bench (real, fake or simulated runner): before each step,
    ``add(request, arrival_time)`` every request (anything with an ``arrival`` in seconds
    after the start) whose time has come on the engine's clock, stamped with its scheduled
    arrival (a request that arrived while a step ran is charged for the wait); step until
    all are done; when nothing runs, ``sleep`` until the next arrival (a VirtualClock's
    ``advance`` with a virtual clock). Returns (start, end) on the engine's clock."""
    clock = engine.clock
    order = deque(sorted(requests, key=lambda r: r.arrival))
    start = clock()
    while order or engine.has_unfinished():
        while order and start + order[0].arrival <= clock():
            r = order.popleft()
            add(r, start + r.arrival)
        if engine.has_unfinished():
            engine.step()
        elif order:  # idle: wait for the next arrival rather than spin
            sleep(max(0.0, start + order[0].arrival - clock()))
    return start, clock()


def drive(
    engine: LLMEngine, workload: Workload, sleep: Callable[[float], None] = time.sleep
) -> tuple[float, float]:
    """Feed a workload's requests with exact lengths (``ignore_eos``) and step until all are
    done: (start, end). See ``feed``."""
    temp = workload.temperature

    def add(r: RequestSpec, arrival: float) -> None:
        params = SamplingParams(max_tokens=r.max_tokens, temperature=temp, ignore_eos=True)
        engine.add_request(r.prompt, params, arrival_time=arrival)

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
    listener = engine.bus.subscribe(events.append)
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
