"""Overlap scheduling, on and off: throughput and the host's and device's lanes, in one run.

For each model (the tiny random Llama, whose iterations are short enough for host time to
matter on a CPU, and the default model), two engines on the same weights, one with
``overlap_scheduling``; one fixed workload (every request generates exactly --max-tokens
tokens) run again and again under each, the two interleaved and alternated so that drift
in the machine's load falls on both alike; medians of the repeats are compared.

The lanes are the step events' own (docs/events.md): the host's seconds (schedule, prepare
inputs, process outputs) and the device's (forward + sample) summed over the run, and the
device's idle share, 1 - device seconds / the run's wall seconds. With overlap the host's
work hides inside the device's, so the idle share is what overlap can recover.

With ``--speculative ngram`` both engines draft (n-gram prompt lookup): a plan that
verifies drafts is waited for before the next is planned (docs/architecture.md), so the
figures say what overlap still recovers beside speculation; the drafted and accepted
tokens per run are printed too.

    python -m perflab.overlap_ab --models tiny default --threads 1 --repeats 5
    python -m perflab.overlap_ab --models tiny --speculative ngram --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minicb import EngineConfig, LLMEngine, SamplingParams
from minicb.core.events import Event, StepEvent
from minicb.tiny_models import make_tiny_model_dir


def engines(model: str | None, dtype: str, requests: int, **spec) -> dict[str, LLMEngine]:
    """Overlap off and on, on one copy of the weights (each engine its own KV cache);
    ``spec``: the speculative decoding settings of both."""
    config = EngineConfig.from_kwargs(dtype=dtype, max_num_seqs=requests, num_kv_blocks=256, **spec)
    off = LLMEngine(model, config)
    on_config = config.with_(overlap_scheduling=True)
    on = LLMEngine(config=on_config, runner=off.runner.with_config(on_config))
    return {"off": off, "on": on}


def prompts(n: int, vocab: int) -> list[list[int]]:
    """Token ids (the tiny model has no tokenizer): varied lengths, 8 to 8 + 4n, fixed."""
    return [[5 + (7 * i + 3 * j) % (vocab - 5) for j in range(8 + 4 * i)] for i in range(n)]


def run_once(engine: LLMEngine, texts: list[list[int]], params: SamplingParams) -> dict:
    steps: list[Event] = []
    listener = engine.bus.subscribe(steps.extend, kinds=["step"])
    start = time.perf_counter()
    for text in texts:
        engine.add_request(text, params)
    outs = engine.run_until_done()
    elapsed = time.perf_counter() - start
    engine.bus.unsubscribe(listener)
    host = sum(e.host_s for e in steps if isinstance(e, StepEvent))
    device = sum(e.device_s for e in steps if isinstance(e, StepEvent))
    return {
        "tok_s": sum(len(o.token_ids) for o in outs) / elapsed,
        "wall_s": elapsed,
        "host_s": host,
        "device_s": device,
        "idle_share": max(0.0, 1 - device / elapsed),
        "steps": len(steps),
        "drafted": sum(e.plan.num_draft_tokens for e in steps if isinstance(e, StepEvent)),
        "accepted": sum(e.plan.num_accepted_tokens for e in steps if isinstance(e, StepEvent)),
    }


def measure(model: str | None, args: argparse.Namespace) -> dict:
    spec = {}
    if args.speculative != "off":
        spec = dict(speculative=args.speculative, num_speculative_tokens=args.num_spec_tokens)
    pair = engines(model, args.dtype, args.requests, **spec)
    texts = prompts(args.requests, pair["off"].runner.vocab_size)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    results: dict[str, list[dict]] = {name: [] for name in pair}
    for engine in pair.values():
        run_once(engine, texts, params)  # warm-up, not counted
    for r in range(args.repeats):
        for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
            results[name].append(run_once(pair[name], texts, params))
    summary = {
        name: {key: statistics.median(x[key] for x in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    summary["ratio_on_off"] = summary["on"]["tok_s"] / summary["off"]["tok_s"]
    summary["model"] = pair["off"].model_name
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", nargs="+", default=["tiny", "default"], help="tiny, default, or a path"
    )
    ap.add_argument("--dtype", default="float32")
    # One torch thread by default: with overlap the host's thread needs a core of its own.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--speculative", default="off", choices=["off", "ngram"])
    ap.add_argument("--num-spec-tokens", type=int, default=4)
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.dtype}, {args.threads} torch threads, {args.requests} requests x "
        f"{args.max_tokens} tokens, {args.repeats} repeats (medians), speculative "
        f"{args.speculative}"
    )
    print(
        f"{'model':<24}{'overlap':>8}{'tok/s':>9}{'steps':>7}{'wall s':>8}{'host s':>8}"
        f"{'device s':>9}{'idle':>7}{'drafted':>9}{'accepted':>9}"
    )
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = {"default": None, "tiny": None}.get(name, name)
            if name == "tiny":
                model = str(make_tiny_model_dir("llama", Path(tmp) / "tiny", seed=0))
            summary = figures[name] = measure(model, args)
            for setting in ("off", "on"):
                s = summary[setting]
                print(
                    f"{name:<24}{setting:>8}{s['tok_s']:>9.1f}{s['steps']:>7.0f}"
                    f"{s['wall_s']:>8.2f}{s['host_s']:>8.2f}{s['device_s']:>9.2f}"
                    f"{s['idle_share'] * 100:>6.0f}%{s['drafted']:>9.0f}{s['accepted']:>9.0f}"
                )
            print(f"{name:<24}{'on/off':>8}{summary['ratio_on_off']:>9.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
