"""The hardware limit for decode, measured on this machine, and how close minicb gets.

A decode step of batch B must at least read every weight once and each request's KV
cache, and do two FLOPs per weight per row plus the attention arithmetic:

    bytes(B) = weight bytes + sum over rows of KV bytes (context tokens x 2 x layers x
               kv heads x head dim x element size)
    flops(B) = 2 x (weights used by matmuls) x B + 4 x layers x heads x head dim x context
    t_min(B) = max(bytes(B) / copy bandwidth, flops(B) / matmul FLOP/s)

The ceiling is B / t_min(B) tokens per second. Copy bandwidth (read + write bytes of one
large ``copy_``, as STREAM counts it) and matmul FLOP/s (a square matmul in the engine's
dtype) are measured with torch, with the benchmark's threads, in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from minicb.config import SamplingParams


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: first-touch page faults, allocator
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of ``dst.copy_(src)`` over ``nbytes``, read plus write, best run."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), repeats)


def measure_matmul_flops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype``, best run."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return 2 * n**3 / _best_time(lambda: a @ b, repeats)


def model_sizes(model: torch.nn.Module, cfg: Any, elem: int) -> dict[str, int]:
    """Bytes of weights a decode step streams, and matmul parameters per token."""
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    total = sum(p.numel() for p in params)
    embed = cfg.vocab_size * cfg.hidden_size
    # An untied embedding table is only gathered (B rows); a tied one is read whole by lm_head.
    streamed = total if cfg.tie_word_embeddings else total - embed
    return {
        "weight_bytes": streamed * elem,
        "matmul_params": total - (0 if cfg.tie_word_embeddings else embed),
        "kv_bytes_per_token": 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem,
    }


def decode_cost(sizes: dict[str, int], cfg: Any, batch: int, context: float) -> tuple[float, float]:
    """(bytes, flops) of one decode step of ``batch`` rows with ``context`` tokens each."""
    nbytes = sizes["weight_bytes"] + batch * context * sizes["kv_bytes_per_token"]
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    flops = batch * (2 * sizes["matmul_params"] + attn)
    return nbytes, flops


def ceiling(nbytes: float, flops: float, bandwidth: float, peak: float) -> tuple[float, str]:
    """Least seconds per step, and which limit sets it."""
    t_mem, t_flop = nbytes / bandwidth, flops / peak
    return (t_mem, "memory") if t_mem >= t_flop else (t_flop, "compute")


def time_decode(
    engine: Any, batch: int, prompt_len: int, warm: int, steps: int
) -> dict[str, float]:
    """Median wall and forward time of pure decode steps with ``batch`` requests running."""
    params = SamplingParams(max_tokens=1 + warm + steps, temperature=0.0, ignore_eos=True)
    for i in range(batch):  # the same prompts as hf_padded.time_hf_decode
        engine.add_request([3 + (7 * i + j) % 200 for j in range(prompt_len)], params)
    walls, forwards, contexts = [], [], []
    done_warm = 0
    while engine.has_unfinished():
        result = engine.step()
        rows = result.plan.scheduled
        if len(rows) != batch or any(r.phase != "decode" for r in rows):
            continue  # prefill steps, or a partly filled batch
        if done_warm < warm:
            done_warm += 1
            continue
        walls.append(result.wall_end - result.wall_start)
        forwards.append(result.forward_s)
        contexts.append(statistics.fmean(r.context_len for r in rows))
    if not walls:
        raise RuntimeError(f"no pure decode step of batch {batch} was seen")
    return {
        "step_s": statistics.median(walls),
        "forward_s": statistics.median(forwards),
        "context": statistics.fmean(contexts),
    }


def roofline_point(
    measured: dict[str, float], sizes: dict[str, int], cfg: Any, batch: int, hw: dict[str, float]
) -> dict[str, Any]:
    """One batch size: measured tokens/s beside the ceiling, and the fraction reached."""
    nbytes, flops = decode_cost(sizes, cfg, batch, measured["context"])
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
    }
