"""The decode roofline of this machine: what a decode step of batch B costs at least, how
close minicb's step comes, and how close the model's matmuls alone come.

A decode step of batch B must at least read every weight once and each
request's KV cache, and do two FLOPs per weight per row plus the attention arithmetic:

    bytes(B) = weight bytes + sum over rows of KV bytes (context tokens x 2 x layers x
               kv heads x head dim x element size)
    flops(B) = 2 x (weights used by matmuls) x B + 4 x layers x heads x head dim x context
    t_min(B) = max(bytes(B) / copy bandwidth, flops(B) / matmul FLOP/s)

The ceiling is B / t_min(B) tokens per second. The bytes and FLOPs are the step-time model's
(``ModelShape.step_work``, minicb/cost_model/step_time.py: counted from the model's config, the
norms left out) for B one-token rows. Copy bandwidth (read + write bytes of one large
``copy_``, as STREAM counts it) and matmul FLOP/s (a square matmul in the engine's dtype,
sized so that one product takes about ``probes.PROBE_S``) are measured with torch on the
engine's device (minicb.utilisation.probes), with the benchmark's threads, in the same run.
Beside them, the model's own linear layers run back to back on B rows (``time_linears``),
through the step's own kernels: how close the products alone come to the ceiling, so a
report can tell the part of a gap that is the engine's from the part no step on those
kernels can close.

The performance lab's: ``minicb bench`` runs ``decode_roofline`` as its roofline section
where this folder sits beside the package (minicb.bench.performance_lab), and says where
it is not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minicb.bench import decode_steps
from minicb.bench.systems import sibling
from minicb.bench.transformers_systems import generate_times
from minicb.core.config import SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.cost_model.step_time import ModelShape
from minicb.utilisation import probes

if TYPE_CHECKING:
    from minicb.bench.measurements import Suite


# The probes (copy bandwidth, matmul FLOP/s) live in minicb/utilisation/probes.py, shared with
# the model runner's per-step utilisation; the bytes and FLOPs are the step-time model's.
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


def time_decode(
    engine: LLMEngine, batch: int, prompt_len: int, warm: int, steps: int
) -> dict[str, float]:
    """Median wall and forward time of pure decode steps with ``batch`` requests running."""
    params = SamplingParams(max_tokens=1 + warm + steps, temperature=0.0, ignore_eos=True)
    for prompt in decode_prompts(batch, prompt_len):
        engine.add_request(prompt, params)
    events = list(decode_steps(engine, batch))[warm:]
    if not events:
        raise RuntimeError(f"no pure decode step of batch {batch} was seen")
    return {
        "step_s": statistics.median(e.wall_end - e.wall_start for e in events),
        "forward_s": statistics.median(e.forward_s for e in events),
        "context": statistics.fmean(r.context_len for e in events for r in e.plan.scheduled),
    }


def linear_layers(model: Any) -> list[Any]:
    """The model's linear layers (plain or packed), in forward order."""
    from torch import nn

    from minicb.packing.packed import PackedLinear

    return [m for m in model.modules() if isinstance(m, nn.Linear | PackedLinear)]


# The products of a step: one (rows, width) input per layer width in, each layer's output out.
Products = Callable[[dict[int, Any]], list[Any]]


def eager_products(model: Any) -> Products:
    """The model's linear layers run eager, in forward order: ATen's products."""
    linears = linear_layers(model)
    return lambda inputs: [m(inputs[m.weight.shape[1]]) for m in linears]


def product_inputs(model: Any, rows: int) -> dict[int, Any]:
    """Random (rows, width) inputs, one per width the model's linear layers take, in its
    dtype and on its device."""
    import torch

    w = model.lm_head.weight
    widths = {m.weight.shape[1] for m in linear_layers(model)}
    return {n: torch.randn(rows, n, device=w.device).to(w.dtype) for n in widths}


def time_linears(
    model: Any, batch: int, repeats: int = 3, products: Products | None = None
) -> float:
    """Median seconds of every linear layer of ``model`` run once, in forward order, back to
    back on ``batch`` rows of random input: a decode step's matrix products with nothing
    between them, streamed as fast as the step's own matmul kernels stream the weights
    (``products``: eager ATen's, oneDNN, MKL or cuBLAS, by default; the compiled step's
    from ``perflab.compiled.CompiledDecode.products_alone``). What it cannot reach of the
    ceiling is the kernels'; what a step adds to it is the engine's (attention, norms, rope,
    the sampler, Python)."""
    import torch

    run, device = products or eager_products(model), model.lm_head.weight.device
    inputs = product_inputs(model, batch)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first is a warm-up
            probes.sync(device)
            start = time.perf_counter()
            run(inputs)
            probes.sync(device)
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


def step_products(engine: LLMEngine) -> Products | None:
    """The products alone through the engine's step's own kernels: the compiled step's
    (perflab.compiled) when its runner compiles, else None (eager ATen's)."""
    from perflab.compiled import CompiledRunner  # torch.compile only when asked for

    runner = engine.runner
    if not isinstance(runner, CompiledRunner) or runner.decode is None:
        return None
    return runner.decode.products_alone(linear_layers(runner.model))


def decode_roofline(suite: Suite, hw: dict[str, Any]) -> dict[str, Any]:
    """``minicb bench``'s roofline section: pure decode steps at each batch size, minicb and
    padded generate alternating, and the model's linear layers alone on as many rows (the
    matmul library's bound); each figure is the median over the rounds of each round's
    median step. Measures ``hw`` again afterwards (``suite.hardware``)."""
    p = suite.plan
    top, args = max(p.decode_batches), (p.decode_prompt, p.decode_warm, p.decode_steps)
    per_req = blocks_needed(sum(args) + 2, p.block_size)
    engine = sibling(suite.systems.continuous, max_num_seqs=top, num_kv_blocks=top * per_req + 1)
    hf = suite.systems.hf_model if "hf-padded" in p.systems else None
    model, products = engine.runner.model, step_products(engine)  # the lab's reach-in
    ours: dict[int, list[dict[str, float]]] = {b: [] for b in p.decode_batches}
    linears: dict[int, list[float]] = {b: [] for b in p.decode_batches}
    theirs: dict[int, list[float]] = {b: [] for b in p.decode_batches}
    batches = list(p.decode_batches)
    for r in range(p.decode_rounds):
        k = r % len(batches)
        for b in batches[k:] + batches[:k]:
            suite.tick(f"decode at batch {b}, round {r + 1}/{p.decode_rounds}")
            ours[b].append(time_decode(engine, b, *args))
            linears[b].append(time_linears(model, b, products=products))
            if hf is not None:  # transformers' padded generate, same prompts and steps
                try:
                    theirs[b].append(time_hf_decode(hf, b, *args))
                except Exception:  # its column stays empty; the workloads say why
                    hf = None
            suite.bar.update()
    suite.hardware(hw)
    shape, elem = suite.model_shape(), engine.runner.dtype.itemsize
    points = []
    for b, rounds in ours.items():
        steps = [m["step_s"] for m in rounds]
        measured = {"step_s": statistics.median(steps), "step_s_min": min(steps),
                    "step_s_max": max(steps),
                    "forward_s": statistics.median(m["forward_s"] for m in rounds),
                    "context": statistics.fmean(m["context"] for m in rounds),
                    "linears_s": statistics.median(linears[b])}  # fmt: skip
        point = roofline_point(measured, shape, elem, b, hw)
        if theirs[b]:
            point["hf_step_s"] = statistics.median(theirs[b])
            point["hf_tok_s"] = b / point["hf_step_s"]
        points.append(point)
    sizes = model_sizes(shape, elem)
    return {"sizes": sizes, "prompt_len": p.decode_prompt, "points": points}
