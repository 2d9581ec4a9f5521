"""The prefix cache's host tier (minicb/host_tier/tier.py), over FakeRunner.

A prefix the device pool evicts is copied to a host block and found there by the same
walk; a later prompt that begins with it gets it back by a copy and computes none of its
cached tokens. The events' kv_ops rebuild both tiers. A stateful property test (the house
style of test_engine_machine.py) adds the tier to random evictions, hits, aborts,
preemption in both modes and failed steps: a shadow of the device, swap and host blocks,
written as the runner writes them, checks that every row reads its own tokens (so a reload
copies the right KV, and a failed step's copies are never trusted), no block leaks from
either tier, and every block is free at teardown.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minicb import SamplingParams
from minicb.core.scheduler import RequestRejected
from minicb.host_tier.settings import HostTierSettings
from minicb.telemetry.kv_state import KVState
from tests.helpers import ShadowKV, fake_engine
from tests.scheduler.test_engine_machine import POISON, FailingRunner, InjectedFailure

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
PREFIX = list(range(10, 26))  # four blocks of 4


class TieredShadow(ShadowKV):
    """ShadowKV with the host tier, copied in the runner's order: the device's blocks are
    read (swap-outs, offloads) before any is written (swap-ins, reloads, the forward)."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.host: dict[int, int] = {}

    def run(self, plan, seq_of) -> None:
        self.copy(plan.swap_out_map, self.device, self.cpu)
        self.copy(plan.offload_map, self.device, self.host)
        self.copy(plan.swap_in_map, self.cpu, self.device)
        self.copy(plan.reload_map, self.host, self.device)
        super().run(replace(plan, swap_out_map=[], swap_in_map=[]), seq_of)

    def poison(self, plan) -> None:
        """Every slot a failed plan may have written or copied into now holds junk."""
        bs = self.bs
        for pairs, written in (
            (plan.swap_out_map, self.cpu),
            (plan.offload_map, self.host),
            (plan.swap_in_map, self.device),
            (plan.reload_map, self.device),
        ):
            for _, block in pairs:
                written.update({block * bs + i: POISON for i in range(bs)})
        for row in plan.scheduled:
            if row.store_kv:
                for i in range(len(row.token_ids)):
                    self.device[self.slot(row.block_table, row.start_position + i)] = POISON


def _kv_state_matches(state: KVState, engine) -> None:
    """The map rebuilt from the events is the engine's, both tiers, and so is one rebuilt
    from a snapshot taken now (a viewer that joins now)."""
    kv = engine.kv_snapshot()
    assert state.as_tuple() == (kv.block_tables, kv.swap_tables, kv.cached_blocks)
    blocks = engine.scheduler.blocks
    host = list(blocks.host.info) if blocks.host is not None else []
    assert state.host_cached_blocks == kv.host_cached_blocks == host
    joined = KVState.from_snapshot(engine.kv_snapshot_event())
    assert joined.host_cached_blocks == host


def _run(engine, prompts, shadow=None, state=None) -> dict[int, int]:
    """Run ``prompts`` one after another to the end; prompt tokens computed per request."""
    computed: dict[int, int] = {}
    seqs: dict[int, list[int]] = {}
    for prompt in prompts:
        rid = engine.add_request(prompt, GREEDY)
        seqs[rid] = list(prompt)
        computed[rid] = 0
        while engine.has_unfinished():
            result = engine.step()
            plan = result.plan
            for row in plan.scheduled:
                if row.request_id == rid and row.start_position < len(prompt):
                    computed[rid] += min(row.num_tokens, len(prompt) - row.start_position)
            if shadow is not None:
                shadow.run(plan, lambda r: seqs[r.request_id])
            if state is not None:
                state.apply(plan.kv_ops)
                _kv_state_matches(state, engine)
            for delta in result.new_tokens:
                seqs[delta.request_id].append(delta.token_id)
            engine.scheduler.blocks.check()
    return computed


def _evicting_run(offload: int):
    """A prompt, then two others that need the whole device pool (evicting its cached
    blocks), then the first prompt's prefix again with a new tail."""
    engine = fake_engine(num_kv_blocks=6, block_size=4, kv_offload_blocks=offload)
    shadow, state = TieredShadow(4), KVState.from_snapshot(engine.kv_snapshot_event())
    prompts = [PREFIX + [90], list(range(30, 51)), list(range(60, 81)), PREFIX + [91, 92]]
    return engine, _run(engine, prompts, shadow, state)


def test_an_evicted_prefix_comes_back_from_the_host_tier_and_is_not_recomputed():
    engine, computed = _evicting_run(offload=16)
    assert computed[max(computed)] == 2  # its own tail: the 4 prefix blocks came back
    # Offloaded: the prefix's 4 blocks, the second prompt's 5, and 4 of the third's (the
    # reloads took one free block and evicted 4 of its 5 cached ones).
    assert engine.scheduler.blocks.host.num_used == 4 + 5 + 4


def test_without_the_tier_the_evicted_prefix_is_computed_again():
    _, computed = _evicting_run(offload=0)
    assert computed[max(computed)] == len(PREFIX) + 2


def test_the_tier_counts_host_hits_and_says_so_in_the_reason():
    engine = fake_engine(num_kv_blocks=6, block_size=4, kv_offload_blocks=16)
    prompts = [PREFIX + [90], list(range(30, 51)), list(range(60, 81))]
    _run(engine, prompts)
    engine.add_request(PREFIX + [91, 92], GREEDY)
    plan = engine.step().plan
    assert plan.prefix_hit_tokens == plan.prefix_host_hit_tokens == 16
    assert len(plan.reload_map) == 4 and plan.kv_host_cached == 4 + 5 + 4
    assert "4 copied back from the host tier" in plan.admitted[0].reason
    assert [op[0] for op in plan.kv_ops][:3] == ["uncache", "offload", "reload"]


def test_a_failed_step_forgets_its_copies_and_the_retry_reads_only_copied_kv():
    engine = fake_engine(num_kv_blocks=6, block_size=4, kv_offload_blocks=16)
    runner, shadow = FailingRunner(engine.runner), TieredShadow(4)
    state = KVState.from_snapshot(engine.kv_snapshot_event())
    _run(engine, [PREFIX + [90], list(range(30, 51))], shadow, state)
    runner.fail_if = lambda plan: bool(plan.reload_map or plan.offload_map)
    prompts = {}
    for prompt in (list(range(60, 81)), PREFIX + [91, 92]):  # offloads, then reloads
        rid = engine.add_request(prompt, GREEDY)
        prompts[rid] = list(prompt)
        with pytest.raises(InjectedFailure):
            engine.step()
        failed = runner.failed_plan
        shadow.poison(failed)
        host = engine.scheduler.blocks.host
        assert not {h for _, h in failed.offload_map} & set(host.info)  # never copied
        cached = engine.scheduler.blocks.cache.info
        assert not {d for _, d in failed.reload_map} & set(cached)  # never copied into
        runner.fail_if = lambda plan: bool(plan.reload_map or plan.offload_map)
        while engine.has_unfinished():
            runner.fail_if = None
            result = engine.step()
            shadow.run(result.plan, lambda r: prompts[r.request_id])  # no poison is read
            state.apply(result.plan.kv_ops)
            _kv_state_matches(state, engine)
            for delta in result.new_tokens:
                prompts[delta.request_id].append(delta.token_id)
            engine.scheduler.blocks.check()
        runner.fail_if = lambda plan: bool(plan.reload_map or plan.offload_map)
    assert engine.kv_snapshot().num_used == 0


# ---- the property test -----------------------------------------------------------------
PREFIXES = [[3 + (i * 7 + j * 5) % 60 for j in range(12)] for i in range(3)]

config_st = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4]),
        "max_num_seqs": st.integers(1, 4),
        "max_num_batched_tokens": st.integers(2, 24),
        "enable_chunked_prefill": st.booleans(),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_swap_blocks": st.integers(0, 16),
        "kv_offload_blocks": st.integers(1, 24),
        "speculative": st.sampled_from(["off", "ngram"]),
    }
)


class TieredMachine(RuleBasedStateMachine):
    """Random adds from three shared prefixes, steps, failed steps, retries and aborts on a
    pool small enough to evict and preempt, speculative drafts on or off, the host tier on."""

    @initialize(config=config_st, pool_tokens=st.integers(8, 40))
    def build(self, config, pool_tokens):
        self.bs = config["block_size"]
        self.engine = fake_engine(
            num_kv_blocks=max(2, pool_tokens // self.bs), max_model_len=48, **config
        )
        self.engine.runner.token_fn = lambda rid, i: 3 + (rid + i // 2) % 4  # repeats: drafts hit
        self.runner = FailingRunner(self.engine.runner)
        self.shadow = TieredShadow(self.bs)
        self.state = KVState.from_snapshot(self.engine.kv_snapshot_event())
        self.seqs: dict[int, list[int]] = {}
        self.ids: list[int] = []
        self.host_hits = 0

    @rule(
        family=st.integers(0, 2),
        keep=st.integers(4, 12),  # mostly a shared prefix: hits, evictions, hits again
        tail=st.lists(st.integers(3, 60), max_size=3),
        max_tokens=st.integers(1, 8),
    )
    def add(self, family, keep, tail, max_tokens):
        prompt = PREFIXES[family][:keep] + tail or [4]
        try:
            rid = self.engine.add_request(
                prompt, SamplingParams(max_tokens=max_tokens, temperature=0)
            )
        except RequestRejected:
            return
        self.seqs[rid] = list(prompt)
        self.ids.append(rid)

    @precondition(lambda self: self.engine.has_unfinished())
    @rule()
    def step(self):
        result = self.engine.step()
        self.shadow.run(result.plan, lambda r: self.seqs[r.request_id])
        self.state.apply(result.plan.kv_ops)
        _kv_state_matches(self.state, self.engine)
        self.host_hits += result.plan.prefix_host_hit_tokens
        for delta in result.new_tokens:
            self.seqs[delta.request_id].append(delta.token_id)

    @precondition(lambda self: self.engine.has_unfinished())
    @rule(then_retry=st.booleans())
    def fail_a_step(self, then_retry):
        self.runner.fail_if = lambda plan: True
        with pytest.raises(InjectedFailure):
            self.engine.step()
        self.shadow.poison(self.runner.failed_plan)
        if then_retry and self.engine.has_unfinished():
            self.step()

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        self.engine.abort_request(self.ids[pick % len(self.ids)])  # live or ended alike

    @invariant()
    def books_hold(self):
        blocks = self.engine.scheduler.blocks
        blocks.check()  # both tiers: references, keys, nothing leaked
        assert blocks.host.num_used <= blocks.host.num_blocks
        assert not blocks.host.offloads and not blocks.host.reloads and not blocks.host.pinned

    def teardown(self):
        steps = 0
        while self.engine.has_unfinished():
            self.step()
            steps += 1
            assert steps < 2000, "the engine stopped making progress"
        kv = self.engine.kv_snapshot()
        assert kv.num_used == 0 and kv.num_swapped == 0  # every block free (or evictable)
        self.engine.scheduler.blocks.check()
        target(float(self.host_hits), label="host hit tokens")  # steer towards the tier


# No example database: a clean clone (CI) starts it empty and throws it away, and with a
# target() hypothesis keeps the Pareto front of every run in it, which was half of this
# machine's time. A failure still prints its shrunk steps and how to reproduce them.
# Its depth is the hypothesis profile's (tests/conftest.py): tens of examples in the fast
# tier, thousands under --hypothesis-profile=thorough (make test-all, CI).
class TestTieredMachine(TieredMachine.TestCase):
    settings = settings(database=None)


def test_metrics_count_hits_by_tier():
    from prometheus_client.parser import text_string_to_metric_families

    from minicb.telemetry.metrics import MetricsCollector
    from minicb.telemetry.prometheus import PrometheusMetrics

    engine = fake_engine(num_kv_blocks=6, block_size=4, kv_offload_blocks=16)
    collector, prom = MetricsCollector(), PrometheusMetrics()
    engine.bus.subscribe(collector)
    engine.bus.subscribe(prom)
    _run(engine, [PREFIX + [90], list(range(30, 51)), list(range(60, 81)), PREFIX + [91, 92]])
    cache = collector.summary()["prefix_cache"]
    assert (cache["hit_tokens"], cache["host_hit_tokens"]) == (16, 16)
    tiers = {
        s.labels["tier"]: s.value
        for family in text_string_to_metric_families(prom.exposition().decode())
        for s in family.samples
        if s.name == "minicb:prefix_cache_hits_by_tier_total"
    }
    assert tiers == {"device": 0.0, "host": 16.0}


def test_the_option_is_validated_on_the_command_line_and_described():
    import argparse

    from minicb.core.config import EngineConfig
    from minicb.engine_options import add_engine_options, engine_kwargs

    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    kwargs = engine_kwargs(parser.parse_args(["--kv-offload-blocks", "12"]))
    assert HostTierSettings.of(EngineConfig.from_kwargs(**kwargs)).kv_offload_blocks == 12
    assert HostTierSettings.of(EngineConfig()).kv_offload_blocks == 0  # off by default
    with pytest.raises(ValueError, match="kv_offload_blocks must be >= 0"):
        EngineConfig.from_kwargs(kv_offload_blocks=-1)
    with pytest.raises(ValueError, match="needs enable_prefix_caching"):
        EngineConfig.from_kwargs(kv_offload_blocks=4, enable_prefix_caching=False)
    engine = fake_engine(kv_offload_blocks=5)
    assert engine.describe()["config"]["kv_offload_blocks"] == 5
    assert engine.scheduler.blocks.host.num_blocks == 5


def test_the_tier_enters_through_the_cache_tier_registry(monkeypatch):
    """The core names no tier: the block manager builds the one registered as "host"
    (minicb/host_tier/__init__.py); where nobody imported that package, asking for a tier
    says which import registers it."""
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.core.scheduler.cache_tier import CACHE_TIERS
    from minicb.host_tier.tier import HostTier

    assert isinstance(BlockManager(4, 2, 0, True, 3).host, HostTier)
    assert BlockManager(4, 2, 0, True, 0).host is None  # no tier asked for
    monkeypatch.delitem(CACHE_TIERS, "host")
    assert BlockManager(4, 2, 0, True, 0).host is None  # a plain one needs no registry
    unregistered = r"'host' cache tier, which is not registered.*import minicb\.features first"
    with pytest.raises(ValueError, match=unregistered):
        BlockManager(4, 2, 0, True, 3)


def test_a_hit_whose_first_block_is_on_the_host_but_a_later_one_is_held():
    """Found by the machine above: two requests computed one prefix at once, so one's first
    block went unkeyed while its later blocks chained from the other's key; that keyed
    first block then fell to the host tier. A prompt with that prefix finds its first block
    on the host and the next one held by a running request: the admission's reason names
    the holder of the first shared block (it once looked up the host hit's block, None)."""
    m = TieredMachine()
    m.build(
        pool_tokens=34,
        config={
            "preemption_mode": "swap", "max_num_batched_tokens": 4, "speculative": "off",
            "max_num_seqs": 4, "block_size": 2, "kv_offload_blocks": 17, "num_swap_blocks": 11,
            "enable_chunked_prefill": True,
        },
    )  # fmt: skip
    script = [
        (2, 12, 3, []), None, (1, 5, 2, []), None, (0, 6, 1, []), None, None,
        (0, 11, 8, [32]), None, (1, 6, 2, [17, 6]), (0, 11, 6, []), (2, 12, 7, [5, 14, 42]),
        None, None, (2, 9, 5, [19, 30, 20]), (0, 7, 1, [7, 42]), (2, 8, 8, [48, 11]), None,
        (2, 4, 1, [41, 46, 10]), (0, 4, 5, []), None, (0, 10, 5, [40]), (2, 12, 3, []), None,
        (2, 8, 1, [36]), None, None,
    ]  # fmt: skip
    for add in script:
        if add is None:
            m.step()
        else:
            family, keep, max_tokens, tail = add
            m.add(family=family, keep=keep, tail=tail, max_tokens=max_tokens)
        m.books_hold()
    while m.engine.has_unfinished():
        m.step()
    assert m.host_hits > 0
    m.engine.scheduler.blocks.check()


def test_with_overlap_scheduling_the_prefix_still_comes_back_from_the_host():
    """Plan N+1 is made while N runs: N+1's copies run after N's, so a host block N filled
    can be reloaded by N+1, and the pins of one plan need not outlive its schedule."""
    engine = fake_engine(
        num_kv_blocks=6, block_size=4, kv_offload_blocks=16, overlap_scheduling=True
    )
    host = 0
    for prompt in (PREFIX + [90], list(range(30, 51)), list(range(60, 81)), PREFIX + [91, 92]):
        engine.add_request(prompt, GREEDY)
        while engine.has_unfinished():
            result = engine.step()
            host += result.plan.prefix_host_hit_tokens
            engine.scheduler.blocks.check()
    assert host == 16 and engine.kv_snapshot().num_used == 0
