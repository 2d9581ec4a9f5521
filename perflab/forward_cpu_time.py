"""Decode-step CPU time of this tree's model code against another tree's, in one process.

    python -m perflab.forward_cpu_time OTHER_TREE/minicb/core/runner/llama.py
        [--dtype bfloat16] [--batches 1 32] [--rounds 8]

On a shared machine two runs of perflab/decode_cpu_time.py move by about 10 % from one to
the next, more than a change of a few percent. Here one engine on the embedded default
model runs that script's decode probe (same prompts, same steps) with its model swapped,
round by round in alternating order, between this tree's ``LlamaModel`` and the other
tree's (``llama.py`` loaded from the path given), both of the same config and filled from
the same checkpoint by this tree's ``build_model.load_weights``, cast and packed alike.
Prints one JSON line: per batch, each model's median step CPU milliseconds and the
per-round ratios other / this (median, min, max; above 1: this tree is faster); the same
for the decoder layers' linear products alone; and the operators one decode step at
batch 1 calls (torch profiler).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

from minicb import SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner.build_model import load_weights, model_config
from minicb.core.runner.loader import iter_safetensors
from minicb.packing.packed import PackedLinear, pack_linears
from perflab import roofline


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def other_model(runner, llama: ModuleType) -> torch.nn.Module:
    """The other tree's model of the runner's checkpoint, in the runner's dtype and layout."""
    hf = runner.files.hf_config
    cfg = model_config(hf)
    model = llama.LlamaModel(cfg, rope=None)
    load_weights(model, iter_safetensors(runner.files.path))
    model = model.to(runner.dtype).eval()
    if isinstance(runner.model.lm_head, PackedLinear):
        pack_linears(model)
    model.rope = llama.RotaryEmbedding(hf, cfg.head_dim, runner.max_model_len)
    return model


def alternate(models: dict, run, rounds: int) -> dict[str, float]:
    """``run(model)`` -> ms for each model, round by round in alternating order after one
    warm-up each: the median of each, and of the per-round ratios other / this (min, max)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        run(model)
    for i in range(rounds):
        for name in ("this", "other") if i % 2 == 0 else ("other", "this"):
            times[name].append(run(models[name]))
    ratios = [o / t for o, t in zip(times["other"], times["this"], strict=True)]
    point = {f"{name}_ms": statistics.median(ts) for name, ts in times.items()}
    return point | {
        "ratio_median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def step_ms(engine: LLMEngine, probe: ModuleType, batch: int, model: torch.nn.Module) -> float:
    """Median CPU ms of the decode probe's pure decode steps with ``model`` in the runner."""
    engine.runner.model = model
    return probe.decode_round(engine, batch)[0] * 1e3


def linears_ms(model: torch.nn.Module, tokens: int) -> float:
    """CPU ms of every linear layer of the decoder layers (not the LM head), in module order,
    on random inputs of ``tokens`` rows: the products alone, without the work around them."""
    layers = [m for m in model.model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    dtype = layers[0].weight.dtype
    inputs = {n: torch.randn(tokens, n).to(dtype) for n in {m.weight.shape[1] for m in layers}}
    with torch.inference_mode():
        start = time.thread_time()
        for m in layers:
            m(inputs[m.weight.shape[1]])
        return (time.thread_time() - start) * 1e3


def ops_per_step(engine: LLMEngine, model: torch.nn.Module) -> dict:
    """Operators called from Python in one decode step at batch 1 (the torch profiler's
    top-level events): how many, and the most frequent."""
    engine.runner.model = model
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request(roofline.decode_prompts(1, 32)[0], params)
    engine.step()  # the prompt
    engine.step()  # a first decode step
    with torch.profiler.profile() as prof:
        engine.step()
    while engine.has_unfinished():
        engine.step()
    events = [e for e in prof.events() if e.cpu_parent is None]
    return {"ops": len(events), "most": Counter(e.name for e in events).most_common(6)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("other", type=Path, help="the other tree's minicb/core/runner/llama.py")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    probe = load_module("decode_cpu_time", Path(__file__).with_name("decode_cpu_time.py"))
    torch.set_num_threads(1)  # as minicb bench does by default
    engine = probe.probe_engine(args.dtype, max(args.batches))
    runner = engine.runner
    models = {"this": runner.model, "other": other_model(runner, load_module("other", args.other))}
    out: dict = {"dtype": args.dtype, "other": str(args.other), "points": []}
    out["ops_per_step_batch_1"] = {name: ops_per_step(engine, m) for name, m in models.items()}

    for batch in args.batches:
        step = alternate(models, partial(step_ms, engine, probe, batch), args.rounds)
        linears = alternate(models, partial(linears_ms, tokens=batch), args.rounds)
        out["points"].append({"batch": batch, "step": step, "linears": linears})
    runner.model = models["this"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
