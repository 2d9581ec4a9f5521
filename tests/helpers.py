"""Helpers shared by the tests: prompt sets, greedy runs, and the real engine over FakeRunner.

``wait_for`` is the one way tests wait for another thread (a server, the engine loop): it
polls a condition, and its timeout only bounds a hang; no test asserts a duration.

``fake_engine`` is the one way tests drive the engine without a model: the real
LLMEngine, scheduler, block manager and events over ``FakeRunner`` (token 7 every time,
no torch), on a ``VirtualClock`` that each step advances by the next scripted step time,
so every timestamp in the events is known exactly. Tests of the scheduler package may
read ``engine.scheduler`` for what the engine's views do not show.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from minicb import LLM
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.core.runner.fake import FakeRunner


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


def _shared_prompts() -> list[list[int]]:
    """Prompts that share prefixes: a common 37-token "system prompt" with varied tails,
    chat turns that each extend the previous turn, a repeated prompt (wholly cached), and
    one exactly two blocks long (every block cached, yet a token must be computed)."""
    system = mixed_prompts(1, vocab=256, seed=11, min_len=37, max_len=37)[0]
    tails = mixed_prompts(6, vocab=256, seed=12, min_len=1, max_len=12)
    turns = [system[:5]]
    for extra in mixed_prompts(4, vocab=256, seed=13, min_len=3, max_len=14):
        turns.append(turns[-1] + extra)
    return [system + t for t in tails] + turns + [system + tails[0], system[:32], system[:32]]


# The prompt set of the same-tokens tests (varied lengths: requests leave at different
# steps); the reference tokens are the ``mixed_reference`` fixture (tests/conftest.py).
MIXED = mixed_prompts(16, vocab=256, seed=3, min_len=1, max_len=40)
MIXED_MAX = [4 + (7 * i) % 23 for i in range(16)]

# The prefix-caching prompt set of the same-tokens tests, and their output lengths; the
# reference tokens are the ``shared_reference`` fixture (tests/conftest.py).
SHARED = _shared_prompts()
SHARED_MAX = [3 + (5 * i) % 17 for i in range(len(SHARED))]


def fake_engine(
    num_kv_blocks: int = 64,
    max_model_len: int = 256,
    *,
    step_times: Sequence[float] = (),
    step_time: float = 0.0,
    start: float = 0.0,
    tokenizer=None,
    **options,
) -> LLMEngine:
    """LLMEngine(config=EngineConfig.from_kwargs(**options)) over FakeRunner on a VirtualClock at
    ``start``; each step takes the next of ``step_times`` (then ``step_time``) seconds.
    Without a ``tokenizer``, prompts are token ids and output texts are ""."""
    config = EngineConfig.from_kwargs(**options)
    clock = VirtualClock(start)
    runner = FakeRunner(
        num_kv_blocks=num_kv_blocks,
        max_model_len=max_model_len,
        num_swap_blocks=config.num_swap_blocks,
        clock=clock,
        step_time=step_time,
        step_times=step_times,
        tokenizer=tokenizer,
    )
    return LLMEngine(config=config, runner=runner, clock=clock)


def add(
    engine: LLMEngine,
    prompt_len: int,
    max_tokens: int,
    priority: int = 0,
    arrival: float | None = None,
    token: int = 5,
) -> int:
    """Queue a greedy request of ``prompt_len`` copies of ``token``; returns its id."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return engine.add_request([token] * prompt_len, params, priority, arrival_time=arrival)


def wait_for(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    """Return once ``predicate()`` is true; fail if it is not within ``timeout`` seconds
    (a bound on a hang, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the awaited condition never came true"
        time.sleep(0.01)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (for a server in another process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_process(
    args: list[str], log: Path, timeout: float
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``minicb serve ARGS`` in a process of its own on a free port, once its /health
    answers 200: yields the process and its address; its output goes to ``log``. On the
    way out it gets SIGTERM (then a kill, past a minute) unless the test already ended it."""
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "minicb.cli", "serve", *args, "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=timeout)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class ShadowKV:
    """Which token each device and CPU KV slot holds, written as a runner would write it,
    for property tests over FakeRunner: a row must read only slots holding its own tokens.
    ``run(plan, seq_of)``: ``seq_of(row)`` is the row's whole token sequence so far."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.device: dict[int, int] = {}
        self.cpu: dict[int, int] = {}

    def copy(self, pairs, src: dict[int, int], dst: dict[int, int]) -> None:
        for a, b in pairs:
            for i in range(self.bs):
                if a * self.bs + i in src:
                    dst[b * self.bs + i] = src[a * self.bs + i]

    def slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.bs] * self.bs + pos % self.bs

    def run(self, plan, seq_of: Callable) -> None:
        self.copy(plan.swap_out_map, self.device, self.cpu)
        self.copy(plan.swap_in_map, self.cpu, self.device)
        for row in plan.scheduled:  # reads first: no row may see another's write
            seq = seq_of(row)
            for pos in range(row.start_position):
                held = self.device.get(self.slot(row.block_table, pos))
                assert held == seq[pos], f"request {row.request_id} reads a foreign or stale slot"
        for row in plan.scheduled:
            if row.store_kv:
                for i, tok in enumerate(row.token_ids):
                    self.device[self.slot(row.block_table, row.start_position + i)] = tok
