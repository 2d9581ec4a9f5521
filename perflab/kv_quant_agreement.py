"""How far an 8-bit KV cache (and 8-bit weights) move the model: measured against fp32.

The oracle holds within one quantisation (tests/quant/: the same greedy tokens in every
batching mode); across quantisations the tokens are allowed to differ, and this script
says by how much, on the embedded default model in fp32 (or ``--model``):

  1. greedy continuations of a set of prompts under each ``kv_cache_dtype``: per prompt,
     the first position where the 8-bit cache's tokens leave the fp32 cache's (or "same"
     if none within ``--max-tokens``);
  2. a fixed English text, teacher-forced in one prefill that reads every key and value
     back from the cache (store first, then attend): the mean log-likelihood per token and
     its perplexity under each dtype, and how often the top-1 next-token prediction agrees
     with the fp32 cache's.

``--weight-dtype int8`` adds two rows: int8 weights (minicb/quant/weights.py) with the fp32
cache, and int8 weights with the int8 cache; each is compared with the unquantised model.

    python -m perflab.kv_quant_agreement --threads 2 --max-tokens 48
    python -m perflab.kv_quant_agreement --threads 2 --max-tokens 48 --weight-dtype int8
"""

from __future__ import annotations

import argparse
import math

import torch

from minicb import LLM, SamplingParams
from minicb.core.attention import AttentionMetadata

DTYPES = ("auto", "int8", "fp8")
# label -> engine options; "auto" (everything in fp32) is the one the others are measured against
KV_VARIANTS = {kv: dict(kv_cache_dtype=kv) for kv in DTYPES}
WEIGHT_VARIANTS = {
    "w8": dict(weight_dtype="int8"),
    "w8+kv8": dict(weight_dtype="int8", kv_cache_dtype="int8"),
}
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "Water boils at a lower temperature on a mountain because",
    "To make a cup of tea, first",
    "The history of the Roman Empire begins",
    "1, 1, 2, 3, 5, 8,",
    "Photosynthesis is the process by which",
    "My favourite book is",
    "The quick brown fox",
    "In machine learning, overfitting means",
]
TEXT = (
    "Continuous batching lets a serving engine admit a new request as soon as another one "
    "finishes, instead of waiting for the whole batch to end. Each request keeps its keys "
    "and values in a paged cache, a few tokens per block, and the scheduler hands out "
    "blocks as the tokens arrive. When the cache is full, the engine must either wait, "
    "preempt a running request, or store fewer bytes per token. Quantising the cache to "
    "eight bits halves its size against sixteen-bit floats, so about twice as many "
    "requests fit in the same memory, at the price of a small rounding error in every key "
    "and value that attention reads back."
)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ, or None if they agree."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def teacher_forced_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) fp32 logits of every position, one prefill through the paged cache
    (the performance lab's reach into the runner: the engine samples only the last row)."""
    runner = llm.engine.runner
    bs = runner.config.block_size
    table = list(range(-(-len(ids) // bs)))
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [table], list(range(len(ids))), "cpu")
    positions = torch.arange(len(ids))
    hidden = runner.model(torch.tensor(ids), positions, meta, runner.kv_caches, runner.backend)
    return runner.model.logits(hidden).float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder or hub id (default: embedded)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per prompt")
    p.add_argument(
        "--weight-dtype", default="auto", choices=("auto", "int8"), help="int8: add w8 rows"
    )
    args = p.parse_args()
    variants = KV_VARIANTS | (WEIGHT_VARIANTS if args.weight_dtype == "int8" else {})
    torch.set_num_threads(args.threads)

    tokens, logits = {}, {}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for kv, options in variants.items():
        llm = LLM(model=args.model, dtype="float32", num_kv_blocks=256, **options)
        tokens[kv] = [o.token_ids for o in llm.generate(PROMPTS, params)]
        text_ids = llm.engine.tokenizer.encode(TEXT)
        logits[kv] = teacher_forced_logits(llm, text_ids)
        del llm

    print(f"greedy, {len(PROMPTS)} prompts x {args.max_tokens} tokens, fp32 compute")
    print("first position where the tokens leave the unquantised model's:")
    for kv in list(variants)[1:]:
        firsts = [first_difference(a, b) for a, b in zip(tokens["auto"], tokens[kv], strict=True)]
        shown = ", ".join("same" if f is None else str(f) for f in firsts)
        same = sum(f is None for f in firsts)
        differing = [f for f in firsts if f is not None]
        median = sorted(differing)[len(differing) // 2] if differing else None
        print(f"  {kv:6} [{shown}]  identical: {same}/{len(firsts)}  median first diff: {median}")

    targets = torch.tensor(text_ids[1:])
    print(f"\nteacher-forced text, {len(text_ids)} tokens (predicting the last {len(targets)}):")
    print(f"  {'':6} {'mean log-lik':>12} {'perplexity':>10} {'top-1 = fp32':>12}")
    top1_auto = logits["auto"][:-1].argmax(-1)
    for kv in variants:
        logp = torch.log_softmax(logits[kv][:-1], dim=-1)
        mean_ll = logp.gather(1, targets[:, None]).mean().item()
        agree = (logits[kv][:-1].argmax(-1) == top1_auto).float().mean().item()
        print(f"  {kv:6} {mean_ll:12.4f} {math.exp(-mean_ll):10.3f} {agree:12.1%}")


if __name__ == "__main__":
    main()
