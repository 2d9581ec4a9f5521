"""What the host side of a step costs, outside the model: detokenizing and instrumentation.

- ``time_detokenize``: seconds per token to turn one request's output into text as it
  grows, token by token to ``num_tokens``: minicb's ``IncrementalDetokenizer`` against
  decoding the whole output again for every token (what the engine did before), in the
  same run on the same ids.
- ``time_instrumentation``: CPU seconds per ``engine.step()`` over a ``FakeRunner`` (no model:
  the step is all host work) with nothing subscribed and with the full set of listeners
  (metrics, Prometheus, a JSONL trace, one viewer: the server's subscription, folded into
  frames by a thread of its own as minicb/server/broadcast.py does), or each of them alone
  (``--listeners``), engines under the same load stepped in turns, so that the machine's
  load falls on all alike. The difference is what the events cost: building them and
  every listener handling them.

``schedule()`` on its own is ``minicb.bench.measurements.time_schedule``. Run all three with

    python -m perflab.host
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minicb.core.engine import LLMEngine
from minicb.core.events import EVENT_KINDS
from minicb.core.runner.fake import FakeRunner
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.server.broadcast import FOLD_QUEUE, compress
from minicb.server.frames import DETAIL_ROWS, FRAME_HZ, StepFolder
from minicb.telemetry.kv_state import KVState
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.telemetry.trace import TraceWriter, trace_header


def _full_decode(tokenizer: Any, ids: list[int]) -> None:
    """The engine's old way, for the baseline: decode everything for every new token."""
    text = ""
    for n in range(1, len(ids) + 1):
        new = tokenizer.decode(ids[:n], skip_special_tokens=True)
        text = text if new.endswith(REPLACEMENT_CHAR) else new


def _incremental(tokenizer: Any, ids: list[int]) -> None:
    detok = IncrementalDetokenizer(tokenizer, [])
    for n in range(1, len(ids) + 1):
        detok.add(ids[:n], final=n == len(ids))


def time_detokenize(tokenizer: Any, num_tokens: int = 500, repeats: int = 3) -> dict[str, Any]:
    """Seconds per token over one output of ``num_tokens`` random ids (best of repeats)."""
    rng = random.Random(0)
    ids = [rng.randrange(len(tokenizer)) for _ in range(num_tokens)]
    best = {"full_decode_s": float("inf"), "incremental_s": float("inf")}
    for _ in range(repeats):
        for key, fn in (("full_decode_s", _full_decode), ("incremental_s", _incremental)):
            t0 = time.perf_counter()
            fn(tokenizer, ids)
            best[key] = min(best[key], (time.perf_counter() - t0) / num_tokens)
    speedup = best["full_decode_s"] / best["incremental_s"]
    return {"num_tokens": num_tokens, **best, "speedup": speedup}


LISTENERS = ("metrics", "prometheus", "trace", "viewer")  # "full" is all four at once


class _Viewer:
    """One browser's share of the server, as minicb/server/broadcast.py serves it: the
    broadcast's subscription (at scale without token events), drained FRAME_HZ times a
    second by a thread of its own that folds the events into a frame (StepFolder) and
    encodes and compresses it. The engine thread pays the queue put; the fold is the
    server's thread's, measured apart (``thread_cpu_s``)."""

    def __init__(self, engine: LLMEngine) -> None:
        small = engine.config.max_num_seqs <= DETAIL_ROWS
        info = {"name": "bench", **engine.describe(), "requests": engine.live_requests()}
        self.folder = StepFolder(info, KVState.from_snapshot(engine.kv_snapshot_event()))
        kinds = None if small else EVENT_KINDS - {"tokens"}
        self.sub = engine.bus.subscribe_async(FOLD_QUEUE, kinds)
        self.tokens, self.frames, self.bytes = small, 0, 0
        self.thread = threading.Thread(target=self._run, name="bench viewer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.sub.closed:
            time.sleep(1 / FRAME_HZ)
            events = self.folder.fold(self.sub.drain(), tokens=self.tokens)
            frame = json.dumps({"type": "frame", "engine": "bench", "events": events})
            self.bytes += len(compress(frame))
            self.frames += 1

    def close(self) -> None:
        self.sub.close()
        self.thread.join()


def thread_cpu_s(names: tuple[str, ...]) -> float:
    """CPU seconds so far of the live threads whose names start with one of ``names``."""
    return sum(
        time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        for t in threading.enumerate()
        if t.name.startswith(names) and t.ident is not None
    )


def _subscribe(engine: LLMEngine, folder: Path, names: tuple[str, ...]) -> Any:
    """The listeners ``names`` on ``engine``'s bus; returns how to undo it."""
    bus, undo = engine.bus, []
    for name in names:
        if name == "viewer":
            undo.append(_Viewer(engine).close)
            continue
        if name == "trace":
            listener: Any = TraceWriter(folder / f"host-{id(engine)}.jsonl", trace_header(engine))
        else:
            listener = MetricsCollector() if name == "metrics" else PrometheusMetrics("host")
        bus.subscribe(listener)
        undo.append(lambda listener=listener: bus.unsubscribe(listener))
        if name == "trace":  # after unsubscribing: the file must not be written once closed
            undo.append(listener.close)

    def undo_all() -> None:
        for fn in undo:
            fn()

    return undo_all


class _SteadyLoad:
    """An engine over a FakeRunner that holds ``num_running`` requests once filled
    (``fill_steps``): each one that finishes is replaced by a new one (prompts of
    ``prompt_len`` tokens that share no prefix), so every kind of event comes each step.

    Requests live long enough for the replacements' prefills to fit the token budget: 16
    to 64 new tokens where the budget takes many prompts a step, longer where it takes one
    (1,500-token prompts: 256 to 1,024). With 16 to 64 at 1,500-token prompts the engine
    could prefill one a step while about one finished a step, so "256 running" held about
    40 (the figures of docs/performance.md before this commit were taken that way)."""

    def __init__(self, num_running: int, prompt_len: int = 32) -> None:
        self.count, self.prompt_len = 0, prompt_len
        self.rows: list[int] = []  # rows each step ran
        budget = max(512, num_running, prompt_len)
        # the fewest new tokens: a request lives as long as the budget takes to refill
        # the batch, num_running prompts of prompt_len tokens
        self.min_tokens = max(16, -(-num_running * prompt_len // budget))
        self.fill_steps = -(-num_running * prompt_len // budget)
        longest = prompt_len + 4 * self.min_tokens
        blocks = num_running * blocks_needed(longest, 16)
        config = EngineConfig(
            max_num_seqs=num_running, num_kv_blocks=blocks, num_swap_blocks=0,
            max_num_batched_tokens=budget,
        )  # fmt: skip
        runner = FakeRunner(blocks, max(256, longest), num_swap_blocks=0)
        self.engine = LLMEngine(config=config, runner=runner)

    def fill(self) -> None:
        """The first ``num_running`` requests. Subscribe the listeners before: a listener
        follows only the requests that arrive after it (as a server's, subscribed at its
        start), and one that meets a request from before takes its slower path."""
        for _ in range(self.engine.config.max_num_seqs):
            self._add()

    def _add(self) -> None:
        low = self.min_tokens  # spread over low..4 low, so that some finish every step
        max_tokens = low + (self.count * 13) % (3 * low + 1)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        c = self.count  # its first two tokens are its own: no prompt shares a block
        tail = [3 + (7 * c + j) % 250 for j in range(self.prompt_len - 2)]
        prompt = [3 + c % 250, 3 + c // 250 % 250] + tail
        self.engine.add_request(prompt, params)
        self.count += 1

    def step(self) -> float:
        """One step and the arrivals that replace what finished; CPU seconds it took."""
        t0 = time.thread_time()
        result = self.engine.step()
        for _ in result.finished:
            self._add()
        seconds = time.thread_time() - t0
        self.rows.append(len(result.event.plan.scheduled))
        return seconds


def time_instrumentation(
    num_running: int = 16,
    steps: int = 400,
    settings: tuple[str, ...] = ("full",),
    prompt_len: int = 32,
) -> dict[str, Any]:
    """Median CPU seconds per step of engines under the same load, one with nothing
    subscribed ("off") and one per setting (a listener of ``LISTENERS`` alone, or "full":
    all of them), stepped in turns (the order reversed every other round) so that the
    machine's load falls on all alike. CPU time of the engine's thread, not wall time: on
    a shared machine a wall-clock step also counts the time other processes held the core.
    ``instrumentation_s`` is the first setting's median less off's; ``off_thread_s`` the
    CPU seconds per step of the threads that work beside the engine's (the trace writers',
    the viewer's folds), all settings together; ``step_event_bytes`` the median size of a
    step event's JSON line in the trace (what the writer serialises)."""
    modes = ("off", *settings)
    loads = {m: _SteadyLoad(num_running, prompt_len) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        undo = [
            _subscribe(loads[m].engine, Path(tmp), LISTENERS if m == "full" else (m,))
            for m in settings
        ]
        for load in loads.values():
            load.fill()
        beside = ("trace writer", "bench viewer")
        warmup = loads["off"].fill_steps + 100  # filled, then 100 more: a steady state
        for i in range(steps + warmup):
            if i == warmup:
                beside_t0 = thread_cpu_s(beside)
            for mode in modes if i % 2 else modes[::-1]:
                seconds = loads[mode].step()
                if i >= warmup:
                    times[mode].append(seconds)
        beside_s = thread_cpu_s(beside) - beside_t0  # before the threads end
        for fn in undo:
            fn()
        lines = [p.read_bytes().splitlines() for p in Path(tmp).glob("host-*.jsonl")]
    sizes = [len(line) for f in lines for line in f if line.startswith(b'{"type":"step"')]
    medians = {f"{m}_s": statistics.median(times[m]) for m in modes}
    return {"num_running": num_running, "steps": steps, "prompt_len": prompt_len, **medians,
            "instrumentation_s": medians[f"{settings[0]}_s"] - medians["off_s"],
            "off_thread_s": beside_s / steps,
            "rows": statistics.median(loads["off"].rows[-steps:]),
            "step_event_bytes": statistics.median(sizes) if sizes else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=500, help="output length to detokenize")
    ap.add_argument("--running", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request")
    ap.add_argument("--only-instrumentation", action="store_true", help="skip the other timings")
    ap.add_argument("--runs", type=int, default=5, help="instrumentation runs, new engines each")
    ap.add_argument(
        "--listeners", action="store_true", help="also each listener alone, at each --running"
    )
    args = ap.parse_args()
    from minicb.bench.measurements import time_schedule
    from minicb.core.runner.loader import default_model_dir, load_tokenizer

    if not args.only_instrumentation:
        d = time_detokenize(load_tokenizer(default_model_dir()), args.tokens)
        print(f"detokenize, {d['num_tokens']} tokens of the default tokenizer, per token: "
              f"full decode {d['full_decode_s'] * 1e6:.1f} us, incremental "
              f"{d['incremental_s'] * 1e6:.1f} us ({d['speedup']:.1f}x)")  # fmt: skip
        for n in args.running:
            s = time_schedule(n)
            print(f"schedule() with {n} running: median {s['median_s'] * 1e3:.3f} ms, "
                  f"p90 {s['p90_s'] * 1e3:.3f} ms")  # fmt: skip
    for n in args.running:
        # Engines alike in every setting differ by up to 5 % of a step from one process
        # to the next (where their objects landed in memory): each run builds new ones,
        # and the run with the median figure is shown, with every run's figure beside it.
        runs = [time_instrumentation(n, prompt_len=args.prompt_len) for _ in range(args.runs)]
        shares = [r["instrumentation_s"] / r["off_s"] for r in runs]
        r = runs[shares.index(statistics.median_low(shares))]
        print(f"engine.step() CPU time, {n} running ({args.prompt_len}-token prompts; median "
              f"{r['rows']:.0f} rows a step) over FakeRunner, median of {r['steps']}: "
              f"off {r['off_s'] * 1e6:.0f} us, full "
              f"instrumentation {r['full_s'] * 1e6:.0f} us, instrumentation "
              f"{r['instrumentation_s'] * 1e6:.0f} us per step ({r['full_s'] / r['off_s']:.2f}x), "
              f"{r['instrumentation_s'] / r['off_s']:.1%} of off (the median of {len(runs)} "
              f"runs: {', '.join(f'{x:.1%}' for x in sorted(shares))}); beside the engine's "
              f"thread "
              f"(trace writer, viewer's folds) {r['off_thread_s'] * 1e6:.0f} us per step; "
              f"step event {r['step_event_bytes']:,} bytes")  # fmt: skip
    for n in args.running if args.listeners else ():
        r = time_instrumentation(n, settings=(*LISTENERS, "full"), prompt_len=args.prompt_len)
        alone = ", ".join(f"{m} {(r[f'{m}_s'] - r['off_s']) * 1e6:.0f}" for m in LISTENERS)
        print(f"each listener alone, {n} running ({args.prompt_len}-token prompts), us per "
              f"step over off ({r['off_s'] * 1e6:.0f} us): {alone}; all four "
              f"{(r['full_s'] - r['off_s']) * 1e6:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
