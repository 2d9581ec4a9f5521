"""CPU time of one ``sample()`` call: this tree's sampler against another tree's.

    python -m perflab.sampler_cpu_time OTHER_TREE/minicb/core/runner/sampler.py

Random fp32 logits of 49152 columns (SmolLM2's vocabulary), 8 and 32 rows, temperature
sampling, top-k + top-p, and greedy; thread CPU time, mean of 20 calls after one warm-up.
Prints one line per case with both times and their ratio.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import torch

from minicb import SamplingParams
from minicb.core.runner import sampler as this

CASES = [
    (8, SamplingParams(temperature=0.6)),
    (32, SamplingParams(temperature=0.6)),
    (32, SamplingParams(temperature=0.8, top_k=50, top_p=0.9)),
    (32, SamplingParams(temperature=0.0)),
]


def cpu_ms(sample, args: tuple, calls: int = 20) -> float:
    sample(*args)
    start = time.thread_time()
    for _ in range(calls):
        sample(*args)
    return (time.thread_time() - start) / calls * 1e3


def main() -> None:
    spec = importlib.util.spec_from_file_location("other_sampler", sys.argv[1])
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    torch.set_num_threads(1)
    for rows, params in CASES:
        logits = torch.randn(rows, 49152)
        gen = torch.Generator().manual_seed(0)
        args = (logits, [params] * rows, [0] * rows, gen)
        before, after = cpu_ms(other.sample, args), cpu_ms(this.sample, args)
        print(f"{rows} rows, temperature {params.temperature}, top_k {params.top_k}, "
              f"top_p {params.top_p}: other {before:.2f} ms, this {after:.2f} ms, "
              f"ratio {before / after:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
