"""The compiled decode step against a variant of itself, in one process, rounds alternating.

Two engines on the embedded default model (bf16 by default), each with its own compiled
step: minicb's, and one variant of it:

- ``--against aten-products``: the graph calls ATen's products (oneDNN) instead of
  Inductor's GEMM template (a second copy of the weights: two models, since a frozen graph
  packs its own);
- ``--against head-outside``: the graph ends at the final norm and the LM head runs eager
  after it (a sibling engine on the same weights).

Each round runs the decode probe of perflab/decode_cpu_time.py at every batch size on both
engines, in alternating order; thread CPU time of a step, median per round. A comparison in
one process, minutes apart at most, is what a shared machine lets one measure: its copy
speed moved by 15 % within an hour while these were taken.

    .venv/bin/python -m perflab.compiled_step_ab --against aten-products
        [--rounds 5] [--batches 1 8 32]

Building the four graphs takes about a quarter of an hour. Prints, per batch size, each
engine's median step and the variant's time over minicb's (median and range over rounds).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minicb.core.engine import LLMEngine
from perflab.compiled import CompiledDecode, CompiledRunner
from perflab.decode_cpu_time import decode_round, probe_engine


class WithoutHead(torch.nn.Module):
    """The model up to its final norm: ``logits`` hands the hidden states on unchanged."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.lm_head = model, model.lm_head

    def forward(self, *args):
        return self.model(*args)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def head_outside(engine: LLMEngine) -> LLMEngine:
    """A sibling whose compiled step stops before the LM head, which then runs eager."""
    model = engine.runner.model
    compiled = CompiledDecode(WithoutHead(model))
    graph_only = compiled.run

    def run_then_head(*args):
        hidden = graph_only(*args)
        return None if hidden is None else model.logits(hidden)

    compiled.run = run_then_head
    inner = engine.runner.inner.with_config(engine.config)  # the same weights, its own KV
    return LLMEngine(config=engine.config, runner=CompiledRunner(inner, compiled))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", required=True, choices=["aten-products", "head-outside"])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    top = max(args.batches)
    minicb = probe_engine(args.dtype, top, compile="on")
    if args.against == "head-outside":
        variant = head_outside(minicb)
    else:
        variant = probe_engine(args.dtype, top, compile="on")
        variant.runner.decode.gemm = "ATEN"
    engines = {"minicb": minicb, args.against: variant}
    for name, engine in engines.items():
        start = time.perf_counter()
        decode_round(engine, top)  # builds both graphs
        print(f"{name}: built in {time.perf_counter() - start:.0f} s", flush=True)
    steps = {name: {b: [] for b in args.batches} for name in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for b in args.batches:
            for name in order:
                steps[name][b].append(decode_round(engines[name], b)[0] * 1e3)
    for b in args.batches:
        ours, theirs = steps["minicb"][b], steps[args.against][b]
        ratios = [t / o for t, o in zip(theirs, ours, strict=True)]
        print(
            f"batch {b}: minicb {statistics.median(ours):.1f} ms, {args.against} "
            f"{statistics.median(theirs):.1f} ms; {args.against} / minicb "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
