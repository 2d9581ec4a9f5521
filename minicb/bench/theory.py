"""What the figures should be: theory for static against continuous batching, the decode
roofline of this machine, and what ``schedule()`` costs on its own.

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

The roofline. A decode step of batch B must at least read every weight once and each
request's KV cache, and do two FLOPs per weight per row plus the attention arithmetic:

    bytes(B) = weight bytes + sum over rows of KV bytes (context tokens x 2 x layers x
               kv heads x head dim x element size)
    flops(B) = 2 x (weights used by matmuls) x B + 4 x layers x heads x head dim x context
    t_min(B) = max(bytes(B) / copy bandwidth, flops(B) / matmul FLOP/s)

The ceiling is B / t_min(B) tokens per second. The bytes and FLOPs are the step-time model's
(``ModelShape.step_work``, minicb/runner/step_time.py: counted from the model's config, the
norms left out) for B one-token rows. Copy bandwidth (read + write bytes of one large
``copy_``, as STREAM counts it) and matmul FLOP/s (a square matmul in the engine's dtype,
sized so that one product takes about ``probes.PROBE_S``) are measured with torch on the
engine's device (minicb.runner.probes), with the benchmark's threads, in the same run.
Beside them, the model's own linear layers run back to back on B rows (``time_linears``):
how close the matmul library itself comes to the ceiling, so a report can tell the part of
a gap that is the engine's from the part no engine on that library can close.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from minicb.bench.hf_padded import generate_times
from minicb.config import EngineConfig, SamplingParams
from minicb.engine import LLMEngine
from minicb.runner import probes
from minicb.runner.fake import FakeRunner
from minicb.runner.step_time import ModelShape
from minicb.scheduler.block_manager import blocks_needed
from minicb.scheduler.plan import DECODE
from minicb.telemetry.events import StepEvent
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


# ---- the roofline --------------------------------------------------------------------------
# The probes (copy bandwidth, matmul FLOP/s) live in minicb.runner.probes, shared with the model
# runner's per-step utilisation; the bytes and FLOPs are the step-time model's.
def model_sizes(shape: ModelShape, elem: int) -> dict[str, int]:
    """Bytes of weights a decode step streams (the layers and the lm_head: an untied
    embedding table is only gathered), matmul parameters per token, KV bytes per token,
    counted from the model's config as the step-time model counts them."""
    return {
        "weight_bytes": shape.streamed_params * elem,
        "matmul_params": shape.streamed_params,
        "kv_bytes_per_token": shape.kv_bytes_per_token(elem),
    }


def decode_cost(shape: ModelShape, elem: int, batch: int, context: float) -> tuple[float, float]:
    """(bytes, flops) of one decode step of ``batch`` rows with ``context`` tokens each:
    the step-time model's work of ``batch`` one-token rows that sample, each attending its
    ``context`` keys (``attended_pairs(1, c) == c``)."""
    total = batch * context
    return shape.step_work(elem, batch, batch, total, total)


def ceiling(nbytes: float, flops: float, bandwidth: float, peak: float) -> tuple[float, str]:
    """Least seconds per step, and which limit sets it."""
    t_mem, t_flop = nbytes / bandwidth, flops / peak
    return (t_mem, "memory") if t_mem >= t_flop else (t_flop, "compute")


def decode_prompts(batch: int, prompt_len: int) -> list[list[int]]:
    """The decode probe's prompts, the same for minicb and transformers."""
    return [[3 + (7 * i + j) % 200 for j in range(prompt_len)] for i in range(batch)]


def _decode_steps(engine: LLMEngine, batch: int) -> Iterator[StepEvent]:
    """Step until every request is done, yielding the steps in which ``batch`` rows all
    decode (prefill steps and partly filled batches are left out)."""
    while engine.has_unfinished():
        event = engine.step().event
        rows = event.plan.scheduled
        if len(rows) == batch and all(r.phase == DECODE for r in rows):
            yield event


def time_decode(
    engine: LLMEngine, batch: int, prompt_len: int, warm: int, steps: int
) -> dict[str, float]:
    """Median wall and forward time of pure decode steps with ``batch`` requests running."""
    params = SamplingParams(max_tokens=1 + warm + steps, temperature=0.0, ignore_eos=True)
    for prompt in decode_prompts(batch, prompt_len):
        engine.add_request(prompt, params)
    events = list(_decode_steps(engine, batch))[warm:]
    if not events:
        raise RuntimeError(f"no pure decode step of batch {batch} was seen")
    return {
        "step_s": statistics.median(e.wall_end - e.wall_start for e in events),
        "forward_s": statistics.median(e.forward_s for e in events),
        "context": statistics.fmean(r.context_len for e in events for r in e.plan.scheduled),
    }


def time_linears(model: Any, batch: int, repeats: int = 3) -> float:
    """Median seconds of every linear layer of ``model`` run once, in forward order, back to
    back on ``batch`` rows of random input: a decode step's matrix products with nothing
    between them, streamed as fast as the matmul library (oneDNN, MKL, cuBLAS) streams the
    weights. What it cannot reach of the ceiling is the library's; what a step adds to it
    is the engine's (attention, norms, rope, the sampler, Python)."""
    import torch  # here, not above: the simulated runner imports this module without torch
    from torch import nn

    from minicb.runner.packed import PackedLinear

    linears = [m for m in model.modules() if isinstance(m, nn.Linear | PackedLinear)]
    w = linears[0].weight
    inputs = {
        n: torch.randn(batch, n, device=w.device).to(w.dtype)
        for n in {m.weight.shape[1] for m in linears}
    }
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first is a warm-up
            probes.sync(w.device)
            start = time.perf_counter()
            for m in linears:
                m(inputs[m.weight.shape[1]])
            probes.sync(w.device)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def time_hf_decode(model: Any, batch: int, prompt_len: int, warm: int, steps: int) -> float:
    """Median seconds per decode step of padded ``generate`` with ``batch`` equal rows."""
    times = generate_times(model, decode_prompts(batch, prompt_len), 1 + warm + steps, 0.0)
    return statistics.median([b - a for a, b in zip(times, times[1:], strict=False)][warm:])


def roofline_point(
    measured: dict[str, float], shape: ModelShape, elem: int, batch: int, hw: dict[str, float]
) -> dict[str, Any]:
    """One batch size: measured tokens/s beside the ceiling, and the fraction reached."""
    nbytes, flops = decode_cost(shape, elem, batch, measured["context"])
    t_min, bound = ceiling(nbytes, flops, hw["copy_bandwidth"], hw["matmul_flops"])
    tok_s = batch / measured["step_s"]
    return {
        "batch": batch,
        **measured,
        "tok_s": tok_s,
        "forward_tok_s": batch / measured["forward_s"],
        "bytes": nbytes,
        "flops": flops,
        "ceiling_tok_s": batch / t_min,
        "bound": bound,
        "fraction": tok_s * t_min / batch,
        "forward_fraction": t_min / measured["forward_s"],
    } | _linears_bound(measured, batch, t_min)


def _linears_bound(measured: dict[str, float], batch: int, t_min: float) -> dict[str, float]:
    """The most this matmul library lets a step reach: tokens/s and the ceiling's fraction of
    the linear layers alone (nothing where they were not timed)."""
    if "linears_s" not in measured:
        return {}
    return {"linears_tok_s": batch / measured["linears_s"],
            "linears_fraction": t_min / measured["linears_s"]}  # fmt: skip


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
    times = [e.schedule_s for e in islice(_decode_steps(engine, num_running), iterations)]
    if len(times) < iterations:
        raise RuntimeError(f"only {len(times)} steps had all {num_running} requests decoding")
    d = distribution(times)
    return {"num_running": num_running, "batching": batching, "iterations": iterations,
            "median_s": d["p50"], "mean_s": d["mean"], "p90_s": d["p90"]}  # fmt: skip
