"""The fairness lab's admission policy: fill whatever fits (the seed's "greedy insertion").

minicb's continuous scheduler admits waiting requests in policy order and stops at the
first one that does not fit (head of line): a long prompt that needs many KV blocks holds
back everyone behind it until enough blocks are free, so it cannot starve. A scheduler that
instead skips it and admits whatever fits keeps the batch fuller, but under a steady
stream of short requests the freed blocks are taken by newcomers before enough of them
accumulate for the long one: it starves (the seed's challenge, "贪心插入策略可能导致长序列
请求长期饥饿"). Two fixes, both here as knobs for the lab to tune:

- ``aging_steps``: a request that has waited this many iterations stops the skipping:
  nobody behind it is admitted until it is (head of line from then on);
- ``reserve_blocks``: a request admitted past an older one that does not fit must leave
  this many blocks free, so the pool can fill up for the one skipped.

A teaching subclass of the real scheduler, used through ``fairness_engine`` (which swaps it
into an engine: the lab's one reach past the engine's façade). ``starvation_run`` drives
the lab's workload on a fake runner and a virtual clock, so a run takes a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.scheduler import ContinuousScheduler
from minicb.core.scheduler.plan import StepPlan


class FillWhateverFits(ContinuousScheduler):
    """Continuous batching whose admission skips a request that does not fit."""

    aging_steps: int | None = None
    reserve_blocks: int = 0

    def _admit(self, plan: StepPlan, budget: int, chunked: bool) -> int:
        skipped = []  # older requests that did not fit this iteration
        for req in self.ordered(self.waiting):
            if len(self.running) >= self.config.max_num_seqs:
                break
            if skipped and self.blocks.num_free_blocks <= self.reserve_blocks:
                plan.notes.append(f"the last {self.reserve_blocks} free blocks are kept for "
                                  f"request {skipped[0].request_id}")  # fmt: skip
                break
            saved, before = self.waiting, len(self.running)
            self.waiting = [req]  # the real admission, for this one request
            budget = super()._admit(plan, budget, chunked)
            admitted = len(self.running) > before
            self.waiting = [r for r in saved if not (admitted and r is req)]
            if admitted:
                continue
            waited = self.step_count - req.arrival_step
            if self.aging_steps is not None and waited >= self.aging_steps:
                plan.notes.append(f"request {req.request_id} has waited {waited} iterations: "
                                  "nobody passes it now")  # fmt: skip
                break
            skipped.append(req)
        return budget


def fairness_engine(config: EngineConfig, runner: Any, clock: Any, *, policy: str,
                    aging_steps: int | None = None, reserve_blocks: int = 0) -> Any:  # fmt: skip
    """An engine whose admission is ``policy``: "head-of-line" (minicb's own) or
    "fill-whatever-fits" (with the fixes' knobs)."""
    from minicb.core.engine import LLMEngine

    if policy == "head-of-line":
        return LLMEngine(config=config, runner=runner, clock=clock)
    if policy != "fill-whatever-fits":
        raise ValueError(f"unknown policy {policy!r}: head-of-line or fill-whatever-fits")

    def build(*args: Any) -> FillWhateverFits:  # the engine's scheduler seam
        scheduler = FillWhateverFits(*args)
        scheduler.aging_steps, scheduler.reserve_blocks = aging_steps, reserve_blocks
        return scheduler

    return LLMEngine(config=config, runner=runner, clock=clock, scheduler=build)


@dataclass
class StarvationResult:
    long_wait: int  # iterations from the long prompt's arrival to its admission
    short_wait_mean: float  # the same, mean over the short requests
    short_wait_max: int
    long_finished: bool
    steps: int
    occupancy: float  # mean running requests / slots over the iterations


def starvation_run(policy: str, *, aging_steps: int | None = None, reserve_blocks: int = 0,
                   steps: int = 400, long_prompt: int = 320, queue: int = 2, long_at: int = 50,
                   seed: int = 0) -> StarvationResult:  # fmt: skip
    """8 slots, a pool of 40 blocks of 16 tokens, a steady stream of short chats (new ones
    whenever fewer than ``queue`` wait) and, at iteration ``long_at``, one long prompt of
    ``long_prompt`` tokens (chunked prefill on: a prompt needs blocks, not the budget)."""
    import random

    from minicb import FakeRunner, VirtualClock

    rng = random.Random(seed)
    config = EngineConfig(max_num_seqs=8, num_kv_blocks=40, block_size=16,
                          max_num_batched_tokens=512, enable_prefix_caching=False)  # fmt: skip
    clock = VirtualClock()
    runner = FakeRunner(num_kv_blocks=40, max_model_len=1024, clock=clock, step_time=0.05)
    engine = fairness_engine(config, runner, clock, policy=policy, aging_steps=aging_steps,
                             reserve_blocks=reserve_blocks)  # fmt: skip
    arrived: dict[int, int] = {}
    admitted: dict[int, int] = {}
    long_id, running, finished = None, [], set()
    for step in range(1, steps + 1):
        long_waits = long_id is not None and long_id not in admitted
        while engine.queue_sizes()["waiting"] - long_waits < queue:  # a steady stream
            prompt = [rng.randrange(3, 200) for _ in range(rng.randint(24, 56))]
            rid = engine.add_request(prompt, SamplingParams(
                max_tokens=rng.randint(8, 40), temperature=0.0, ignore_eos=True))  # fmt: skip
            arrived[rid] = step
        if step == long_at:
            long_id = engine.add_request([7] * long_prompt, SamplingParams(
                max_tokens=8, temperature=0.0, ignore_eos=True))  # fmt: skip
            arrived[long_id] = step
        result = engine.step()
        running.append(len(result.plan.scheduled))
        for d in result.plan.admitted:
            admitted.setdefault(d.request_id, step)
        finished.update(d.request_id for d in result.plan.finished)
        clock.advance(0.05)
    waits = {rid: admitted.get(rid, steps + 1) - arrived[rid] for rid in arrived}
    short = [w for rid, w in waits.items() if rid != long_id and rid in admitted]
    return StarvationResult(
        long_wait=waits[long_id],
        short_wait_mean=sum(short) / len(short),
        short_wait_max=max(short),
        long_finished=long_id in finished,
        steps=steps,
        occupancy=sum(running) / (len(running) * config.max_num_seqs),
    )
