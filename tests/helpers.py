"""Helpers shared by the tests: tiny models, prompt sets, and runs in several engine modes."""

from __future__ import annotations

import random

from minicb import LLM, SamplingParams


def mixed_prompts(
    n: int, vocab: int, seed: int = 0, min_len: int = 1, max_len: int = 40
) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(3, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)
    ]


def greedy_tokens(llm: LLM, prompts, max_tokens: int | list[int]) -> list[list[int]]:
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    return [out.token_ids for out in llm.generate(prompts, params)]
