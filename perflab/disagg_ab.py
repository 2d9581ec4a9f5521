"""Disaggregated prefill and decode (1:1, real processes over gloo) against one engine, on
this CPU, in the same run: the greedy tokens, output tokens per second, and each request's
KV transfer (the prefill side's sends alone, and from the decode side's posted receive to
the KV in its blocks).

    python -m perflab.disagg_ab --max-tokens 32

The default model in float32, one torch thread per process, the same prompts and greedy
decoding on both; a warm-up, then ``--repeats`` timed runs of every prompt, medians. The
fleet's two processes use two cores where the one engine uses one: the ratio says what
the hand-off costs, not what disaggregation buys (that needs a GPU per side: see the
simulator's reproduction in docs/reproductions.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "1, 2, 3, 4,",
    "Once upon a time",
    "You are a helpful assistant who answers questions about geography, history and science "
    "in short, clear sentences. Where is Paris?",
    "Write a short poem about the sea and the wind and the boats that sail at night.",
    "Explain continuous batching in one paragraph.",
    "List three prime numbers:",
]


def timed(generate, prompts, params, repeats: int) -> tuple[list[float], list]:
    """Seconds of each of ``repeats`` runs of every prompt (after one warm-up), last outputs."""
    generate(prompts[:1], params)
    seconds, outs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = generate(prompts, params)
        seconds.append(time.perf_counter() - start)
    return seconds, outs


def main() -> None:
    import torch

    from minicb import LLM, SamplingParams
    from minicb.fleet import DisaggregatedFleet

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    options = dict(dtype="float32", device="cpu", num_kv_blocks=256, block_size=16)
    llm = LLM(**options)
    one, reference = timed(llm.generate, PROMPTS, params, args.repeats)
    del llm
    with DisaggregatedFleet(threads=1, **options) as fleet:
        split, outs = timed(fleet.generate, PROMPTS, params, args.repeats)
    tokens = len(PROMPTS) * args.max_tokens
    same = [o.token_ids for o in outs] == [o.token_ids for o in reference]
    print(f"same greedy tokens as one engine: {same}")
    for name, runs in (("one engine", one), ("1:1 disaggregated", split)):
        median = statistics.median(runs)
        print(f"{name:>18}: median {median:.2f} s, {tokens / median:.1f} output tok/s")
    ratio = statistics.median(one) / statistics.median(split)
    print(f"ratio (disaggregated / one engine): {ratio:.2f}x")
    for out in outs:
        t = out.transfer
        sends_ms, landed_ms = 1e3 * t["send_seconds"], 1e3 * t["seconds"]
        rate = t["bytes"] / t["send_seconds"] / 1e6
        print(
            f"  {t['blocks']} blocks, {t['bytes']:,} B: prefill's sends {sends_ms:.2f} ms "
            f"({rate:.0f} MB/s), posted to landed {landed_ms:.1f} ms"
        )


if __name__ == "__main__":
    main()
