"""What ``schedule()`` costs on its own: the scheduler's share of a step, timed with no model.

What continuous batching should gain over static batching is predicted elsewhere, by the
schedulers that run: the same requests through the real engine with each scheduler on a
simulated runner (minicb.sim.run.static_vs_continuous, its limit case ``H_B`` beside it;
the bench's prediction is minicb.sim.calibration's, on a ``cpu`` profile of this machine).
"""

from __future__ import annotations

from itertools import islice

from minicb.bench.driver import decode_steps
from minicb.config import EngineConfig, SamplingParams
from minicb.engine import LLMEngine
from minicb.runner.fake import FakeRunner
from minicb.scheduler.block_manager import blocks_needed
from minicb.telemetry.metrics import distribution


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
