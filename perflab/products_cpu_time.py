"""CPU time of the default model's 211 linear layers back to back, by the kernels that run them.

Three ways a decode step can run its products: eager (ATen: oneDNN's packed bf16 products,
MKL's fp32 ones), and compiled as the compiled step compiles them (``CompiledDecode.
products_alone``: freezing, built on one row and on eager's layout) with ATen's products or
with Inductor's own C++ GEMM template (its AMX micro-kernels in bf16). The products run on
inputs of several row counts; the variants alternate within each row count, so a change in
the machine's load falls on all of them alike. Thread CPU time, median of 7 runs, one thread.

    .venv/bin/python -m perflab.products_cpu_time [--dtype bfloat16]
        [--rows 1 2 8 16 32 64 128]

Building the two compiled variants takes one to two minutes each. Prints one JSON line: per
row count, milliseconds per variant, and the weights' bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from minicb import EngineConfig
from minicb.core.engine import LLMEngine
from perflab.compiled import CompiledDecode
from perflab.roofline import eager_products, linear_layers, product_inputs


def run_ms(products, inputs: dict[int, torch.Tensor], repeats: int = 7) -> float:
    def once() -> float:
        start = time.thread_time()
        products(inputs)
        return time.thread_time() - start

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 16, 32, 64, 128])
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    engine = LLMEngine(None, EngineConfig(dtype=args.dtype, device="cpu", num_kv_blocks=4))
    model = engine.runner.model
    linears = linear_layers(model)
    variants = {"eager": eager_products(model)}
    for gemm in ("ATEN", "CPP"):
        compiled = CompiledDecode(model)
        compiled.gemm = gemm  # which kernels Inductor calls, whatever this CPU would get
        start = time.perf_counter()
        variants[f"compiled, {gemm} products"] = compiled.products_alone(linears)
        print(f"built the {gemm} variant in {time.perf_counter() - start:.0f} s", flush=True)
    elem = model.lm_head.weight.element_size()
    out: dict[str, object] = {
        "dtype": args.dtype,
        "products": len(linears),
        "weight_mb": sum(m.weight.numel() for m in linears) * elem / 1e6,
    }
    with torch.inference_mode():
        for rows in args.rows:
            inputs = product_inputs(model, rows)
            out[str(rows)] = {name: round(run_ms(f, inputs), 1) for name, f in variants.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
