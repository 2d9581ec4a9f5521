"""What the benchmark runs: its recipes, seeded request sets with exact lengths.

Every request is given as token ids with a ``max_tokens`` and is run with ``ignore_eos``
(or the equivalent in transformers), so each one generates exactly ``max_tokens`` tokens
and every system does the same work. Prompts are random token ids: the model's output is
irrelevant here, only the lengths matter.

- ``capped_exponential``: fixed prompt length, output lengths drawn from an exponential
  and capped (Anyscale's method in "How continuous batching enables 23x throughput": 1000
  requests, 512 prompt tokens, exponential output lengths capped at 32 ... 1536);
- ``uniform_lengths``: prompt and output lengths uniform in ranges (Orca's synthetic
  workload: prompts in [32, 512], outputs in [1, 128]);
- ``nanovllm_replica``: nano-vllm's bench.py (256 requests, random ids in [0, 10000],
  prompt and output lengths uniform in [100, 1024], temperature 0.6, ignore_eos);
- ``fixed_lengths``: every prompt and output the same length, the control where
  continuous batching has nothing to win.

Two more, for prefix caching (most of each prompt seen before):

- ``shared_system_prompt``: one system prompt in front of every request, then a question
  of its own (the common case of a deployed assistant);
- ``multi_turn_chat``: conversations whose every turn's prompt is the previous turn's
  prompt, an answer and a new question; turn ``k`` arrives ``k * think_s`` seconds in, so
  the previous turn has been computed (and cached) when it comes.

Lengths are drawn from ``random.Random(seed)`` and prompt ids from a second generator
seeded from the same seed, so the lengths do not depend on the model's vocabulary: the
same arguments give the same lengths on any model, and the same workload anywhere.

What a request and a workload are, the length and arrival-time generators and the
arrival loop are in ``minicb/workload.py``; a ``Workload`` may be given arrival times
there (``with_arrivals``, ``arrival_times``). The suite's sizes of each recipe are in
``bench_plan.py``. docs/performance.md writes every workload out exactly. Pure Python.
"""

from __future__ import annotations

import random
from dataclasses import replace

from minicb.workload import RequestSpec, Workload, exponential_lengths


# ---- the recipes ----------------------------------------------------------------------
def _workload(
    name: str, lengths: list[tuple[int, int]], vocab: int, seed: int, description: str,
    params: dict, temperature: float = 0.0, low: int = 3,
) -> Workload:  # fmt: skip
    """Requests of the drawn (prompt, output) ``lengths``. Prompt ids are uniform in
    [low, min(10000, vocab - 1)] (ids below 3 are often special), from a generator of
    their own, so that the vocabulary never shifts a length."""
    ids, top = random.Random(f"minicb-bench-prompt-ids-{seed}"), max(low, min(10000, vocab - 1))
    reqs = [RequestSpec([ids.randint(low, top) for _ in range(p)], out) for p, out in lengths]
    return Workload(name, f"{description}, seed {seed}", reqs, temperature, seed, params=params)


def capped_exponential(
    n: int, prompt_len: int, mean_output: float, cap: int, vocab: int, seed: int = 0
) -> Workload:
    """Output length = min(cap, max(1, round(X))), X ~ Exponential(mean ``mean_output``)."""
    lengths = [(prompt_len, out) for out in exponential_lengths(n, mean_output, cap, seed)]
    description = (
        f"{n} requests, prompts of {prompt_len} random tokens, output lengths "
        f"min({cap}, max(1, round(X))) with X exponential of mean {mean_output} "
        f"(Anyscale's method)"
    )
    params = dict(n=n, prompt_len=prompt_len, mean_output=mean_output, cap=cap)
    return _workload("capped-exp", lengths, vocab, seed, description, params)


def uniform_lengths(
    n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int, seed: int = 0
) -> Workload:
    """Prompt and output lengths drawn uniformly from inclusive integer ranges (Orca's),
    prompt length then output length, request after request."""
    rng = random.Random(seed)
    lengths = [(rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(n)]
    description = (
        f"{n} requests, prompt lengths uniform in {list(prompt_range)}, output lengths "
        f"uniform in {list(output_range)} (Orca's workload, scaled)"
    )
    params = dict(n=n, prompt_range=list(prompt_range), output_range=list(output_range))
    return _workload("uniform", lengths, vocab, seed, description, params)


def nanovllm_replica(
    n: int, length_range: tuple[int, int], vocab: int, seed: int = 0, temperature: float = 0.6
) -> Workload:
    """nano-vllm's bench.py scaled down: ids in [0, 10000], both lengths in one range, all
    prompt lengths drawn first."""
    rng = random.Random(seed)
    prompts = [rng.randint(*length_range) for _ in range(n)]
    lengths = [(p, rng.randint(*length_range)) for p in prompts]
    description = (
        f"{n} requests, prompt and output lengths uniform in {list(length_range)}, random "
        f"ids in [0, {min(10000, vocab - 1)}], temperature {temperature}, ignore_eos "
        f"(nano-vllm's bench.py: 256 requests, lengths in [100, 1024])"
    )
    params = dict(n=n, length_range=list(length_range))
    return _workload("nanovllm", lengths, vocab, seed, description, params, temperature, low=0)


def fixed_lengths(n: int, prompt_len: int, output_len: int, vocab: int, seed: int = 0) -> Workload:
    """Every request alike: continuous batching should win nothing here."""
    description = (
        f"{n} requests, prompts of {prompt_len} random tokens, exactly {output_len} output "
        f"tokens each (the control)"
    )
    params = dict(n=n, prompt_len=prompt_len, output_len=output_len)
    return _workload("fixed", [(prompt_len, output_len)] * n, vocab, seed, description, params)


def shared_system_prompt(
    n: int, system_len: int, question_range: tuple[int, int], output_len: int, vocab: int,
    seed: int = 0,
) -> Workload:  # fmt: skip
    """Every prompt: the same ``system_len`` tokens, then a question of its own."""
    rng = random.Random(seed)
    lengths = [(system_len + rng.randint(*question_range), output_len) for _ in range(n)]
    w = _workload(
        "shared-system",
        lengths,
        vocab,
        seed,
        f"{n} requests, one {system_len}-token system prompt then a question of "
        f"{list(question_range)} tokens, {output_len} output tokens each",
        dict(
            n=n, system_len=system_len, question_range=list(question_range), output_len=output_len
        ),
    )
    system = w.requests[0].prompt[:system_len]
    reqs = [replace(r, prompt=system + r.prompt[system_len:]) for r in w.requests]
    return replace(w, requests=reqs)


def multi_turn_chat(
    conversations: int, turns: int, turn_len: int, output_len: int, vocab: int,
    think_s: float = 1.0, seed: int = 0,
) -> Workload:  # fmt: skip
    """Each turn's prompt = the previous turn's prompt + ``turn_len`` new tokens (an answer
    and a question); turn ``k`` of every conversation arrives at ``k * think_s``."""
    n = conversations * turns
    w = _workload(
        "multi-turn",
        [(turn_len, output_len)] * n,
        vocab,
        seed,
        f"{conversations} conversations of {turns} turns, each turn {turn_len} tokens "
        f"longer than the last, {output_len} output tokens, a turn every {think_s:g} s",
        dict(conversations=conversations, turns=turns, turn_len=turn_len, output_len=output_len),
    )
    reqs = []
    for c in range(conversations):
        prompt: list[int] = []
        for k in range(turns):
            prompt = prompt + w.requests[c * turns + k].prompt
            reqs.append(RequestSpec(prompt, output_len, arrival=k * think_s))
    reqs.sort(key=lambda r: r.arrival)
    return replace(w, requests=reqs, arrivals=f"turn k at k x {think_s:g} s")
