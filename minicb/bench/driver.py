"""Runs a workload through a minicb engine in real time.

Requests enter the engine when their arrival time has passed on the wall clock: before
each step the driver adds every request whose time has come (stamped with its scheduled
arrival time, so a request that arrived while a step was running is charged for the
wait), and when nothing is running it sleeps until the next arrival. No simulated clock:
every latency is real time on this machine. Figures come from the engine's own events.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from minicb.bench.records import RunRecord, StepLog
from minicb.bench.workloads import Workload
from minicb.telemetry.bus import attach
from minicb.telemetry.metrics import MetricsCollector
from minicb.config import SamplingParams


def sampling_params(workload: Workload) -> list[SamplingParams]:
    """Exact lengths: ``ignore_eos`` and the workload's ``max_tokens`` for every request."""
    return [
        SamplingParams(max_tokens=r.max_tokens, temperature=workload.temperature, ignore_eos=True)
        for r in workload.requests
    ]


def drive(engine: Any, workload: Workload) -> tuple[float, float]:
    """Feed the requests at their arrival times and step until all are done: (start, end)."""
    params = sampling_params(workload)
    order = deque(sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrival))
    start = time.time()
    while order or engine.has_unfinished():
        now = time.time()
        while order and start + workload.requests[order[0]].arrival <= now:
            i = order.popleft()
            spec = workload.requests[i]
            engine.add_request(spec.prompt, params[i], arrival_time=start + spec.arrival)
        if engine.has_unfinished():
            engine.step()
        elif order:  # idle: wait for the next arrival rather than spin
            time.sleep(max(0.0, start + workload.requests[order[0]].arrival - time.time()))
    return start, time.time()


def run_minicb(
    engine: Any,
    workload: Workload,
    system: str,
    ttft_slo: float | None = None,
    tpot_slo: float | None = None,
    trace_path: str | None = None,
) -> RunRecord:
    """One measured run; ``trace_path`` also records its events for replay."""
    from minicb.telemetry.trace import record_trace

    bus = attach(engine)
    metrics, log = MetricsCollector(), StepLog()
    bus.subscribe(metrics)
    bus.subscribe(log, kinds=["step"])
    recording: AbstractContextManager = (
        record_trace(
            engine,
            trace_path,
            command="bench",
            system=system,
            workload=workload.describe(),
        )
        if trace_path
        else nullcontext()
    )
    try:
        with recording:
            start, end = drive(engine, workload)
    finally:
        bus.unsubscribe(metrics)
        bus.unsubscribe(log)
    return RunRecord(
        system=system,
        workload=workload.name,
        summary=metrics.summary(ttft_slo, tpot_slo),
        wall_s=end - start,
        steps=log.rows(start),
    )
