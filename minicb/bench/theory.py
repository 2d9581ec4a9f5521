"""What the figures should be: theory for static against continuous batching, and what
``schedule()`` costs on its own.

Static vs continuous, from lengths alone. The step-time model: an iteration costs
``t = a + c * rows + p * tokens``, where ``rows`` counts one-token rows (decodes, and the
padding rows static batching computes anyway) and ``tokens`` counts the tokens of longer
rows (prompt chunks); ``fit_step_model`` fits ``a, c, p`` by least squares to the
iterations measured in the run. Both schedules are then replayed on paper from the
workload's lengths (the same rules as minicb's schedulers, with room in the KV pool for
everyone), summing the modelled step times. The limit case, for the docs: with output
lengths exponential of mean m, steps that cost the same whatever the batch (``c = p = 0``)
and many requests, a static batch of B lasts as long as its longest member, E[max] =
m * H_B (H_B = 1 + 1/2 + ... + 1/B), while continuous batching keeps all B slots busy: the
ratio tends to H_B.

The decode roofline of this machine is minicb.bench.roofline's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

import numpy as np

from minicb.bench.roofline import decode_steps
from minicb.config import EngineConfig, SamplingParams
from minicb.engine import LLMEngine
from minicb.runner.fake import FakeRunner
from minicb.scheduler.block_manager import blocks_needed
from minicb.telemetry.metrics import distribution


# ---- static vs continuous ------------------------------------------------------------------
@dataclass(frozen=True)
class StepModel:
    a: float  # seconds per iteration
    c: float  # seconds per one-token row
    p: float  # seconds per token of a longer row (prompt chunk)
    r2: float  # share of the variance of step times the model explains
    num_steps: int

    def step_time(self, rows: int, tokens: int) -> float:
        return self.a + self.c * rows + self.p * tokens

    def chunks_time(self, chunks: list[int]) -> float:
        """An iteration whose rows take ``chunks`` tokens each (counted as in ``step_row``)."""
        return self.step_time(sum(n == 1 for n in chunks), sum(n for n in chunks if n > 1))

    def to_dict(self) -> dict[str, float]:
        return {"a_s": self.a, "c_s": self.c, "p_s": self.p, "r2": self.r2, "steps": self.num_steps}


def fit_step_model(steps: list[dict[str, float]]) -> StepModel:
    """Least squares of ``dt`` on (1, decode_rows, prefill_tokens) over step rows."""
    if len(steps) < 3:
        raise ValueError(f"need at least 3 steps to fit the step-time model, got {len(steps)}")
    x = np.array([[1.0, s["decode_rows"], s["prefill_tokens"]] for s in steps])
    y = np.array([s["dt"] for s in steps])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    return StepModel(float(coef[0]), float(coef[1]), float(coef[2]), r2, len(steps))


def simulate_static(
    prompts: list[int], outputs: list[int], batch: int, budget: int, model: StepModel
) -> float:
    """Batches of ``batch`` in order: prefill, then max(output) - 1 lockstep decode steps."""
    total = 0.0
    for b in range(0, len(prompts), batch):
        members = [
            [p, o] for p, o in zip(prompts[b : b + batch], outputs[b : b + batch], strict=True)
        ]
        while any(r[0] for r in members):  # prompts in order under the budget, chunked
            chunks, room = [], budget
            for r in members:
                if r[0] and room:
                    room -= _advance(r, room, chunks)
            total += model.chunks_time(chunks)
        # The first token ended prefill; finished members decode on as padding rows.
        total += max(r[1] for r in members) * model.step_time(len(members), 0)
    return total


def simulate_continuous(
    prompts: list[int], outputs: list[int], slots: int, budget: int, model: StepModel
) -> float:
    """Iteration-level scheduling: decodes first, then prompt chunks, then admissions."""
    waiting = deque(zip(prompts, outputs, strict=True))
    running: list[list[int]] = []
    total = 0.0
    while waiting or running:
        chunks, room = [], budget
        for r in sorted(running, key=lambda r: r[0] > 0):  # decodes first (a stable sort)
            if room:
                room -= _advance(r, room, chunks)
        while waiting and len(running) < slots and room:
            running.append(list(waiting.popleft()))
            room -= _advance(running[-1], room, chunks)
        total += model.chunks_time(chunks)
        running = [r for r in running if r[1] > 0]
    return total


def _advance(r: list[int], room: int, chunks: list[int]) -> int:
    """One iteration of one request, ``[prompt tokens left, output tokens left]``: a prompt
    chunk or a decode, appended to ``chunks``. Returns the tokens it takes."""
    take = min(r[0], room) if r[0] else 1
    chunks.append(take)
    if r[0]:
        r[0] -= take
    if r[0] == 0:  # a decode, or the prompt's last chunk: a token is sampled in this step
        r[1] -= 1
    return take


def harmonic(n: int) -> float:
    return sum(1.0 / k for k in range(1, n + 1))


def predict(
    prompts: list[int], outputs: list[int], slots: int, budget: int, model: StepModel
) -> dict[str, float]:
    """Predicted runtimes and the continuous-over-static throughput ratio."""
    static = simulate_static(prompts, outputs, slots, budget, model)
    continuous = simulate_continuous(prompts, outputs, slots, budget, model)
    return {
        "static_s": static,
        "continuous_s": continuous,
        "ratio": static / continuous if continuous > 0 else float("nan"),
        "harmonic_B": harmonic(slots),
    }


# ---- what the scheduler costs ------------------------------------------------------------
def time_schedule(
    num_running: int,
    iterations: int = 200,
    batching: str = "continuous",
    prompt_len: int = 16,
    block_size: int = 16,
) -> dict[str, float]:
    """Seconds per ``schedule()`` with ``num_running`` requests decoding: median, mean, p90.

    The real engine over a FakeRunner (no model, no torch; nobody stops while measured):
    requests are admitted and prefilled until all are decoding, then each step event's
    ``schedule_s`` is read. The engine times ``schedule()`` alone, so the rest of its step
    (the runner, token bookkeeping, stop checks) stays out of the figure."""
    budget = 512
    prefill_steps = -(-num_running * prompt_len // budget) + 1
    max_tokens = iterations + prefill_steps + 8  # nobody finishes while we measure
    blocks = num_running * blocks_needed(prompt_len + max_tokens, block_size)
    config = EngineConfig(
        batching=batching, max_num_seqs=num_running, block_size=block_size, num_kv_blocks=blocks,
        max_num_batched_tokens=max(budget, num_running), num_swap_blocks=0,
    )  # fmt: skip
    runner = FakeRunner(blocks, max_model_len=prompt_len + max_tokens + 1, num_swap_blocks=0)
    engine = LLMEngine(config=config, runner=runner)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_running):
        engine.add_request([5] * prompt_len, params, arrival_time=float(i))
    times = [e.schedule_s for e in islice(decode_steps(engine, num_running), iterations)]
    if len(times) < iterations:
        raise RuntimeError(f"only {len(times)} steps had all {num_running} requests decoding")
    d = distribution(times)
    return {"num_running": num_running, "batching": batching, "iterations": iterations,
            "median_s": d["p50"], "mean_s": d["mean"], "p90_s": d["p90"]}  # fmt: skip
