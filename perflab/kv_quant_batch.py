"""At a fixed KV memory, how much larger a batch an 8-bit KV cache holds, and its tokens/s.

The same requests (all at once, greedy, EOS off) through two engines on one copy of the
embedded default model, in the same run: ``kv_cache_dtype`` "auto" (the compute dtype)
and "int8" (a byte a value and an fp32 scale per token and KV head). Each pool gets the
same byte budget, ``--kv-mib``, so it holds ``budget // bytes_per_block`` blocks: the
budget is chosen so that the "auto" batch is bound by the KV pool, not by
``max_num_seqs``. Rounds alternate between the two engines (drift in the machine's load
falls on both). Per engine: blocks, the mean running batch (rows of the steps that only
decode), output tokens/s (wall clock), preemptions, and the ratio to "auto".

    python -m perflab.kv_quant_batch --threads 2 --kv-mib 96 --requests 32
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from minicb import EngineConfig, LLMEngine, SamplingParams
from minicb.core.runner.model_runner import ModelRunner

KV_DTYPES = ("auto", "int8")


def run_once(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """All the prompts at once until done: seconds, output tokens, decode batch, preemptions."""
    plans: list = []
    listener = engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - start
    engine.bus.unsubscribe(listener)
    decode_rows = [len(p.scheduled) for p in plans if all(r.phase == "decode" for r in p.scheduled)]
    return {
        "seconds": seconds,
        "tok_s": len(prompts) * max_tokens / seconds,
        "batch": statistics.mean(decode_rows) if decode_rows else 0.0,
        "peak": max(decode_rows, default=0),
        "preempted": sum(len(p.preempted) for p in plans),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--dtype", default="float32", help="compute dtype (float32 on this CPU)")
    p.add_argument("--kv-mib", type=float, default=96, help="KV pool budget for each engine")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1, help="measured rounds per engine")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    budget = int(args.kv_mib * (1 << 20))
    base = EngineConfig(dtype=args.dtype, max_num_seqs=args.max_num_seqs, num_kv_blocks=1)
    first = ModelRunner(None, base)
    engines = {}
    for kv in KV_DTYPES:
        sized = base.with_(kv_cache_dtype=kv)
        per_block = first.with_config(sized).bytes_per_block()  # a throwaway 1-block pool
        config = sized.with_(num_kv_blocks=budget // per_block)
        engines[kv] = LLMEngine(config=config, runner=first.with_config(config))
    del first
    rng = random.Random(1)  # distinct random token ids: no prefix is shared, nothing cached
    prompts = [
        [rng.randrange(3, 40000) for _ in range(args.prompt_len)] for _ in range(args.requests)
    ]
    per_token = args.prompt_len + args.max_tokens
    print(f"default model, {args.dtype} compute, {args.requests} requests of {args.prompt_len} "
          f"+ {args.max_tokens} tokens at once, {args.kv_mib:g} MiB of KV each, "
          f"max_num_seqs {args.max_num_seqs}, {args.threads} threads")  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {kv: [] for kv in KV_DTYPES}
    run_once(engines["auto"], prompts[:2], 2)  # warm-up, untimed
    for r in range(args.rounds):
        order = KV_DTYPES if r % 2 == 0 else KV_DTYPES[::-1]
        for kv in order:
            results[kv].append(run_once(engines[kv], prompts, args.max_tokens))
    header = ("kv", "B/block", "blocks", "fits", "batch", "peak", "out tok/s", "preempt", "ratio")
    print("  ".join(f"{h:>9}" for h in header))
    base_tok_s = statistics.median(x["tok_s"] for x in results["auto"])
    for kv, runs in results.items():
        runner = engines[kv].runner
        tok_s = statistics.median(x["tok_s"] for x in runs)
        fits = runner.num_kv_blocks * runner.config.block_size // per_token
        batch = statistics.mean(x["batch"] for x in runs)
        row = (kv, runner.bytes_per_block(), runner.num_kv_blocks, fits, f"{batch:.1f}",
               max(x["peak"] for x in runs), f"{tok_s:.1f}", sum(x["preempted"] for x in runs),
               f"x{tok_s / base_tok_s:.2f}")  # fmt: skip
        print("  ".join(f"{v:>9}" for v in row))


if __name__ == "__main__":
    main()
