"""The benchmark suite behind ``minicb bench``, and what every one of its runs leaves behind.

Twelve modules, one concept each (what a student runs: minicb continuous against static
against transformers, and the report):

- ``workloads``: what the suite runs: the recipes (seeded request sets, built on
  minicb/workload.py), the systems by name, the suite's two sizes and its workloads at each;
- ``systems``: the five systems under test, minicb continuous and static beside their
  baselines, transformers' padded ``generate`` and its continuous batching, each run
  reduced to minicb's events;
- ``measurements``: the run's measurements, one ``Suite`` method per section of
  bench.json, ``schedule()``'s cost on its own among them;
- ``calibration``: a ``cpu`` profile of this machine read off a probe of the engine, and
  how well it predicts each step and static against continuous (the real schedulers on
  the simulated runner, minicb/sim/);
- ``run_records``: what one run leaves behind (``RunRecord``) and the figures read off it;
- ``sanity``: every run's figures, and the ratios between systems, checked before anyone
  reads them: a figure no correct run gives is an error naming the system and the figure;
- ``report``: the goals judged and the markdown tables;
- ``charts``: the self-contained HTML page, its charts and then those tables;
- ``suite``: the ``minicb bench`` subcommand, the whole run in order;
- ``speculative``: speculative decoding's own benchmark (``python -m
  minicb.bench.speculative``): where n-gram drafts help, and where they cost;
- ``all_reproductions``: ``minicb bench --simulate``: the papers' reproductions (minicb/sim/)
  and the fleet's (minicb/fleet/) run by name and written as one report.

The decode roofline of this machine (how close a step and the model's linear layers alone
come to it), the host costs and ``--compile on`` are the performance lab's (perflab/,
beside the package in a source checkout): ``performance_lab`` imports it where it is there.

Here: the driver (``run_minicb``: a workload fed to an engine at its arrival times through
the one arrival loop, ``minicb.workload.feed``, with exact lengths, on the engine's clock;
its events recorded), a run made a ``RunRecord`` (its events measured by minicb's
``MetricsCollector``, so one definition of TTFT, TPOT, occupancy and the rest serves every
system: transformers' runs are rebuilt as minicb events first) and the figures taken from
records: each figure over the repeats of one system as its median,
minimum and maximum; ratios between two systems taken repeat by repeat (the systems
alternate within each repeat, so a pair shares the machine's mood). Pure Python.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import minicb.features  # noqa: F401  (a product may run engines with any feature)
from minicb.bench.run_records import FIGURES, RunRecord
from minicb.bench.sanity import check_run
from minicb.core.events import Event, StepEvent
from minicb.core.scheduler.plan import DECODE
from minicb.sim.step_rows import step_row
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.trace import record_trace
from minicb.workload import RequestSpec, Workload, feed

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine

NO_LAB = (
    "not measured: the decode roofline is the performance lab's (perflab/, beside the package "
    "in a source checkout); run minicb bench from the repository root to measure it"
)


def performance_lab(module: str) -> Any | None:
    """``perflab.<module>`` where the performance lab sits beside the package (a source
    checkout, run from its root); None where it does not (a ``minicb`` installed from a
    wheel, which holds ``minicb`` only)."""
    try:
        return importlib.import_module(f"perflab.{module}")
    except ModuleNotFoundError as err:
        if err.name not in ("perflab", f"perflab.{module}"):
            raise  # the lab is there but something it imports is not: say so
        return None


def measure_events(
    events: Iterable[Event], t0: float, ttft_slo: float | None, tpot_slo: float | None
) -> tuple[dict[str, Any], list[dict[str, float]], tuple[float, float]]:
    """The metrics summary, the step rows and the span (first and last event time, from
    ``t0``) of a run's events (rebuilt ones included)."""
    metrics, steps = MetricsCollector(), []
    for event in events:
        metrics((event,))
        if isinstance(event, StepEvent):
            steps.append(step_row(event, t0))
    first, last = (t0, t0) if metrics.t_min is None else (metrics.t_min, metrics.t_max)
    return metrics.summary(ttft_slo, tpot_slo), steps, (first - t0, last - t0)


# ---- figures -------------------------------------------------------------------------------
def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median, min, max and count of the values present; None when there are none."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def median_of(s: dict[str, float] | float | None) -> float | None:
    """A spread's median; a single run's figure (or None) as it is."""
    return s["median"] if isinstance(s, dict) else s


def aggregate(records: list[RunRecord]) -> dict[str, dict[str, float] | None]:
    """Each figure over the repeats: median, min, max."""
    return {k: spread(r.figures.get(k) for r in records) for k in [*FIGURES, "wall_s"]}


def paired_ratio(
    a: list[RunRecord], b: list[RunRecord], key: str = "output_tok_s"
) -> dict[str, float] | None:
    """``a``'s figure over ``b``'s, repeat by repeat (repeat i with repeat i)."""
    pairs = [(ra.figures.get(key), rb.figures.get(key)) for ra, rb in zip(a, b, strict=False)]
    return spread(fa / fb for fa, fb in pairs if fa is not None and fb)


def ratio_table(runs: dict[str, list[RunRecord]], key: str = "output_tok_s") -> dict[str, Any]:
    """Every ordered pair of systems that both ran: 'x / y' -> paired ratio of ``key``."""
    names = [n for n, recs in runs.items() if any(not r.error for r in recs)]
    return {
        f"{x} / {y}": paired_ratio(runs[x], runs[y], key) for x in names for y in names if x != y
    }


def outside_model_share(steps: list[dict[str, float]]) -> dict[str, float | None]:
    """Shares of the iterations' wall time spent scheduling, sampling and elsewhere
    (input preparation, token bookkeeping, events): everything but the model's forward."""
    total = sum(s["dt"] for s in steps)
    if total <= 0:
        return dict.fromkeys(("outside", "schedule", "sample", "other"))
    schedule, forward, sample = (
        sum(s[k] for s in steps) for k in ("schedule_s", "forward_s", "sample_s")
    )
    return {
        "outside": (total - forward) / total,
        "schedule": schedule / total,
        "sample": sample / total,
        "other": (total - forward - schedule - sample) / total,
    }


# ---- the driver: a workload fed to an engine, and a run made a record ------------------
SLOs = tuple[float | None, float | None]  # (TTFT, TPOT) goodput targets


def run_record(
    system: str, w: Workload, events: list[Event], t0: float, end: float, slo: SLOs
) -> RunRecord:
    """The run's record: its events measured from ``t0``, its wall time up to ``end``;
    checked before anyone reads a figure of it (a figure no correct run gives raises
    ``ImplausibleFigure``, naming the system and the figure: minicb.bench.sanity)."""
    summary, steps, span = measure_events(events, t0, *slo)
    record = RunRecord(system, w.name, summary, end - t0, steps, span)
    check_run(record, w)
    return record


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
