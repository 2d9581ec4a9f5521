"""A stateful property test of the engine over FakeRunner (hypothesis' RuleBasedStateMachine).

Rules: add a request (prompts from two shared prefixes), step, fail a step (the runner
raises), fail then retry at once, abort any request ever added (live or ended). Prefix
caching, speculative drafts, both preemption modes, pools small enough to preempt. After
every rule the KV books hold (BlockManager.check: references equal tables, no held block
free, nothing leaked; pool and swap totals); a shadow of the pool, written as a runner
writes it and poisoned where a failed step may have written or copied, checks that every
row reads only slots holding its own tokens; at teardown the engine runs dry and every
block is free. A few examples in the fast tier, thousands under ``slow``.

The deterministic test below is the case this machine found first: a step that fails while
swapping a request in, then a retry, once decoded that request on blocks its KV was never
copied into.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minicb import SamplingParams
from minicb.core.runner.fake import FakeRunner
from minicb.core.scheduler import RequestRejected
from tests.helpers import ShadowKV, fake_engine

POISON = -1  # what a slot holds after a failed step may have written or copied it
PREFIXES = [[3 + (i * 7 + j * 5) % 60 for j in range(12)] for i in range(2)]


class InjectedFailure(RuntimeError):
    pass


class FailingRunner:
    """FakeRunner's execute, or, once ``fail_if(plan)`` is true, a failure (the plan kept,
    for the shadow to poison)."""

    def __init__(self, runner: FakeRunner) -> None:
        self.runner, self.fail_if, self.failed_plan = runner, None, None
        self.execute_real, runner.execute = runner.execute, self.execute

    def execute(self, plan):
        if self.fail_if is not None and self.fail_if(plan):
            self.fail_if, self.failed_plan = None, plan
            raise InjectedFailure("injected step failure")
        return self.execute_real(plan)


class PoisonedShadow(ShadowKV):
    def poison(self, plan) -> None:
        """Every slot the failed plan would have copied into or written now holds junk."""
        bs = self.bs
        for _, cpu in plan.swap_out_map:
            self.cpu.update({cpu * bs + i: POISON for i in range(bs)})
        for _, dev in plan.swap_in_map:
            self.device.update({dev * bs + i: POISON for i in range(bs)})
        for row in plan.scheduled:
            if row.store_kv:
                for i in range(len(row.token_ids)):
                    self.device[self.slot(row.block_table, row.start_position + i)] = POISON


config_st = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4]),
        "max_num_seqs": st.integers(1, 4),
        "max_num_batched_tokens": st.integers(2, 24),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.booleans(),
        "speculative": st.sampled_from(["off", "ngram"]),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_swap_blocks": st.integers(0, 24),
    }
)


class EngineMachine(RuleBasedStateMachine):
    @initialize(config=config_st, pool_tokens=st.integers(8, 48))
    def build(self, config, pool_tokens):
        self.bs = config["block_size"]
        self.engine = fake_engine(
            num_kv_blocks=max(2, pool_tokens // self.bs), max_model_len=48, **config
        )
        self.engine.runner.token_fn = lambda rid, i: 3 + (rid + i // 2) % 4  # repeats: drafts hit
        self.runner = FailingRunner(self.engine.runner)
        self.shadow = PoisonedShadow(self.bs)
        self.seqs: dict[int, list[int]] = {}
        self.ids: list[int] = []

    @rule(
        family=st.integers(0, 1),
        keep=st.integers(0, 12),
        tail=st.lists(st.integers(3, 60), max_size=6),
        max_tokens=st.integers(1, 10),
        stop_at=st.none() | st.integers(1, 10),
    )
    def add(self, family, keep, tail, max_tokens, stop_at):
        prompt = PREFIXES[family][:keep] + tail or [4]
        try:
            rid = self.engine.add_request(
                prompt, SamplingParams(max_tokens=max_tokens, temperature=0)
            )
        except RequestRejected:
            return
        if stop_at is not None:
            self.runner.runner.output_lengths[rid] = stop_at
        self.seqs[rid] = list(prompt)
        self.ids.append(rid)

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def step(self):
        result = self.engine.step()
        self.shadow.run(result.plan, lambda r: self.seqs[r.request_id])
        for delta in result.new_tokens:
            self.seqs[delta.request_id].append(delta.token_id)

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def fail_a_step(self):
        self.runner.fail_if = lambda plan: True
        with pytest.raises(InjectedFailure):
            self.engine.step()
        self.shadow.poison(self.runner.failed_plan)

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def fail_then_retry(self):
        self.fail_a_step()
        if self.engine.has_unfinished():
            self.step()

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        self.engine.abort_request(self.ids[pick % len(self.ids)])  # live or ended alike

    @invariant()
    def books_hold(self):
        blocks = self.engine.scheduler.blocks
        blocks.check()
        kv = self.engine.kv_snapshot()
        assert 0 <= kv.num_free <= kv.num_blocks and kv.num_swapped <= kv.num_swap_blocks
        assert set(kv.block_tables) | set(kv.swap_tables) <= set(self.engine.scheduler.requests)

    def teardown(self):
        steps = 0
        while self.engine.has_unfinished():
            self.step()
            steps += 1
            assert steps < 2000, "the engine stopped making progress"
        kv = self.engine.kv_snapshot()
        assert kv.num_used == 0 and kv.num_swapped == 0  # every block free (or evictable)
        self.engine.scheduler.blocks.check()


# Its depth is the hypothesis profile's (tests/conftest.py): tens of examples in the fast
# tier, thousands under --hypothesis-profile=thorough (make test-all, CI).
TestEngineMachine = EngineMachine.TestCase


def test_a_failed_swap_in_then_a_retry_reads_only_kv_that_was_written():
    engine = fake_engine(num_kv_blocks=6, max_model_len=64, block_size=2, preemption_mode="swap",
                         max_num_seqs=2, num_swap_blocks=16)  # fmt: skip
    runner, shadow, seqs = FailingRunner(engine.runner), PoisonedShadow(2), {}
    for rid_prompt in ([5, 6, 7], [8, 9, 10]):
        rid = engine.add_request(rid_prompt, SamplingParams(max_tokens=8, temperature=0))
        seqs[rid] = list(rid_prompt)
    runner.fail_if = lambda plan: bool(plan.swap_in_map)  # the first step that swaps in
    failed = retried = False
    while engine.has_unfinished():
        try:
            result = engine.step()
        except InjectedFailure:
            failed = True
            shadow.poison(runner.failed_plan)
            continue
        retried |= failed
        shadow.run(result.plan, lambda r: seqs[r.request_id])  # reads: no poison, no stranger
        for delta in result.new_tokens:
            seqs[delta.request_id].append(delta.token_id)
    assert failed and retried
    assert engine.kv_snapshot().num_used == 0
