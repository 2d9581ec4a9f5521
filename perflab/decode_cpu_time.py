"""Decode steps against the roofline in CPU time: a figure a busy shared machine leaves alone.

``minicb bench`` times decode steps by the wall clock, which on a 2-core machine shared
with other work also counts the time the benchmark waited for a core. This script runs the
same decode probe (perflab.roofline: the same prompts, the same ceiling formulas) and
reads both clocks: wall, and the thread's CPU time (``time.thread_time``), for the decode
steps and for the copy-bandwidth and matmul probes alike. The fraction of the ceiling by
CPU time is then t_min by CPU time / step CPU time; waiting for a core drops out of both.
Contention for memory bandwidth does not: run before/after pairs alternately.

    python -m perflab.decode_cpu_time --dtype bfloat16 [--batches 1 32]
        [--rounds 3] [--no-packed-weights] [--compile on]

Prints one JSON line: per batch, step CPU and wall milliseconds (median over rounds of each
round's median step), both fractions of the ceiling, and which limit sets it (by CPU time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from minicb import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.scheduler.plan import DECODE
from minicb.cost_model.catalogue import model_shape
from minicb.utilisation import probes
from perflab import roofline
from perflab.compiled import compiled_engine

PROMPT, WARM, STEPS = 32, 2, 8


def decode_round(engine: LLMEngine, batch: int) -> tuple[float, float, float]:
    """Median CPU and wall seconds of the pure decode steps, and the mean context."""
    params = SamplingParams(max_tokens=1 + WARM + STEPS, temperature=0.0, ignore_eos=True)
    for prompt in roofline.decode_prompts(batch, PROMPT):
        engine.add_request(prompt, params)
    cpu, wall, context = [], [], []
    while engine.has_unfinished():
        c0, w0 = time.thread_time(), time.perf_counter()
        rows = engine.step().event.plan.scheduled
        c1, w1 = time.thread_time(), time.perf_counter()
        if len(rows) == batch and all(r.phase == DECODE for r in rows):
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
            context.append(statistics.fmean(r.context_len for r in rows))
    return statistics.median(cpu[WARM:]), statistics.median(wall[WARM:]), statistics.fmean(context)


def copy_bandwidth(nbytes: int, repeats: int = 5) -> tuple[float, float]:
    """Bytes (read + write) per CPU second and per wall second of one large copy, best run."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        c0, w0 = time.thread_time(), time.perf_counter()
        dst.copy_(src)
        best_cpu = min(best_cpu, time.thread_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return 2 * nbytes / best_cpu, 2 * nbytes / best_wall


def matmul_flops(dtype: torch.dtype, n: int, repeats: int = 5) -> tuple[float, float]:
    """FLOP/s of an n-cubed matmul per CPU second and per wall second, best run."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        c0, w0 = time.thread_time(), time.perf_counter()
        a @ b
        best_cpu = min(best_cpu, time.thread_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return 2 * n**3 / best_cpu, 2 * n**3 / best_wall


def probe_engine(dtype: str, widest: int, compile: str = "off", **options) -> LLMEngine:
    """An engine on the embedded default model with room for the probe's widest batch;
    ``compile="on"``: on the lab's compiled runner (perflab.compiled)."""
    config = EngineConfig.from_kwargs(
        dtype=dtype, device="cpu", max_num_seqs=widest, num_kv_blocks=widest * 4 + 1,
        num_swap_blocks=0, **options,
    )  # fmt: skip
    if compile == "on":
        return compiled_engine(None, config)
    return LLMEngine(None, config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-packed-weights", action="store_true")
    p.add_argument("--compile", default=None, choices=["off", "on"])
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    options = {"packed_weights": False} if args.no_packed_weights else {}
    if args.compile:
        options["compile"] = args.compile
    top = max(args.batches)
    engine = probe_engine(args.dtype, top, **options)
    runner = engine.runner
    shape, elem = model_shape(runner.model_path), runner.dtype.itemsize
    decode_round(engine, top)  # warm-up (and compilation, if any)
    rounds = {b: [decode_round(engine, b) for _ in range(args.rounds)] for b in args.batches}
    bw_cpu, bw_wall = copy_bandwidth(
        probes.copy_bytes(roofline.model_sizes(shape, elem)["weight_bytes"])
    )
    flops_cpu, flops_wall = matmul_flops(runner.dtype, probes.matmul_size(runner.dtype))
    out = {"dtype": args.dtype, "options": options, "describe": runner.describe(),
           "copy_GBps_cpu": bw_cpu / 1e9, "copy_GBps_wall": bw_wall / 1e9,
           "matmul_GFLOPs_cpu": flops_cpu / 1e9, "matmul_GFLOPs_wall": flops_wall / 1e9,
           "points": []}  # fmt: skip
    for b, rs in rounds.items():
        cpu = statistics.median(r[0] for r in rs)
        wall = statistics.median(r[1] for r in rs)
        context = statistics.fmean(r[2] for r in rs)
        nb, fl = roofline.decode_cost(shape, elem, b, context)
        t_cpu, bound = roofline.ceiling(nb, fl, bw_cpu, flops_cpu)
        t_wall, _ = roofline.ceiling(nb, fl, bw_wall, flops_wall)
        out["points"].append({"batch": b, "step_ms_cpu": cpu * 1e3, "step_ms_wall": wall * 1e3,
                              "fraction_cpu": t_cpu / cpu, "fraction_wall": t_wall / wall,
                              "bound": bound})  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
