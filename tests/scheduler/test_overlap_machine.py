"""A stateful property test of overlap scheduling over FakeRunner (a RuleBasedStateMachine,
as tests/scheduler/test_engine_machine.py is for the plain step loop).

Rules: add a request (prompts from two shared prefixes, some stopped early by a stop
token), step, fail the next plan (the failure surfaces at the step after the one that
launched it, once the plan after it was made), abort any request ever added. Prefix
caching, both preemption modes, static and continuous batching, pools small enough to
preempt. After every rule the KV
books hold and no request holds a placeholder but the one its plan in flight will fill;
every row reads only slots holding its own tokens (a shadow pool, poisoned where a
failed plan may have written); speculative drafts on or off (with drafts the tokens
repeat, so drafts are accepted, and a plan that verifies drafts is waited for before the
next is made); every finished output is exactly the tokens FakeRunner
gives (so no extra row's token and no placeholder ever reached one), and what was
streamed adds up to it. At teardown the engine runs dry, nothing is in flight, and every
block is free: overlap never leaks one. A few examples fast, more under ``slow``.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minicb import SamplingParams
from minicb.core.scheduler import RequestRejected
from minicb.overlap.bookkeeping import PLACEHOLDER
from tests.helpers import fake_engine
from tests.scheduler.test_engine_machine import FailingRunner, InjectedFailure, PoisonedShadow

PREFIXES = [[3 + (i * 7 + j * 5) % 60 for j in range(12)] for i in range(2)]
STOP = 2  # FakeRunner's stop token


def token_of(rid: int, index: int) -> int:
    return 3 + (rid * 5 + index * 3) % 50


def repeating_token_of(rid: int, index: int) -> int:
    """A cycle of three: the n-gram lookup soon finds drafts that are accepted."""
    return 3 + (rid + index) % 3


config_st = st.fixed_dictionaries(
    {
        "batching": st.sampled_from(["continuous", "continuous", "static"]),
        "block_size": st.sampled_from([1, 2, 4]),
        "max_num_seqs": st.integers(1, 4),
        "max_num_batched_tokens": st.integers(2, 24),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.booleans(),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_swap_blocks": st.integers(0, 24),
        "speculative": st.sampled_from(["off", "ngram"]),
        "num_speculative_tokens": st.integers(1, 4),
    }
)


class OverlapMachine(RuleBasedStateMachine):
    @initialize(config=config_st, pool_tokens=st.integers(12, 48))
    def build(self, config, pool_tokens):
        self.bs = config["block_size"]
        self.engine = fake_engine(
            num_kv_blocks=max(3, pool_tokens // self.bs),
            max_model_len=48,
            overlap_scheduling=True,
            **config,
        )
        self.token_of = token_of if config["speculative"] == "off" else repeating_token_of
        self.engine.runner.token_fn = self.token_of
        self.runner = FailingRunner(self.engine.runner)
        self.shadow = PoisonedShadow(self.bs)
        self.seqs: dict[int, list[int]] = {}  # prompt, then every token streamed
        self.prompt_len: dict[int, int] = {}
        self.expected: dict[int, list[int]] = {}  # the whole output if it is not aborted
        self.ids: list[int] = []
        self.aborted: set[int] = set()

    @rule(
        family=st.integers(0, 1),
        keep=st.integers(0, 12),
        tail=st.lists(st.integers(3, 60), max_size=6),
        max_tokens=st.integers(1, 8),
        stop_at=st.none() | st.integers(1, 8),
    )
    def add(self, family, keep, tail, max_tokens, stop_at):
        prompt = PREFIXES[family][:keep] + tail or [4]
        try:
            rid = self.engine.add_request(
                prompt, SamplingParams(max_tokens=max_tokens, temperature=0)
            )
        except RequestRejected:
            return
        n = max_tokens
        if stop_at is not None and stop_at <= max_tokens:
            self.engine.runner.output_lengths[rid] = stop_at
            n = stop_at
        self.expected[rid] = [self.token_of(rid, i) for i in range(n - 1)]
        self.expected[rid].append(STOP if n == stop_at else self.token_of(rid, n - 1))
        self.seqs[rid], self.prompt_len[rid] = list(prompt), len(prompt)
        self.ids.append(rid)

    def _step(self):
        """One step; False if it raised the injected failure (then the shadow is poisoned)."""
        try:
            result = self.engine.step()
        except InjectedFailure:
            self.shadow.poison(self.runner.failed_plan)
            assert self.engine.strategy.in_flight is None
            return False
        self.shadow.run(result.plan, lambda r: self.seqs[r.request_id])
        for delta in result.new_tokens:
            assert delta.request_id not in self.aborted, "a token after its abort"
            self.seqs[delta.request_id].append(delta.token_id)
        for out in result.finished:
            assert out.token_ids == self.expected[out.request_id]
            assert self.seqs[out.request_id][self.prompt_len[out.request_id] :] == out.token_ids
        return True

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def step(self):
        self._step()

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def fail_the_next_plan(self):
        # The next plan made: launched by the next step, it raises at the one after, which
        # waits for it. (Not "the next plan the worker runs": whether the worker has begun
        # the plan in flight depends on the machine's load, and the test on nothing.)
        target = self.engine.step_count + 1
        self.runner.fail_if = lambda plan: plan.step == target
        for _ in range(3):
            if not self.engine.has_unfinished() or not self._step():
                break
        self.runner.fail_if = None

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        rid = self.ids[pick % len(self.ids)]
        if self.engine.abort_request(rid):
            self.aborted.add(rid)

    @invariant()
    def books_hold(self):
        self.engine.scheduler.blocks.check()
        kv = self.engine.kv_snapshot()
        assert set(kv.block_tables) | set(kv.swap_tables) <= set(self.engine.scheduler.requests)
        in_flight = self.engine.strategy.in_flight
        pending = set() if in_flight is None else {r.request_id for r in in_flight.plan.scheduled}
        for rid, req in self.engine.scheduler.requests.items():
            placeholders = req.output_token_ids.count(PLACEHOLDER)
            assert placeholders == 0 or (placeholders == 1 and rid in pending)
            if placeholders:
                assert req.output_token_ids[-1] == PLACEHOLDER

    def teardown(self):
        steps = 0
        while self.engine.has_unfinished():
            self._step()
            steps += 1
            assert steps < 2000, "the engine stopped making progress"
        assert self.engine.strategy.in_flight is None
        kv = self.engine.kv_snapshot()
        assert kv.num_used == 0 and kv.num_swapped == 0  # overlap leaked no block
        self.engine.scheduler.blocks.check()


# Its depth is the hypothesis profile's (tests/conftest.py): tens of examples in the fast
# tier, thousands under --hypothesis-profile=thorough (make test-all, CI).
TestOverlapMachine = OverlapMachine.TestCase
