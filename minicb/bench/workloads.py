"""Benchmark workloads: seeded sets of requests whose lengths are exactly what they say.

Every request is given as token ids with a ``max_tokens`` and is run with ``ignore_eos``
(or the equivalent in transformers), so each one generates exactly ``max_tokens`` tokens
and every system does the same work. Prompts are random token ids: the model's output is
irrelevant here, only the lengths matter.

- ``capped_exponential``: fixed prompt length, output lengths drawn from an exponential
  and capped (Anyscale's method in "How continuous batching enables 23x throughput": 512
  prompt tokens, exponential output lengths capped at 32 ... 1536, ignore_eos);
- ``uniform_lengths``: prompt and output lengths uniform in ranges (Orca's synthetic
  workload: prompts in [32, 512], outputs in [1, 128]);
- ``nanovllm_replica``: nano-vllm's bench.py (random ids in [0, 10000], prompt and output
  lengths uniform in [100, 1024], temperature 0.6, ignore_eos), scaled down;
- ``fixed_lengths``: every prompt and output the same length, the control where
  continuous batching has nothing to win.

Lengths are drawn from ``random.Random(seed)`` and prompt ids from a second generator
seeded from the same seed, so the lengths do not depend on the model's vocabulary: the
same arguments give the same lengths on any model, and the same workload anywhere.
Pure Python.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class RequestSpec:
    prompt: list[int]  # token ids
    max_tokens: int  # tokens to generate, exactly (ignore_eos)
    arrival: float = 0.0  # seconds after the run starts


@dataclass(frozen=True)
class Workload:
    name: str
    description: str  # the exact recipe, for the report
    requests: list[RequestSpec]
    temperature: float = 0.0  # 0: greedy
    seed: int = 0
    arrivals: str = "all at once"  # how the arrival times were drawn, in words
    params: dict = field(default_factory=dict)  # the generator's arguments

    @property
    def prompt_lens(self) -> list[int]:
        return [len(r.prompt) for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.max_tokens for r in self.requests]

    @property
    def all_at_once(self) -> bool:
        return all(r.arrival == 0.0 for r in self.requests)

    def with_arrivals(self, times: list[float], label: str) -> Workload:
        """The same requests arriving at ``times`` (seconds from the start)."""
        if len(times) != len(self.requests):
            raise ValueError(f"got {len(times)} arrival times for {len(self.requests)} requests")
        reqs = [replace(r, arrival=t) for r, t in zip(self.requests, times, strict=True)]
        return replace(self, requests=reqs, arrivals=label)

    def head(self, n: int, max_tokens: int | None = None) -> Workload:
        """The first ``n`` requests (outputs capped at ``max_tokens``): a warm-up slice."""
        reqs = [
            replace(r, max_tokens=min(r.max_tokens, max_tokens or r.max_tokens), arrival=0.0)
            for r in self.requests[:n]
        ]
        return replace(self, name=self.name + "-warmup", requests=reqs, arrivals="all at once")

    def describe(self) -> dict:
        """JSON-ready facts: the recipe and the drawn lengths."""
        return {
            "name": self.name,
            "description": self.description,
            "params": self.params,
            "seed": self.seed,
            "temperature": self.temperature,
            "arrivals": self.arrivals,
            "num_requests": len(self.requests),
            "prompt_lens": self.prompt_lens,
            "output_lens": self.output_lens,
            "arrival_times": [r.arrival for r in self.requests],
        }


def _rngs(seed: int) -> tuple[random.Random, random.Random]:
    """(lengths, prompt ids): two streams, so that the vocabulary never shifts a length."""
    return random.Random(seed), random.Random(f"minicb-bench-prompt-ids-{seed}")


def _prompt(rng: random.Random, length: int, vocab: int, low: int = 3, high: int = 10000) -> list:
    """``length`` random ids in [low, min(high, vocab - 1)] (ids below 3 are often special)."""
    top = max(low, min(high, vocab - 1))
    return [rng.randint(low, top) for _ in range(length)]


def capped_exponential(
    n: int, prompt_len: int, mean_output: float, cap: int, vocab: int, seed: int = 0
) -> Workload:
    """Output length = min(cap, max(1, round(X))), X ~ Exponential(mean ``mean_output``)."""
    rng, ids = _rngs(seed)
    reqs = []
    for _ in range(n):
        out = min(cap, max(1, round(rng.expovariate(1.0 / mean_output))))
        reqs.append(RequestSpec(_prompt(ids, prompt_len, vocab), out))
    return Workload(
        name="capped-exp",
        description=(
            f"{n} requests, prompts of {prompt_len} random tokens, output lengths "
            f"min({cap}, max(1, round(X))) with X exponential of mean {mean_output} "
            f"(Anyscale's method), seed {seed}"
        ),
        requests=reqs,
        seed=seed,
        params=dict(n=n, prompt_len=prompt_len, mean_output=mean_output, cap=cap),
    )


def uniform_lengths(
    n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int, seed: int = 0
) -> Workload:
    """Prompt and output lengths drawn uniformly from inclusive integer ranges (Orca's)."""
    rng, ids = _rngs(seed)
    reqs = []
    for _ in range(n):
        p = rng.randint(*prompt_range)
        reqs.append(RequestSpec(_prompt(ids, p, vocab), rng.randint(*output_range)))
    return Workload(
        name="uniform",
        description=(
            f"{n} requests, prompt lengths uniform in {list(prompt_range)}, output lengths "
            f"uniform in {list(output_range)} (Orca's workload, scaled), seed {seed}"
        ),
        requests=reqs,
        seed=seed,
        params=dict(n=n, prompt_range=list(prompt_range), output_range=list(output_range)),
    )


def nanovllm_replica(
    n: int, length_range: tuple[int, int], vocab: int, seed: int = 0, temperature: float = 0.6
) -> Workload:
    """nano-vllm's bench.py scaled down: ids in [0, 10000], both lengths in one range."""
    rng, ids = _rngs(seed)
    prompts = [_prompt(ids, rng.randint(*length_range), vocab, low=0) for _ in range(n)]
    outs = [rng.randint(*length_range) for _ in range(n)]
    return Workload(
        name="nanovllm",
        description=(
            f"{n} requests, prompt and output lengths uniform in {list(length_range)}, random "
            f"ids in [0, {min(10000, vocab - 1)}], temperature {temperature}, ignore_eos "
            f"(nano-vllm's bench.py: 256 requests, lengths in [100, 1024]), seed {seed}"
        ),
        requests=[RequestSpec(p, o) for p, o in zip(prompts, outs, strict=True)],
        temperature=temperature,
        seed=seed,
        params=dict(n=n, length_range=list(length_range)),
    )


def fixed_lengths(n: int, prompt_len: int, output_len: int, vocab: int, seed: int = 0) -> Workload:
    """Every request alike: continuous batching should win nothing here."""
    _, ids = _rngs(seed)
    reqs = [RequestSpec(_prompt(ids, prompt_len, vocab), output_len) for _ in range(n)]
    return Workload(
        name="fixed",
        description=(
            f"{n} requests, prompts of {prompt_len} random tokens, exactly {output_len} output "
            f"tokens each (the control), seed {seed}"
        ),
        requests=reqs,
        seed=seed,
        params=dict(n=n, prompt_len=prompt_len, output_len=output_len),
    )
