"""Workloads through the simulated runner: the real engine on a GPU that is not there.

The requests are ``minicb.workload.RequestSpec``s, usually built from lengths alone
(``from_lengths``): ``max_tokens`` is what the server is told (and what a ``max``
reservation or a static batch reserves), ``output_len`` where the model would have said
EOS. ``run_simulated`` feeds them at their arrival times on a ``VirtualClock`` (the one
arrival loop, ``minicb.workload.feed``), each with its real length as the
``expected_output_tokens`` hint (what Orca's Pow2 and Oracle reservations are granted to
know), steps the real engine over a ``SimulatedRunner`` until all are done, and measures
the events with minicb's one ``MetricsCollector``. Every result it returns says
``simulated`` and names the profile. Pure Python: no torch.

``static_vs_continuous`` is the prediction of static against continuous batching from
lengths alone: the same requests through the real engine with each scheduler. There is
no second, paper model of the schedules: what the prediction replays is what runs. Given
a plain step-time function instead of a GPU profile (``lambda plan: 1.0``: the clock then
counts iterations), the runner is a ``FakeRunner`` with room in its pool for everyone.

The limit case, worth knowing by heart: with output lengths exponential of mean m, steps
that cost the same whatever the batch (memory-bound decoding) and many requests, a static
batch of B lasts as long as its longest member, E[max] = m * H_B (H_B = 1 + 1/2 + ... +
1/B, ``harmonic``), while continuous batching keeps all B slots busy: the ratio tends to
H_B.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.core.runner.fake import FakeRunner
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.plan import StepPlan
from minicb.cost_model.step_time import StepTimeModel
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.sim.step_rows import step_row
from minicb.telemetry.metrics import MetricsCollector
from minicb.workload import RequestSpec, feed

StepTime = StepTimeModel | Callable[[StepPlan], float]


def simulated_runner(
    profile: StepTime, config: EngineConfig, requests: list[RequestSpec], clock: VirtualClock
) -> FakeRunner:
    """A ``SimulatedRunner`` of a GPU profile; for a plain step-time function, a
    ``FakeRunner`` on ``clock`` whose pool is the config's, else room for everyone."""
    if isinstance(profile, StepTimeModel):
        return SimulatedRunner(profile, config, clock=clock)
    longest = max((len(r.prompt) + r.max_tokens for r in requests), default=1)
    room = sum(blocks_needed(len(r.prompt) + r.max_tokens, config.block_size) for r in requests)
    return FakeRunner(
        num_kv_blocks=config.num_kv_blocks or max(1, room),
        max_model_len=config.max_model_len or longest + 1,
        num_swap_blocks=config.num_swap_blocks,
        vocab_size=32000,
        clock=clock,
        step_time_fn=profile,
    )


def run_simulated(
    profile: StepTime,
    config: EngineConfig,
    requests: list[RequestSpec],
    *,
    keep_steps: bool = False,
) -> dict[str, Any]:
    """The requests through the engine on ``profile`` (a GPU's step-time model, or a plain
    step-time function): the metrics summary, the mean normalized latency (each request's
    end-to-end seconds over its output tokens, as the vLLM paper defines it), the runner's
    description and (``keep_steps``) each step as ``step_row`` gives it."""
    clock = VirtualClock()
    runner = simulated_runner(profile, config, requests, clock)
    engine = LLMEngine(config=config, runner=runner, clock=clock)
    metrics, steps, finished = MetricsCollector(), [], []
    engine.bus.subscribe(metrics)
    engine.bus.subscribe(finished.extend, kinds=["finished"])
    if keep_steps:
        engine.bus.subscribe(lambda es: steps.extend(step_row(e, 0.0) for e in es), kinds=["step"])
    arrivals: dict[int, float] = {}

    def add(r: RequestSpec, arrival: float) -> None:
        arrivals[_add(engine, runner, r, arrival)] = arrival

    feed(engine, requests, add, clock.advance)
    normalized = [(e.time - arrivals[e.request_id]) / e.num_output_tokens for e in finished]
    return {"simulated": True, "runner": runner.describe(), "summary": metrics.summary(),
            "normalized_latency_s": sum(normalized) / len(normalized) if normalized else None,
            "steps": steps}  # fmt: skip


def static_vs_continuous(
    profile: StepTime, config: EngineConfig, requests: list[RequestSpec]
) -> dict[str, Any]:
    """The prediction from lengths alone: the requests through the real engine with the
    static and with the continuous scheduler on ``profile``. Simulated seconds of each
    (``static_s``, ``continuous_s``: from the start to the last request's end), their
    steps, and ``ratio``: continuous over static output tokens/s."""
    runs = {mode: run_simulated(profile, config.with_(batching=mode), requests)["summary"]
            for mode in ("static", "continuous")}  # fmt: skip
    tok_s = {mode: s["throughput"]["output_tokens_per_s"] for mode, s in runs.items()}
    return {
        "static_s": runs["static"]["duration_s"],
        "continuous_s": runs["continuous"]["duration_s"],
        "static_steps": runs["static"]["batch"]["steps"],
        "continuous_steps": runs["continuous"]["batch"]["steps"],
        "ratio": tok_s["continuous"] / tok_s["static"] if tok_s["static"] else float("nan"),
    }


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n: the limit of continuous over static at n slots."""
    return sum(1.0 / k for k in range(1, n + 1))


def _add(engine: LLMEngine, runner: FakeRunner, r: RequestSpec, arrival: float) -> int:
    """Queue one request and return its id; one that stops before max_tokens stops as at
    EOS (forced)."""
    rid = engine.add_request(
        r.prompt, r.params(), arrival_time=arrival, expected_output_tokens=r.output_tokens
    )
    if r.stops_early:
        runner.output_lengths[rid] = r.output_tokens
    return rid
