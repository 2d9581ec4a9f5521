"""CPU time of the default model's linear layers, packed by oneDNN for different row counts.

``torch.ops.mkldnn._reorder_linear_weight(weight, rows)`` lays a bf16 weight out for inputs
of ``rows`` rows; any row count then runs on that layout, some faster than others. This
script packs the model's 211 products (30 layers x q, k, v, o, gate, up, down, and the
lm_head) once per layout and runs them back to back, as a step does, on inputs of several
row counts: one-token decodes of 1 to 32 rows and the 48 rows of 15 decodes beside a
32-token prompt chunk. Thread CPU time, median of 5 runs, one thread; the layouts alternate
within each row count, so a change in the machine's load falls on all of them alike.

    .venv/bin/python -m perflab.packed_layout_cpu_time [--layouts 1 16 32 64 128]
        [--rows 1 8 15 32 48 256]

Prints one JSON line: per row count, milliseconds per layout (minicb.packing.packed uses
``PACKED_FOR_ROWS``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from minicb import EngineConfig
from minicb.core.engine import LLMEngine
from perflab.roofline import linear_layers


def run_ms(packed: list[torch.Tensor], inputs: list[torch.Tensor], repeats: int = 5) -> float:
    def once() -> float:
        start = time.thread_time()
        for x, w in zip(inputs, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return time.thread_time() - start

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", type=int, nargs="+", default=[1, 16, 32, 64, 128])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 15, 32, 48, 256])
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    engine = LLMEngine(None, EngineConfig(dtype="bfloat16", device="cpu", num_kv_blocks=4))
    linears = linear_layers(engine.runner.model)
    weights = [m.weight.detach() for m in linears]
    layouts = {
        n: [torch.ops.mkldnn._reorder_linear_weight(w, n) for w in weights] for n in args.layouts
    }
    out: dict[str, object] = {
        "products": len(weights),
        "weight_mb": sum(w.numel() * 2 for w in weights) / 1e6,
    }
    with torch.inference_mode():
        for rows in args.rows:
            inputs = [torch.randn(rows, w.shape[1]).to(torch.bfloat16) for w in weights]
            out[f"rows {rows}"] = {
                f"for {n}": round(run_ms(pk, inputs), 2) for n, pk in layouts.items()
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
