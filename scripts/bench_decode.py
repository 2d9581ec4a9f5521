"""Decode tokens/s at batch 1 and 16: minicb against transformers' generate, same run.

Same weights (the embedded default model), same dtype, same threads, greedy, fixed output
length (ignore_eos). Each system decodes ``--new-tokens`` tokens for ``batch`` identical-
length prompts; we time the whole generate call and report medians of ``--repeats``.

    .venv/bin/python scripts/bench_decode.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def time_alternating(fns: list, repeats: int) -> list[list[float]]:
    """Time each function ``repeats`` times, alternating, so machine noise hits all alike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    from transformers import AutoModelForCausalLM

    from minicb import LLM, SamplingParams

    llm = LLM(dtype=args.dtype, max_num_seqs=max(args.batches), num_kv_blocks=512)
    hf = AutoModelForCausalLM.from_pretrained(llm.engine.files.path, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None  # fixed lengths on both sides
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)

    print(
        f"dtype={args.dtype} threads={args.threads} prompt={args.prompt_len} new={args.new_tokens}"
    )
    print("| batch | minicb tok/s | transformers tok/s | ratio |")
    print("|---:|---:|---:|---:|")
    for batch in args.batches:
        prompts = [[100 + (7 * i + j) % 1000 for j in range(args.prompt_len)] for i in range(batch)]
        ids = torch.tensor(prompts)

        def run_minicb(prompts=prompts):
            llm.generate(prompts, params)

        def run_hf(ids=ids):
            with torch.inference_mode():
                hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )

        tokens = batch * args.new_tokens
        ours_t, theirs_t = time_alternating([run_minicb, run_hf], args.repeats)
        ours, theirs = tokens / statistics.median(ours_t), tokens / statistics.median(theirs_t)
        print(f"| {batch} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
