"""Workloads through the simulated runner: the real engine on a GPU that is not there.

A ``SimRequest`` gives lengths only: prompt, ``max_tokens`` (what the server is told, and
what a ``max`` reservation or a static batch reserves), and the real output length (where
the model would have said EOS; equal to ``max_tokens`` for a request that runs to its
limit). ``run_simulated`` feeds the requests at their arrival times on a ``VirtualClock`` (the
bench's one arrival loop, ``driver.feed``),
each with its real length as the ``expected_output_tokens`` hint (what Orca's Pow2 and
Oracle reservations are granted to know), steps the real engine over a ``SimulatedRunner``
until all are done, and measures the events with minicb's one ``MetricsCollector``. Every
result it returns says ``simulated`` and names the profile. Pure Python: no torch.

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

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from minicb.bench import step_row
from minicb.bench.driver import feed
from minicb.config import EngineConfig, SamplingParams
from minicb.engine import LLMEngine
from minicb.runner import VirtualClock
from minicb.runner.fake import FakeRunner
from minicb.scheduler.block_manager import blocks_needed
from minicb.scheduler.plan import StepPlan
from minicb.sim.runner import SimulatedRunner
from minicb.sim.step_time import StepTimeModel
from minicb.telemetry.metrics import MetricsCollector


@dataclass(frozen=True)
class SimRequest:
    prompt_len: int
    max_tokens: int
    output_len: int  # the real output length, 1..max_tokens
    arrival: float = 0.0  # seconds after the start


def prompt_ids(index: int, length: int, vocab: int) -> list[int]:
    """A prompt of ``length`` tokens whose first token differs from its neighbours', so no
    two requests share a prefix block (the papers' systems had no prefix cache)."""
    return [3 + index % (vocab - 3)] + [5] * (length - 1)


def exponential_lengths(n: int, mean: float, cap: int, seed: int) -> list[int]:
    """``n`` draws of an exponential of ``mean``, rounded, within [1, cap]."""
    rng = random.Random(seed)
    return [max(1, min(cap, round(rng.expovariate(1.0 / mean)))) for _ in range(n)]


def lognormal_lengths(n: int, mean: float, sigma: float, cap: int, seed: int) -> list[int]:
    """``n`` draws of a lognormal of ``mean`` and shape ``sigma``, rounded, within [1, cap]."""
    rng, mu = random.Random(seed), math.log(mean) - sigma**2 / 2
    return [max(1, min(cap, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` requests per second, from 0."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def with_arrivals(requests: list[SimRequest], times: list[float]) -> list[SimRequest]:
    """The same requests arriving at ``times``."""
    return [replace(r, arrival=t) for r, t in zip(requests, times, strict=True)]


StepTime = StepTimeModel | Callable[[StepPlan], float]


def simulated_runner(
    profile: StepTime, config: EngineConfig, requests: list[SimRequest], clock: VirtualClock
) -> FakeRunner:
    """A ``SimulatedRunner`` of a GPU profile; for a plain step-time function, a
    ``FakeRunner`` on ``clock`` whose pool is the config's, else room for everyone."""
    if isinstance(profile, StepTimeModel):
        return SimulatedRunner(profile, config, clock=clock)
    longest = max((r.prompt_len + r.max_tokens for r in requests), default=1)
    room = sum(blocks_needed(r.prompt_len + r.max_tokens, config.block_size) for r in requests)
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
    requests: list[SimRequest],
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
    engine.bus.subscribe(finished.append, kinds=["finished"])
    if keep_steps:
        engine.bus.subscribe(lambda e: steps.append(step_row(e, 0.0)), kinds=["step"])
    arrivals: dict[int, float] = {}

    def add(r: SimRequest, arrival: float) -> None:
        arrivals[_add(engine, runner, r, len(arrivals), arrival)] = arrival

    feed(engine, requests, add, clock.advance)
    normalized = [(e.time - arrivals[e.request_id]) / e.num_output_tokens for e in finished]
    return {"simulated": True, "runner": runner.describe(), "summary": metrics.summary(),
            "normalized_latency_s": sum(normalized) / len(normalized) if normalized else None,
            "steps": steps}  # fmt: skip


def static_vs_continuous(
    profile: StepTime, config: EngineConfig, requests: list[SimRequest]
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


def _add(engine: LLMEngine, runner: FakeRunner, r: SimRequest, index: int, arrival: float) -> int:
    """Queue one request and return its id; one that stops before max_tokens stops as at
    EOS (forced)."""
    early = r.output_len < r.max_tokens
    params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=not early)
    prompt = prompt_ids(index, r.prompt_len, runner.vocab_size)
    rid = engine.add_request(
        prompt, params, arrival_time=arrival, expected_output_tokens=r.output_len
    )
    if early:
        runner.output_lengths[rid] = r.output_len
    return rid
