"""What one ``schedule()`` costs with many requests running: the scheduler alone.

The real scheduler is driven by a fake runner (every sampled token is 7, nobody stops),
as the scheduler tests do: no model, no torch. Requests are admitted and prefilled until
all ``num_running`` are decoding; then ``schedule()`` is timed on its own (``update`` and
``retire`` run between calls, untimed) for ``iterations`` iterations.
"""

from __future__ import annotations

import statistics
import time

from minicb.scheduler.block_manager import blocks_needed
from minicb.config import EngineConfig
from minicb.request import Request
from minicb.config import SamplingParams
from minicb.scheduler import DECODE, make_scheduler
from minicb.scheduler.plan import StepPlan


def _fake_runner_step(scheduler, plan: StepPlan) -> None:
    sampled = {r.request_id: 7 for r in plan.scheduled if r.samples}
    scheduler.update(plan, sampled)
    scheduler.retire(plan)


def time_schedule(
    num_running: int,
    iterations: int = 200,
    batching: str = "continuous",
    prompt_len: int = 16,
    block_size: int = 16,
) -> dict[str, float]:
    """Seconds per ``schedule()`` with ``num_running`` requests decoding: median, mean, p90."""
    budget = 512
    prefill_steps = -(-num_running * prompt_len // budget) + 1
    max_tokens = iterations + prefill_steps + 8  # nobody finishes while we measure
    per_request = blocks_needed(prompt_len + max_tokens, block_size)
    config = EngineConfig(
        batching=batching,
        max_num_seqs=num_running,
        max_num_batched_tokens=max(budget, num_running),
        block_size=block_size,
        num_kv_blocks=num_running * per_request,
    )
    scheduler = make_scheduler(config, config.num_kv_blocks, prompt_len + max_tokens + 1, 0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_running):
        scheduler.add(Request(i, [5] * prompt_len, params, arrival_time=float(i)))
    for _ in range(prefill_steps + 2):  # admit and prefill everybody
        plan = scheduler.schedule()
        _fake_runner_step(scheduler, plan)
        if len(plan.scheduled) == num_running and all(r.phase == DECODE for r in plan.scheduled):
            break
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        plan = scheduler.schedule()
        times.append(time.perf_counter() - t)
        if len(plan.scheduled) != num_running:
            raise RuntimeError(f"expected {num_running} running rows, got {len(plan.scheduled)}")
        _fake_runner_step(scheduler, plan)
    times.sort()
    return {
        "num_running": num_running,
        "batching": batching,
        "iterations": iterations,
        "median_s": statistics.median(times),
        "mean_s": statistics.fmean(times),
        "p90_s": times[int(0.9 * (len(times) - 1))],
    }


def outside_model_share(steps: list[dict[str, float]]) -> dict[str, float | None]:
    """Shares of the iterations' wall time spent scheduling, sampling and elsewhere
    (input preparation, token bookkeeping, events): everything but the model's forward."""
    total = sum(s["dt"] for s in steps)
    if total <= 0:
        return {"outside": None, "schedule": None, "sample": None, "other": None}
    schedule = sum(s["schedule_s"] for s in steps)
    forward = sum(s["forward_s"] for s in steps)
    sample = sum(s["sample_s"] for s in steps)
    return {
        "outside": (total - forward) / total,
        "schedule": schedule / total,
        "sample": sample / total,
        "other": (total - forward - schedule - sample) / total,
    }
