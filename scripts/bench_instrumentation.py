"""What instrumentation costs: engine throughput with events off and on, in the same run.

One engine, one fixed workload (every request generates exactly --max-tokens tokens), run
again and again under each setting, the settings interleaved and rotated so that drift in
the machine's load falls on all of them alike; medians of the repeats are compared.

Settings:
  off       no observer at all: the engine as it runs by default
  idle-bus  an EventBus attached that nobody listens to (must cost nothing)
  metrics   the bus feeding a MetricsCollector
  full      metrics + Prometheus + a JSONL trace writer + an async subscription that is
            never read (its queue full, dropping, the whole time)

Besides end-to-end throughput (noisy on a shared machine), it times the observer
callbacks themselves, which measures the instrumentation's own share of the run directly.

    python scripts/bench_instrumentation.py --dtype bfloat16 --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from minicb import LLM, SamplingParams
from minicb.telemetry.bus import EventBus
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.telemetry.trace import TraceWriter, trace_header

MODES = ("off", "idle-bus", "metrics", "full")
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex the jovial boxer".split()


class Timed:
    """Forwards engine callbacks to ``inner`` and adds up the seconds they take."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.steps = 0

    def _call(self, name: str, *args: Any) -> None:
        t0 = time.perf_counter()
        getattr(self.inner, name)(*args)
        self.seconds += time.perf_counter() - t0

    def request_arrived(self, req: Any) -> None:
        self._call("request_arrived", req)

    def step_done(self, result: Any) -> None:
        self.steps += 1
        self._call("step_done", result)


def prompts(n: int) -> list[str]:
    # Varied lengths (8 to 8 + 4n words), fixed across runs.
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8 + 4 * i)) for i in range(n)]


def observers(mode: str, engine: Any, folder: Path) -> tuple[list[Any], list[Any]]:
    """The observers to install for ``mode``, and things to close afterwards."""
    if mode == "off":
        return [], []
    bus = EventBus(block_size=engine.config.block_size)
    closers: list[Any] = []
    if mode in ("metrics", "full"):
        bus.subscribe(MetricsCollector())
    if mode == "full":
        bus.subscribe(PrometheusMetrics(engine.model_name))
        writer = TraceWriter(folder / "bench.jsonl", trace_header(engine))
        bus.subscribe(writer)
        closers += [writer, bus.subscribe_async(maxsize=256)]
    return [bus], closers


def run_once(llm: LLM, mode: str, texts: list[str], params: SamplingParams, folder: Path) -> dict:
    engine = llm.engine
    installed, closers = observers(mode, engine, folder)
    timed = [Timed(o) for o in installed]
    steps_before = engine.scheduler.step_count
    engine.observers[:] = timed  # the benchmark swaps observers between runs
    start = time.perf_counter()
    outs = llm.generate(texts, params)
    elapsed = time.perf_counter() - start
    engine.observers[:] = []
    for c in closers:
        c.close()
    tokens = sum(len(o.token_ids) for o in outs)
    spent = sum(t.seconds for t in timed)
    steps = max(1, engine.scheduler.step_count - steps_before)
    return {
        "tok_s": tokens / elapsed,
        "callback_share": spent / elapsed,
        "callback_us_per_step": spent / steps * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    # One thread by default: on a small machine shared with other work, two torch threads
    # contend with everything else and single steps were seen to stall for seconds.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, dtype=args.dtype, max_num_seqs=args.requests, num_kv_blocks=256)
    texts = prompts(args.requests)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        run_once(llm, "full", texts, params, Path(tmp))  # warm-up, not counted
        for r in range(args.repeats):
            for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
                results[mode].append(run_once(llm, mode, texts, params, Path(tmp)))
    base = statistics.median(x["tok_s"] for x in results["off"])
    print(
        f"model {llm.engine.model_name}, {args.dtype}, {args.threads} torch threads, "
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
