"""What the host side of a step costs, outside the model: detokenizing and instrumentation.

- ``time_detokenize``: seconds per token to turn one request's output into text as it
  grows, token by token to ``num_tokens``: minicb's ``IncrementalDetokenizer`` against
  decoding the whole output again for every token (what the engine did before), in the
  same run on the same ids.
- ``time_instrumentation``: CPU seconds per ``engine.step()`` over a ``FakeRunner`` (no model:
  the step is all host work) with nothing subscribed and with the full set of listeners
  (metrics, Prometheus, a JSONL trace, an async queue nobody reads), or each of them alone
  (``--listeners``), engines under the same load stepped in turns, so that the machine's
  load falls on all alike. The difference is what the events cost: building them and
  every listener handling them.

``schedule()`` on its own is ``minicb.bench.measurements.time_schedule``. Run all three with

    python -m perflab.host
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from minicb.config import EngineConfig, SamplingParams
from minicb.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minicb.engine import LLMEngine
from minicb.runner.fake import FakeRunner
from minicb.scheduler.block_manager import blocks_needed
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


LISTENERS = ("metrics", "prometheus", "trace", "queue")  # "full" is all four at once


def _subscribe(engine: LLMEngine, folder: Path, names: tuple[str, ...]) -> Any:
    """The listeners ``names`` on ``engine``'s bus; returns how to undo it."""
    bus, undo = engine.bus, []
    for name in names:
        if name == "queue":  # an async subscription nobody reads: full, dropping
            queue = bus.subscribe_async(maxsize=256)
            undo.append(queue.close)
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
    """An engine over a FakeRunner that always holds ``num_running`` requests: each one
    that finishes is replaced by a new one (prompts of ``prompt_len`` tokens that share no
    prefix, 16 to 64 new tokens), so every kind of event comes each step."""

    def __init__(self, num_running: int, prompt_len: int = 32) -> None:
        self.count, self.prompt_len = 0, prompt_len
        blocks = num_running * blocks_needed(prompt_len + 64, 16)
        config = EngineConfig(
            max_num_seqs=num_running, num_kv_blocks=blocks, num_swap_blocks=0,
            max_num_batched_tokens=max(512, num_running, prompt_len),
        )  # fmt: skip
        runner = FakeRunner(blocks, max(256, prompt_len + 64), num_swap_blocks=0)
        self.engine = LLMEngine(config=config, runner=runner)
        for _ in range(num_running):
            self._add()

    def _add(self) -> None:
        max_tokens = 16 + (self.count * 13) % 49  # spread, so that some finish every step
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        c = self.count  # its first two tokens are its own: no prompt shares a block
        tail = [3 + (7 * c + j) % 250 for j in range(self.prompt_len - 2)]
        prompt = [3 + c % 250, 3 + c // 250 % 250] + tail
        self.engine.add_request(prompt, params)
        self.count += 1

    def step(self) -> float:
        """One step and the arrivals that replace what finished; CPU seconds it took."""
        t0 = time.thread_time()
        for _ in self.engine.step().finished:
            self._add()
        return time.thread_time() - t0


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
    ``instrumentation_s`` is the first setting's median less off's; ``step_event_bytes`` the
    median size of a step event's JSON line in the trace (what a listener serialises)."""
    modes = ("off", *settings)
    loads = {m: _SteadyLoad(num_running, prompt_len) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        undo = [
            _subscribe(loads[m].engine, Path(tmp), LISTENERS if m == "full" else (m,))
            for m in settings
        ]
        for i in range(steps + 100):  # the first 100: warm-up, to a steady state
            for mode in modes if i % 2 else modes[::-1]:
                seconds = loads[mode].step()
                if i >= 100:
                    times[mode].append(seconds)
        for fn in undo:
            fn()
        lines = [p.read_bytes().splitlines() for p in Path(tmp).glob("host-*.jsonl")]
    sizes = [len(line) for f in lines for line in f if line.startswith(b'{"type":"step"')]
    medians = {f"{m}_s": statistics.median(times[m]) for m in modes}
    return {"num_running": num_running, "steps": steps, "prompt_len": prompt_len, **medians,
            "instrumentation_s": medians[f"{settings[0]}_s"] - medians["off_s"],
            "step_event_bytes": statistics.median(sizes) if sizes else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=500, help="output length to detokenize")
    ap.add_argument("--running", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request")
    ap.add_argument("--only-instrumentation", action="store_true", help="skip the other timings")
    ap.add_argument(
        "--listeners", action="store_true", help="also each listener alone, at each --running"
    )
    args = ap.parse_args()
    from minicb.bench.measurements import time_schedule
    from minicb.runner.loader import default_model_dir, load_tokenizer

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
        r = time_instrumentation(n, prompt_len=args.prompt_len)
        print(f"engine.step() CPU time, {n} running ({args.prompt_len}-token prompts) over "
              f"FakeRunner, median of {r['steps']}: off {r['off_s'] * 1e6:.0f} us, full "
              f"instrumentation {r['full_s'] * 1e6:.0f} us, instrumentation "
              f"{r['instrumentation_s'] * 1e6:.0f} us per step ({r['full_s'] / r['off_s']:.2f}x); "
              f"step event {r['step_event_bytes']:,} bytes")  # fmt: skip
    for n in args.running if args.listeners else ():
        r = time_instrumentation(n, settings=(*LISTENERS, "full"), prompt_len=args.prompt_len)
        alone = ", ".join(f"{m} {(r[f'{m}_s'] - r['off_s']) * 1e6:.0f}" for m in LISTENERS)
        print(f"each listener alone, {n} running ({args.prompt_len}-token prompts), us per "
              f"step over off ({r['off_s'] * 1e6:.0f} us): {alone}; all four "
              f"{(r['full_s'] - r['off_s']) * 1e6:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
