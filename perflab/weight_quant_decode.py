"""8-bit weights against full-precision ones: decode steps in CPU time, same run, same ceiling.

A decode step reads every weight once whatever the batch, so at batch 1 its time should
follow the weights' bytes: int8 (minicb/quant/weights.py) streams a quarter of fp32's for the
decoder's linears (the tied LM head stays in the compute dtype). This script builds one
engine per (dtype, weight_dtype) on the embedded default model, times pure decode steps at
each batch with perflab.decode_cpu_time's probe (CPU time of the thread, so a busy shared
machine's waits drop out), rounds alternating between the engines, and prints per point the
step time, its ratio to the same dtype's full-precision weights (``vs_full_weights``) and to
the first dtype's (``vs_first_dtype``: fp32, bf16 and int8 weights against fp32 in one run),
and the fraction of the
roofline ceiling, which for int8 counts the linears at one byte per weight (plus scales), and
which product the int8 layers used here (``weights.INT8_KERNEL``: torch's kernel on AVX-512,
dequantise-then-matmul elsewhere, where int8 cannot beat the full-precision product).

    python -m perflab.weight_quant_decode [--dtypes float32 bfloat16] [--batches 1 32] [--rounds 3]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from minicb.cost_model.catalogue import model_shape
from minicb.quant import weights
from minicb.quant.weights import Int8Linear
from minicb.utilisation import probes
from perflab import roofline
from perflab.decode_cpu_time import copy_bandwidth, decode_round, matmul_flops, probe_engine


def int8_saving(model: torch.nn.Module, elem: int) -> int:
    """Bytes a step no longer streams: the int8 linears' weights at one byte instead of
    ``elem``, less their scales."""
    saved = 0
    for m in model.modules():
        if isinstance(m, Int8Linear):
            saved += m.weight_int8.numel() * (elem - 1) - m.scales.nbytes
    return saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    top = max(args.batches)
    engines = {
        (dtype, w): probe_engine(dtype, top, weight_dtype=w)
        for dtype in args.dtypes
        for w in ("auto", "int8")
    }
    for engine in engines.values():
        decode_round(engine, top)  # warm-up
    rounds: dict = {(key, b): [] for key in engines for b in args.batches}
    for _ in range(args.rounds):  # alternate, so drifts in the machine's load hit all alike
        for key, engine in engines.items():
            for b in args.batches:
                rounds[key, b].append(decode_round(engine, b))

    runner = next(iter(engines.values())).runner
    shape = model_shape(runner.model_path)
    path = "torch int8 kernel" if weights.INT8_KERNEL else "dequantise then F.linear"
    out: dict = {"int8_path": path, "cpu": torch.backends.cpu.get_cpu_capability(), "points": []}
    first = {
        b: statistics.median(r[0] for r in rounds[(args.dtypes[0], "auto"), b])
        for b in args.batches
    }
    for dtype in args.dtypes:
        elem = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        bw, _ = copy_bandwidth(probes.copy_bytes(roofline.model_sizes(shape, elem)["weight_bytes"]))
        peak, _ = matmul_flops(getattr(torch, dtype), probes.matmul_size(getattr(torch, dtype)))
        out[f"copy_GBps_cpu_{dtype}"], out[f"matmul_GFLOPs_cpu_{dtype}"] = bw / 1e9, peak / 1e9
        for b in args.batches:
            base = statistics.median(r[0] for r in rounds[(dtype, "auto"), b])
            for w in ("auto", "int8"):
                rs = rounds[(dtype, w), b]
                cpu = statistics.median(r[0] for r in rs)
                nb, fl = roofline.decode_cost(shape, elem, b, statistics.fmean(r[2] for r in rs))
                nb -= int8_saving(engines[dtype, w].runner.model, elem)
                t_min, bound = roofline.ceiling(nb, fl, bw, peak)
                out["points"].append({"dtype": dtype, "weight_dtype": w, "batch": b,
                                      "step_ms_cpu": cpu * 1e3, "vs_full_weights": cpu / base,
                                      "vs_first_dtype": cpu / first[b],
                                      "streamed_MB": nb / 1e6, "fraction_cpu": t_min / cpu,
                                      "bound": bound})  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
