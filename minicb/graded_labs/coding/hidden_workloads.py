"""The coding lab's held-back workloads, and one run of an engine over one of them.

A workload is a list of arrivals (the iteration a request arrives in, its prompt, its
``max_tokens``) with the engine's limits. They are drawn from the teacher's seed, by shape:

- ``burst``: two waves of requests arriving at once, some prompts longer than what is
  left of the budget (chunking binds), in a pool that holds several of them;
- ``stream``: a steady stream of short chats and a few long prompts among them (a policy
  that lets short requests pass can starve the long ones);
- ``pressure``: long outputs in a small pool, so running requests are preempted and wait
  again, to be recomputed;
- ``tiny``: a few requests for the tiny real model (its vocabulary, its context).

``run`` drives an engine through a workload on the fake runner (or the real model) and a
virtual clock, and measures, per request, when it arrived, its longest wait in the queue
(a preempted request waits again), when it got its first token and what tokens it got;
and for the run, its iterations and the KV blocks still held at the end. The fake
runner's n-th token of a request depends on the request's id and n: runs that serve the
same requests give the same tokens, whatever the order.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams

SHAPES = ("burst", "stream", "pressure", "tiny")


@dataclass(frozen=True)
class Workload:
    shape: str
    arrivals: list[tuple[int, list[int], int]]  # (iteration, prompt ids, max_tokens)
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    block_size: int

    def to_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Workload:
        arrivals = [(step, list(prompt), n) for step, prompt, n in data.pop("arrivals")]
        return cls(arrivals=arrivals, **data)


def draw(shape: str, rng: random.Random) -> Workload:
    """One workload of ``shape``, its sizes drawn from ``rng``."""

    def prompt(n: int) -> list[int]:
        return [rng.randrange(3, 250) for _ in range(n)]

    if shape == "burst":
        arrivals = [(1 + 40 * (i // 16), prompt(rng.randint(8, 64)), rng.randint(4, 24))
                    for i in range(32)]  # fmt: skip
        return Workload(shape, arrivals, 8, rng.choice((128, 192, 256)), 96, 16)
    if shape == "stream":
        arrivals = [(1 + 2 * i + rng.randint(0, 1), prompt(rng.randint(16, 56)),
                     rng.randint(8, 32)) for i in range(90)]  # fmt: skip
        for at in rng.sample(range(20, 120), 2):
            arrivals.append((at, prompt(rng.randint(260, 320)), 8))
        return Workload(shape, sorted(arrivals, key=lambda a: a[0]), 8, 256, 40, 16)
    if shape == "pressure":
        arrivals = [(rng.randint(1, 10), prompt(rng.randint(20, 60)), rng.randint(60, 120))
                    for _ in range(14)]  # fmt: skip
        return Workload(shape, sorted(arrivals, key=lambda a: a[0]), 8, 128, 30, 16)
    if shape == "tiny":
        arrivals = [(rng.randint(1, 6), prompt(rng.randint(4, 40)), rng.randint(3, 8))
                    for _ in range(8)]  # fmt: skip
        return Workload(shape, sorted(arrivals, key=lambda a: a[0]), 4, 32, 14, 4)
    raise ValueError(f"unknown workload shape {shape!r}; choose from {', '.join(SHAPES)}")


def draw_all(seed: int, shapes: list[str]) -> list[Workload]:
    """The workloads of a grading: one per shape listed, all from one seed."""
    rng = random.Random(seed)
    return [draw(shape, rng) for shape in shapes]


def fake_token(request_id: int, index: int) -> int:
    return 3 + (request_id * 131 + index * 17) % 240


def run(workload: Workload, admit: Any = None, *, model: str | None = None,
        step_cap: int = 5000, on_choice: Any = None) -> dict[str, Any]:  # fmt: skip
    """Serve ``workload`` with ``admit`` (None: the engine's own admission) and measure it.

    On the fake runner, or on the real model in the folder ``model`` (float32, greedy).
    Stops when every request has finished or after ``step_cap`` iterations."""
    from minicb.core.engine import LLMEngine
    from minicb.core.runner import VirtualClock
    from minicb.core.runner.fake import FakeRunner
    from minicb.graded_labs.coding.plug import policy_engine

    config = EngineConfig(max_num_seqs=workload.max_num_seqs, block_size=workload.block_size,
                          max_num_batched_tokens=workload.max_num_batched_tokens,
                          num_kv_blocks=workload.num_kv_blocks, enable_prefix_caching=False,
                          dtype="float32")  # fmt: skip
    clock = VirtualClock()
    runner = None
    if model is None:
        runner = FakeRunner(num_kv_blocks=workload.num_kv_blocks, max_model_len=1024,
                            vocab_size=256, token_fn=fake_token, clock=clock)  # fmt: skip
    if admit is None:
        engine = LLMEngine(model, config, runner=runner, clock=clock)
    else:
        engine = policy_engine(admit, config, on_choice=on_choice, model=model, runner=runner,
                               clock=clock)  # fmt: skip
    arrived: dict[int, int] = {}
    queued_since: dict[int, int] = {}  # the iteration it (re)joined the waiting queue
    longest_wait: dict[int, int] = {}  # its longest stay there, in iterations
    first_token: dict[int, int] = {}
    tokens: dict[int, list[int]] = {}
    preemptions = 0
    pending = list(workload.arrivals)
    step = 0
    while step < step_cap and (pending or engine.has_unfinished()):
        step += 1
        while pending and pending[0][0] <= step:
            _, prompt, max_tokens = pending.pop(0)
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            rid = engine.add_request(prompt, params)
            arrived[rid] = queued_since[rid] = step
        if not engine.has_unfinished():
            continue  # an idle iteration: nobody has arrived yet
        result = engine.step()
        for decision in result.plan.admitted:
            rid = decision.request_id
            waited = step - queued_since.pop(rid)
            longest_wait[rid] = max(waited, longest_wait.get(rid, 0))
        for decision in result.plan.preempted:
            queued_since[decision.request_id] = step + 1  # waits again from the next one
            preemptions += 1
        for delta in result.new_tokens:
            first_token.setdefault(delta.request_id, step)
        for out in result.finished:
            tokens[out.request_id] = list(out.token_ids)
        clock.advance(0.05)
    return {
        "steps": step,
        "arrived": arrived,
        "longest_wait": longest_wait,  # the not yet admitted are in "waiting_since"
        "waiting_since": queued_since,
        "preemptions": preemptions,
        "first_token": first_token,
        "tokens": tokens,
        "unfinished": len(arrived) - len(tokens) + len(pending),
        "blocks_held": engine.kv_snapshot().num_used,
    }
