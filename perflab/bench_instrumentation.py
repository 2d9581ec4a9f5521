"""What instrumentation costs: engine throughput with events off and on, in the same run.

One engine, one fixed workload (every request generates exactly --max-tokens tokens), run
again and again under each setting, the settings interleaved and rotated so that drift in
the machine's load falls on all of them alike; medians of the repeats are compared.

Settings (subscribers of the engine's one bus, added before a run and removed after it):
  off       nobody subscribed: the engine builds no event at all (as it runs by default)
  idle-bus  one listener for a kind that never comes (resets): the bus is live, yet the
            engine builds nothing for it (must cost nothing)
  metrics   a MetricsCollector
  full      metrics + Prometheus + a JSONL trace writer + an async subscription that is
            never read (its queue full, dropping, the whole time)

Besides end-to-end throughput (noisy on a shared machine), it times the bus's deliveries
themselves (the engine is given a bus that adds up the seconds its ``emit_many`` calls take),
which measures the instrumentation's own share of the run directly.

    python -m perflab.bench_instrumentation --dtype bfloat16 --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from minicb import EngineConfig, LLMEngine, SamplingParams
from minicb.core.bus import EventBus
from minicb.core.events import Event
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.telemetry.trace import TraceWriter, trace_header

MODES = ("off", "idle-bus", "metrics", "full")
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex the jovial boxer".split()


class TimedBus(EventBus):
    """The engine's bus, adding up the seconds its deliveries take (listeners and queues)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def emit_many(self, events: Sequence[Event]) -> None:  # emit() delivers through it too
        t0 = time.perf_counter()
        super().emit_many(events)
        self.seconds += time.perf_counter() - t0


def prompts(n: int) -> list[str]:
    # Varied lengths (8 to 8 + 4n words), fixed across runs.
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8 + 4 * i)) for i in range(n)]


def subscribe(mode: str, engine: LLMEngine, folder: Path) -> list[Any]:
    """Subscribe what ``mode`` asks for to the engine's bus; returns how to undo each."""
    bus = engine.bus
    if mode == "off":
        return []
    if mode == "idle-bus":
        listener = bus.subscribe(lambda event: None, kinds=["reset"])
        return [lambda: bus.unsubscribe(listener)]
    listeners: list[Any] = [MetricsCollector()]
    undo: list[Any] = []
    if mode == "full":
        writer = TraceWriter(folder / "bench.jsonl", trace_header(engine))
        listeners += [PrometheusMetrics(engine.model_name), writer]
        undo += [writer.close, bus.subscribe_async(maxsize=256).close]
    for listener in listeners:
        bus.subscribe(listener)

    def unsubscribe() -> None:  # first: the trace file must not be written to once closed
        for listener in listeners:
            bus.unsubscribe(listener)

    return [unsubscribe, *undo]


def run_once(
    engine: LLMEngine, mode: str, texts: list[str], params: SamplingParams, folder: Path
) -> dict:
    undo = subscribe(mode, engine, folder)
    steps_before, spent_before = engine.step_count, engine.bus.seconds
    start = time.perf_counter()
    for text in texts:
        engine.add_request(text, params)
    outs = engine.run_until_done()
    elapsed = time.perf_counter() - start
    for fn in undo:
        fn()
    tokens = sum(len(o.token_ids) for o in outs)
    spent = engine.bus.seconds - spent_before
    steps = max(1, engine.step_count - steps_before)
    return {
        "tok_s": tokens / elapsed,
        "callback_share": spent / elapsed,
        "callback_us_per_step": spent / steps * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    # One thread by default: on a small machine shared with other work, two torch threads
    # contend with everything else and single steps were seen to stall for seconds.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = EngineConfig(dtype=args.dtype, max_num_seqs=args.requests, num_kv_blocks=256)
    engine = LLMEngine(args.model, config, bus=TimedBus())
    texts = prompts(args.requests)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        run_once(engine, "full", texts, params, Path(tmp))  # warm-up, not counted
        for r in range(args.repeats):
            for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
                results[mode].append(run_once(engine, mode, texts, params, Path(tmp)))
    base = statistics.median(x["tok_s"] for x in results["off"])
    print(
        f"model {engine.model_name}, {args.dtype}, {args.threads} torch threads, "
        f"{args.requests} requests x {args.max_tokens} tokens, {args.repeats} repeats"
    )
    print(
        f"{'setting':<10}{'median tok/s':>14}{'min':>9}{'max':>9}{'vs off':>9}"
        f"{'callbacks':>11}{'us/step':>9}"
    )
    summary = {}
    for mode in MODES:
        tok = [x["tok_s"] for x in results[mode]]
        share = statistics.median(x["callback_share"] for x in results[mode])
        per_step = statistics.median(x["callback_us_per_step"] for x in results[mode])
        med = statistics.median(tok)
        summary[mode] = {
            "median_tok_s": med,
            "vs_off": med / base - 1,
            "callback_share": share,
            "callback_us_per_step": per_step,
            "runs": tok,
        }
        print(
            f"{mode:<10}{med:>14.1f}{min(tok):>9.1f}{max(tok):>9.1f}"
            f"{(med / base - 1) * 100:>+8.1f}%{share * 100:>10.2f}%{per_step:>9.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": summary}, indent=2))


if __name__ == "__main__":
    main()
