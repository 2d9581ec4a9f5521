"""A workload: requests with exact lengths, when each arrives, and the loop that feeds them.

One request shape, ``RequestSpec``, for the bench, the simulator, the scenarios and the
demo: a prompt, the tokens to generate, an arrival time (seconds, or rounds for a
scenario), and, for the simulator, where the model would have said EOS. A ``Workload`` is a
named list of them with the exact recipe in words (the bench's recipes are in
``bench/workloads.py``).

The generators, all seeded with ``random.Random``: output and prompt lengths
(``exponential_lengths``, ``lognormal_lengths``, rounded and capped), prompts from lengths
alone (``from_lengths``), and arrival times (``gaps``, ``arrival_times``) as in vLLM's
``bench serve``: gaps drawn from a gamma of shape ``burstiness`` and mean ``1 / rate``, so
their squared coefficient of variation is ``1 / burstiness``. Burstiness 1 is a Poisson
process (exponential gaps); below 1 requests come in bursts, above 1 more evenly.

The one arrival loop: ``Arrivals`` hands out requests as a clock reaches their arrival
time. ``feed`` runs it against one engine on the engine's clock (the bench, on the wall
clock; the simulator and tests, on a VirtualClock); the demo's feeder and the scenario
player call ``due`` before each round and give the same requests to both their engines.
Multi-turn chat, whose turns wait for the answers before them, is chat_workload.py.
Pure Python.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, islice
from typing import TYPE_CHECKING

from minicb.core.config import SamplingParams

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine


@dataclass(frozen=True)
class RequestSpec:
    prompt: list[int] | str  # token ids (text only in the demo, encoded per engine)
    max_tokens: int  # what the engine is told; generated exactly unless output_len stops it
    arrival: float = 0.0  # after the start: seconds (rounds in a scenario)
    output_len: int | None = None  # where the model would say EOS, if before max_tokens
    priority: int = 0
    group: str = ""  # a scenario's request group

    @property
    def output_tokens(self) -> int:
        """The tokens it really generates."""
        return self.max_tokens if self.output_len is None else self.output_len

    @property
    def stops_early(self) -> bool:
        return self.output_tokens < self.max_tokens

    def params(self, temperature: float = 0.0) -> SamplingParams:
        """Its sampling parameters: EOS ignored, so that it runs to its drawn length (a
        request that stops early is stopped there by the simulator, as at EOS)."""
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=temperature, ignore_eos=not self.stops_early
        )


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
        return replace(self, requests=with_arrivals(self.requests, times), arrivals=label)

    def head(self, n: int, max_tokens: int | None = None) -> Workload:
        """The first ``n`` requests (outputs capped at ``max_tokens``): a warm-up slice."""
        reqs = [
            replace(r, max_tokens=min(r.max_tokens, max_tokens or r.max_tokens), arrival=0.0)
            for r in self.requests[:n]
        ]
        return replace(self, name=self.name + "-warmup", requests=reqs, arrivals="all at once")

    def describe(self) -> dict:
        """JSON-ready facts: the recipe and the drawn lengths."""
        keys = ("name", "description", "params", "seed", "temperature", "arrivals")
        return {
            **{k: getattr(self, k) for k in keys},
            "num_requests": len(self.requests),
            "prompt_lens": self.prompt_lens,
            "output_lens": self.output_lens,
            "arrival_times": [r.arrival for r in self.requests],
        }


def with_arrivals(requests: list[RequestSpec], times: list[float]) -> list[RequestSpec]:
    """The same requests arriving at ``times``."""
    return [replace(r, arrival=t) for r, t in zip(requests, times, strict=True)]


# ---- lengths -----------------------------------------------------------------------------
def exponential_lengths(n: int, mean: float, cap: int, seed: int) -> list[int]:
    """``n`` draws of an exponential of ``mean``, rounded, within [1, cap]."""
    rng = random.Random(seed)
    return [max(1, min(cap, round(rng.expovariate(1.0 / mean)))) for _ in range(n)]


def lognormal_lengths(n: int, mean: float, sigma: float, cap: int, seed: int) -> list[int]:
    """``n`` draws of a lognormal of ``mean`` and shape ``sigma``, rounded, within [1, cap]."""
    rng, mu = random.Random(seed), math.log(mean) - sigma**2 / 2
    return [max(1, min(cap, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def from_lengths(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_tokens: int | Sequence[int] | None = None,
    vocab: int = 32000,
) -> list[RequestSpec]:
    """Requests of these lengths alone (the simulator's): prompt ``i`` is
    ``[3 + i % (vocab - 3)] + [5] * (len - 1)``, so no two share a prefix block (the
    papers' systems had no prefix cache). ``max_tokens``, one for all or one each (default:
    the output lengths), is what the engine is told; a shorter output stops as at EOS."""
    if max_tokens is None or isinstance(max_tokens, int):
        max_tokens = [max_tokens or o for o in output_lens]
    return [
        RequestSpec([3 + i % (vocab - 3)] + [5] * (p - 1), m, output_len=o if o < m else None)
        for i, (p, o, m) in enumerate(zip(prompt_lens, output_lens, max_tokens, strict=True))
    ]


# ---- arrival times -----------------------------------------------------------------------
def gaps(rng: random.Random, rate: float, burstiness: float = 1.0) -> Iterator[float]:
    """Endless gaps between arrivals: gamma of shape ``burstiness``, mean ``1 / rate``
    (burstiness 1: exponential, a Poisson process)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive (requests per second), got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if burstiness == 1.0:
        return iter(lambda: rng.expovariate(rate), None)  # never None: endless
    return iter(lambda: rng.gammavariate(burstiness, 1.0 / (rate * burstiness)), None)


def arrival_times(
    n: int, rate: float | None = None, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """``n`` arrival times in seconds, the first at 0; ``rate`` None or inf: all at 0."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if rate is None or math.isinf(rate):
        return [0.0] * n
    drawn = gaps(random.Random(seed), rate, burstiness)
    return list(accumulate(islice(drawn, max(0, n - 1)), initial=0.0))[:n]


def describe_arrivals(rate: float | None, burstiness: float = 1.0, seed: int = 0) -> str:
    if rate is None or math.isinf(rate):
        return "all at once"
    if burstiness == 1.0:
        return f"Poisson at {rate:g} req/s (seed {seed})"
    return f"gamma at {rate:g} req/s, burstiness {burstiness:g} (seed {seed})"


# ---- the arrival loop --------------------------------------------------------------------
class Arrivals:
    """Requests given in arrival order (a generator may be endless: the demo's Poisson
    stream), handed out as a clock reaches ``start`` + their arrival time."""

    def __init__(self, requests: Iterable[RequestSpec], start: float = 0.0) -> None:
        self._rest = iter(requests)
        self._next = next(self._rest, None)
        self.start = start

    def __bool__(self) -> bool:
        return self._next is not None

    @property
    def next_time(self) -> float | None:
        return None if self._next is None else self.start + self._next.arrival

    def due(self, now: float) -> list[RequestSpec]:
        """Every request whose time has come at ``now``, in order."""
        out = []
        while self._next is not None and self.start + self._next.arrival <= now:
            out.append(self._next)
            self._next = next(self._rest, None)
        return out


def feed(
    engine: LLMEngine,
    requests: Iterable[RequestSpec],
    add: Callable[[RequestSpec, float], None],
    sleep: Callable[[float], None],
) -> tuple[float, float]:
    """The arrival loop against one engine on its clock (real, fake or simulated runner):
    before each step, ``add(request, arrival_time)`` every request whose time has come,
    stamped with its scheduled arrival (one that arrived while a step ran is charged for the
    wait); step until all are done; when nothing runs, ``sleep`` until the next arrival
    (``time.sleep``, or a VirtualClock's ``advance``). Returns (start, end) on the clock."""
    clock = engine.clock
    start = clock()
    pending = Arrivals(sorted(requests, key=lambda r: r.arrival), start)
    while pending or engine.has_unfinished():
        for r in pending.due(clock()):
            add(r, start + r.arrival)
        if engine.has_unfinished():
            engine.step()
        elif pending:  # idle: wait for the next arrival rather than spin
            sleep(max(0.0, pending.next_time - clock()))
    return start, clock()
