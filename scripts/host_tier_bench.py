"""The prefix cache's host tier, measured: a multi-turn chat whose histories no longer fit
the device pool, with and without ``kv_offload_blocks``.

Each of ``--conversations`` conversations starts from a system prompt of its own and takes
``--turns`` turns; a turn's prompt is the whole history (system prompt, every earlier
question and answer) plus a new question, so it begins with the previous turn's prompt.
All conversations ask their turn together (one round), and the engine runs the round to the
end before the next, ``--max-num-seqs`` at a time: by the time a conversation comes back,
the other conversations' turns have filled the device pool and evicted its history.
Without the tier the history is computed again; with it, the evicted blocks were copied to
host memory and come back by a copy. Both runs use the same weights (or the same simulated
GPU) and the same workload.

Reported per run: prompt tokens computed, prefix hits (device, host), blocks copied each
way, and TTFT (mean and p50 of the turns after the first, where the cache matters), on the
engine's clock: the wall clock for the real model, the virtual one for ``--simulate``.
A benchmark, not a test:

    python scripts/host_tier_bench.py                                  # default model, CPU
    python scripts/host_tier_bench.py --simulate H100:llama-3.1-8b \\
        --conversations 256 --max-num-seqs 64 --system-tokens 2000 --question-tokens 100 \
        --output-tokens 200 --num-kv-blocks 8000 --kv-offload-blocks 40000 --dtype auto
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from minicb import SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine


def build_engine(args: argparse.Namespace, offload: int, shared: Any) -> tuple[LLMEngine, Any]:
    """An engine with ``offload`` host blocks over ``shared`` (a runner to reuse) or new."""
    config = EngineConfig.from_kwargs(
        num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size,
        kv_offload_blocks=offload,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        dtype=args.dtype,
    )
    if args.simulate:
        from minicb.core.runner import VirtualClock
        from minicb.sim.simulated_runner import SimulatedRunner

        clock = VirtualClock(0.0)
        runner = SimulatedRunner(args.simulate, config, clock=clock)
        return LLMEngine(config=config, runner=runner, clock=clock), runner
    if shared is None:
        engine = LLMEngine(args.model, config)
        return engine, engine.runner
    return LLMEngine(config=config, runner=shared.with_config(config)), shared


def run(args: argparse.Namespace, offload: int, shared: Any) -> tuple[dict[str, Any], Any]:
    engine, runner = build_engine(args, offload, shared)
    vocab = runner.vocab_size
    rng = random.Random(args.seed)
    history = [
        [rng.randrange(3, vocab) for _ in range(args.system_tokens)]
        for _ in range(args.conversations)
    ]
    steps: list = []
    engine.bus.subscribe(steps.extend, kinds=["step"])
    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    ttfts: list[float] = []
    wall = time.perf_counter()
    for turn in range(args.turns):
        ids = {}
        for c in range(args.conversations):
            question = [rng.randrange(3, vocab) for _ in range(args.question_tokens)]
            history[c] = history[c] + question
            ids[engine.add_request(history[c], params)] = c
        for out in engine.run_until_done():
            history[ids[out.request_id]] += out.token_ids
            if turn > 0:
                ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
    wall = time.perf_counter() - wall
    plans = [e.plan for e in steps]
    engine.scheduler.blocks.check()
    hits = sum(p.prefix_hit_tokens for p in plans)
    host = sum(p.prefix_host_hit_tokens for p in plans)
    return {
        "kv_offload_blocks": offload,
        "prompt_tokens_computed": sum(
            r.num_tokens for p in plans for r in p.scheduled if r.phase == "prefill"
        ),
        "device_hit_tokens": hits - host,
        "host_hit_tokens": host,
        "blocks_offloaded": sum(len(p.offload_map) for p in plans),
        "blocks_reloaded": sum(len(p.reload_map) for p in plans),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "engine_s": engine.busy_s,
        "wall_s": wall,
    }, runner


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' figures: counts from the first (the workload is seeded: every run counts
    alike), times as medians."""
    return {
        key: statistics.median(r[key] for r in runs) if isinstance(value, float) else value
        for key, value in runs[0].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--simulate", default=None, help="GPU:MODEL, e.g. H100:llama-3.1-8b")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=1,
        help="fewer than the conversations: a round "
        "runs in waves, and the later waves evict the earlier ones' histories",
    )
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=64)
    parser.add_argument("--question-tokens", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-blocks", type=int, default=12)
    parser.add_argument("--kv-offload-blocks", type=int, default=48)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="alternated runs of each")
    args = parser.parse_args()
    # Alternated (off, on, off, on, ...): on a shared machine whose load drifts, the two
    # settings see the same drift; the times reported are each setting's medians.
    offs, ons, shared = [], [], None
    for _ in range(args.repeats):
        off, shared = run(args, 0, shared)
        print("no host tier:", off, flush=True)  # each run's figures as they come
        on, _ = run(args, args.kv_offload_blocks, shared)
        print("host tier:", on, flush=True)
        offs.append(off)
        ons.append(on)
    off, on = _medians(offs), _medians(ons)
    print(f"{'':26}{'no host tier':>16}{'host tier':>16}")
    for key in off:
        a, b = off[key], on[key]
        fmt = (lambda v: f"{v:16.4f}") if isinstance(a, float) else (lambda v: f"{v!s:>16}")
        print(f"{key:26}{fmt(a)}{fmt(b)}")
    print(
        f"host tier / none: prompt tokens computed "
        f"{on['prompt_tokens_computed'] / off['prompt_tokens_computed']:.3f}, "
        f"TTFT mean {on['ttft_mean_s'] / off['ttft_mean_s']:.3f}, "
        f"engine time {on['engine_s'] / off['engine_s']:.3f}"
    )


if __name__ == "__main__":
    main()
