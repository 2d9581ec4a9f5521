"""The demo's workload feeder: the same arrivals, at the same moment, for every engine.

It is the EngineLoop's feeder: it runs in the engine thread before each round and adds
each new request to every engine at once, so static and continuous batching see exactly
the same prompts, output lengths and arrival times, and differ only in how they schedule.
It reads how full each engine is through the engine's own view (``queue_sizes``).

Presets: ``burst`` (``count`` requests at once), ``poisson`` (arrivals at ``rate`` per
second, exponential gaps: an endless stream of ``minicb.workload.RequestSpec``s handed out
by the one arrival loop's ``Arrivals`` on the feeder's clock), ``off``. Output lengths:
``short``, ``long`` or ``mixed`` (mostly short, some long: the mix where static batching
pads the most). Requests ignore EOS so that their lengths are exactly the ones drawn.

A workload the engines cannot serve is refused once, before it runs: ``check_fits`` asks a
scheduler built for the settings (holding nothing) about the largest request the workload
can draw, so a pool too small for it is named when the settings are chosen, not found
by a thousand refused arrivals. Should one be refused anyway, the feeder says so once and
stops sending the repeating burst until it is given a workload again.

A burst with ``repeat`` is sent again each time every engine has finished all it holds:
the demo's opening. A burst of a few times the slots keeps a queue in front of both
engines, so within a minute the page shows what the project is named for: continuous
batching refills each freed slot at the next iteration and keeps its batch full of useful
rows, while static batching pads until its longest member ends and leaves the queue
waiting. It counts in iterations, not seconds, so the lesson is the same on a slow CPU,
a fast one and a simulated GPU (a Poisson rate is light on one machine and a flood on
another).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.request import Request
from minicb.core.scheduler import make_scheduler
from minicb.workload import Arrivals, RequestSpec, gaps

log = logging.getLogger(__name__)

PRESETS = ("burst", "poisson", "off")
LENGTHS = ("short", "long", "mixed")
MAX_TICK_S = 0.25  # clock time a round may add: a pause or a slow round is no arrival flood

PROMPTS = [
    "Explain what a KV cache is in one sentence.",
    "Write a haiku about waiting in a queue.",
    "What is the capital of France?",
    "List three uses of a GPU.",
    "Why is the sky blue?",
    "Give me a tip for writing clean code.",
    "Translate 'good morning' into Spanish.",
    "What does a scheduler do?",
    "Tell me a fun fact about octopuses.",
    "Summarise the idea of continuous batching.",
    "What is 17 times 23?",
    "Name a famous bridge and its city.",
    "Describe the smell of rain.",
    "How do I boil an egg?",
    "Write one line of a sea shanty.",
    "What is a transformer in machine learning?",
]


@dataclass
class WorkloadSpec:
    preset: str = "poisson"
    rate: float = 1.0  # arrivals per second (poisson)
    lengths: str = "mixed"
    count: int = 16  # requests in a burst
    max_outstanding: int = 48  # skip arrivals while an engine holds this many requests
    repeat: bool = False  # burst: again each time every engine has finished all it holds


def encode_prompt(engine: Any, text: str) -> str | list[int]:
    """The prompt as the engine takes it: for a chat model, the text as one user turn in
    its chat template (a raw question often gets an instant end-of-text from an instruct
    model); for a model with no tokenizer (the tiny test models), the text's bytes folded
    into the vocabulary. Kept a string where possible, so the events carry the prompt."""
    tokenizer = engine.tokenizer
    if tokenizer is not None:
        if not getattr(tokenizer, "chat_template", None):
            return text
        try:
            return tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        except Exception:  # a template that wants something else: the raw text still works
            return text
    vocab = engine.runner.vocab_size
    return [3 + b % (vocab - 3) for b in text.encode("utf-8")]  # skip bos/eos ids 1 and 2


class WorkloadFeeder:
    def __init__(
        self,
        spec: WorkloadSpec | None = None,
        *,
        short: tuple[int, int] = (6, 16),
        long: tuple[int, int] = (48, 96),
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        max_tick_s: float = MAX_TICK_S,
    ) -> None:
        """``clock``: seconds that arrivals are counted in (a simulated demo's pacer gives
        simulated ones); ``max_tick_s``: the most of them one round may add."""
        self.short, self.long = short, long
        self.max_tick_s = max_tick_s
        self.rng = random.Random(seed)
        self.clock = clock
        self.sent = 0  # arrivals given to the engines
        self.skipped = 0  # arrivals skipped because an engine was full
        self.configure(spec or WorkloadSpec())

    def configure(self, spec: WorkloadSpec) -> None:
        """Start ``spec`` now (call it in the engine thread). A burst arrives next round."""
        self.spec = spec
        self.refused: str | None = None  # why an engine refused one of its requests, if one did
        self._burst_left = spec.count if spec.preset == "burst" else 0
        self._time = 0.0  # feeder clock: advances with rounds, by at most MAX_TICK_S each
        self._last = self.clock()
        self._stream = Arrivals(self._poisson() if spec.preset == "poisson" else ())

    def burst(self, count: int) -> None:
        """Add a burst of ``count`` on top of whatever runs (call it in the engine thread)."""
        self._burst_left += count

    def counts(self) -> dict[str, Any]:
        """Arrivals sent to every engine, and skipped for every engine while one held
        ``max_outstanding`` requests (the page says so: the other's timeline has gaps)."""
        return {"sent": self.sent, "skipped": self.skipped, "limit": self.spec.max_outstanding}

    def describe(self) -> dict[str, Any]:
        counts = {"sent": self.sent, "skipped": self.skipped, "refused": self.refused}
        return {**asdict(self.spec), **counts}  # the spec says the limit: max_outstanding

    def check_fits(
        self, engine: Any, config: EngineConfig | None = None, spec: WorkloadSpec | None = None
    ) -> None:
        """Raise ValueError, naming the limit, if ``engine`` rebuilt with ``config`` (default:
        its own) would refuse the largest request that ``spec`` (default: this feeder's) can
        draw: the longest of PROMPTS with the longest output. The scheduler's own check
        answers, on a scheduler built for the config that holds nothing (no tensor, no
        event), so nothing of the engine is touched."""
        config = config or engine.config
        lengths = (spec or self.spec).lengths
        longest = self.short[1] if lengths == "short" else self.long[1]
        prompt = max((engine.tokenize(encode_prompt(engine, p)) for p in PROMPTS), key=len)
        runner = engine.runner  # a pool left unset is sized as the engine's was
        blocks = config.num_kv_blocks or runner.num_kv_blocks
        scheduler = make_scheduler(config, blocks, engine.max_model_len, runner.num_swap_blocks)
        params = SamplingParams(max_tokens=longest, temperature=0.0, ignore_eos=True)
        try:
            scheduler.check_request(Request(-1, prompt, params, arrival_time=0.0))
        except ValueError as err:
            raise ValueError(
                f"the workload's largest request ({len(prompt)} prompt tokens, {longest} new "
                f"tokens) could never run on the {config.batching} engine: {err}"
            ) from err

    def _poisson(self) -> Iterator[RequestSpec]:
        """Endless: each request's gap, then its prompt and length."""
        t = 0.0
        for gap in gaps(self.rng, self.spec.rate):
            t += gap
            yield self.request(t)

    def request(self, arrival: float) -> RequestSpec:
        """One request: a prompt from PROMPTS and an output length of the spec's kind."""
        text = self.rng.choice(PROMPTS)
        kind = self.spec.lengths
        if kind == "mixed":
            kind = "long" if self.rng.random() < 0.3 else "short"
        lo, hi = self.short if kind == "short" else self.long
        return RequestSpec(text, self.rng.randint(lo, hi), arrival)

    def due(self) -> list[RequestSpec]:
        """The requests that arrive this round: a burst's, then the stream's."""
        now = self.clock()
        self._time += min(now - self._last, self.max_tick_s)
        self._last = now
        burst = [self.request(self._time) for _ in range(self._burst_left)]
        self._burst_left = 0
        return burst + self._stream.due(self._time)

    def __call__(self, engines: dict[str, Any]) -> None:
        """Before each round: add this round's arrivals to every engine."""
        again = self.spec.preset == "burst" and self.spec.repeat and self.refused is None
        if again and not self._burst_left:
            if all(not any(e.queue_sizes().values()) for e in engines.values()):
                self._burst_left = self.spec.count  # everyone is done: the opening again
        for r in self.due():
            full = self.spec.max_outstanding
            if any(sum(e.queue_sizes().values()) >= full for e in engines.values()):
                self.skipped += 1  # skipped for all engines alike, so the workloads stay equal
                continue
            for name, engine in engines.items():
                try:
                    engine.add_request(encode_prompt(engine, r.prompt), r.params())
                except ValueError as err:  # the engine's own refusal, naming the limit
                    self._refuse(name, err)
            self.sent += 1

    def _refuse(self, name: str, err: ValueError) -> None:
        """Say once why an engine refused a request, and send the repeating burst no more
        (its requests would be refused again at once, round after round)."""
        if self.refused is None:
            self.refused = f"{name}: {err}"
            log.warning("workload request refused by %s (%s); the burst is not sent again "
                        "until the workload or the settings change", name, err)  # fmt: skip
