"""The scheduler, block manager, request, plan, events, bus, metrics, traces and workloads
never import torch, and the real engine runs on FakeRunner without it: they can be read,
tested and driven on any laptop."""

import subprocess
import sys

PURE_MODULES = [
    "minicb.core.config",
    "minicb.engine_options",
    "minicb.core.request",
    "minicb.core.scheduler",
    "minicb.core.scheduler.block_manager",
    "minicb.core.scheduler.plan",
    "minicb.core.scheduler.interruptions",
    "minicb.core.scheduler.hooks",
    "minicb.speculation",
    "minicb.speculation.drafter",
    "minicb.speculation.ngram",
    "minicb.reservation",
    "minicb.core.events",
    "minicb.telemetry.event_json",
    "minicb.core.request_events",
    "minicb.core.bus",
    "minicb.core.subscription",
    "minicb.telemetry.metrics",
    "minicb.core.latency",
    "minicb.telemetry.listener",
    "minicb.telemetry.records",
    "minicb.telemetry.summary",
    "minicb.telemetry.trace",
    "minicb.telemetry.trace_reader",
    "minicb.telemetry.perfetto",
    "minicb.core.engine",
    "minicb.core.runner",
    "minicb.core.runner.fake",
    "minicb.scenarios",
    "minicb.scenarios.player",
    "minicb.scenarios.side_figures",
    "minicb.workload",
    "minicb.chat_workload",
    "minicb.fleet.router",
    "minicb.fleet.autoscale",
    "minicb.fleet.sla_planner",
    "minicb.fleet.simulated",
]

# A fresh interpreter (this one has torch from conftest): import the modules, then run a
# few steps of the engine over FakeRunner, with events flowing to a metrics collector.
RUN = """
import sys
from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams, VirtualClock
from minicb.telemetry.metrics import MetricsCollector

clock = VirtualClock()
engine = LLMEngine(
    config=EngineConfig(block_size=4, num_kv_blocks=8, preemption_mode="swap"),
    runner=FakeRunner(num_kv_blocks=8, clock=clock, step_time=0.5),
    clock=clock,
)
metrics = MetricsCollector()
engine.bus.subscribe(metrics)
for n in (5, 9, 3):
    engine.add_request([1] * n, SamplingParams(max_tokens=6, temperature=0.0))
outs = engine.run_until_done()
assert sorted(len(o.token_ids) for o in outs) == [6, 6, 6]
assert metrics.summary()["requests"]["finished"] == 3
assert 'torch' not in sys.modules, 'torch was imported'
"""


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_core_modules_do_not_import_torch():
    imports = ", ".join(PURE_MODULES)
    result = run_fresh(
        f"import sys, {imports}; assert 'torch' not in sys.modules, 'torch imported'"
    )
    assert result.returncode == 0, result.stderr


def test_the_engine_runs_on_fake_runner_without_torch():
    result = run_fresh(RUN)
    assert result.returncode == 0, result.stderr
