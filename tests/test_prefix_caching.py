"""Prefix caching: shared blocks, their reference counts, the evictable cache, and the
bugs other small engines shipped with it (each test names the one it guards against).

The block manager is driven directly where the bookkeeping is the point, and the real
engine over FakeRunner where the scheduler's decisions are.
"""

import argparse
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from minicb import LLM, SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.scheduler.block_manager import BlockManager
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.telemetry.event_json import plan_from_dict, plan_to_dict
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.prometheus import PrometheusMetrics
from tests.helpers import fake_engine
from tests.test_i18n import _reason_patterns, _reasons_of_a_run

GREEDY = SamplingParams(max_tokens=3, temperature=0.0)


def _tokens(n: int, start: int = 10) -> list[int]:
    return list(range(start, start + n))


def _slice(tokens: list[int]):
    return lambda a, b: tokens[a:b]


def _filled(bm: BlockManager, rid: int, tokens: list[int]) -> list[int]:
    """Allocate ``tokens`` for ``rid`` from the cache, as the scheduler does, and key its
    full blocks as if the step had written them; returns its table."""
    hits = bm.lookup(_slice(tokens), len(tokens))
    assert bm.allocate_slots(rid, len(tokens), hits) is not None
    bm.commit(rid, len(tokens), _slice(tokens))
    return bm.block_table(rid)


# ---- the block manager ---------------------------------------------------------------------
def test_a_shared_prefix_is_one_set_of_blocks_with_counted_references():
    bm = BlockManager(num_blocks=8, block_size=4, enable_caching=True)
    a = _filled(bm, 1, _tokens(10))
    b = _filled(bm, 2, _tokens(8) + [99, 98, 97])
    assert b[:2] == a[:2] and b[2] != a[2]
    assert [bm.ref_counts[x] for x in a] == [2, 2, 1] and bm.num_shared_blocks == 2
    bm.free(1)
    assert bm.ref_counts[a[0]] == 1 and bm.block_table(2) == b  # still held by request 2
    bm.check()


def test_lookup_is_capped_so_a_wholly_cached_prompt_still_computes_a_token():
    bm = BlockManager(num_blocks=8, block_size=4, enable_caching=True)
    _filled(bm, 1, _tokens(8))
    bm.free(1)
    # Both blocks are cached, but the last token's logits are needed: only one is used.
    hits = bm.lookup(_slice(_tokens(8)), 8)
    assert len(hits) == 1
    assert len(bm.lookup(_slice(_tokens(9)), 9)) == 2


def test_a_hit_on_an_evictable_block_takes_it_back_with_its_key():
    bm = BlockManager(num_blocks=4, block_size=4, enable_caching=True)
    table = _filled(bm, 1, _tokens(9))
    bm.free(1)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2  # the third was partial
    hits = bm.lookup(_slice(_tokens(9)), 9)
    assert [b for b, _ in hits] == table[:2]
    bm.allocate_slots(2, 9, hits)
    for block, key in hits:  # the key and contents survive being taken back
        info = bm.cache.info[block]
        assert info.key == key and bm.cache.by_prefix[(info.parent, info.tokens)] == block
    assert bm.num_cached_blocks == 0 and bm.num_used_blocks == 3
    bm.check()


def test_an_evictable_hit_counts_against_the_free_blocks_but_needs_no_new_one():
    bm = BlockManager(num_blocks=3, block_size=4, enable_caching=True)
    _filled(bm, 1, _tokens(9))  # three blocks, all held
    bm.free(1)  # all three evictable
    hits = bm.lookup(_slice(_tokens(12)), 12)  # 2 hits + 1 new block = the whole pool
    assert len(hits) == 2 and bm.allocate_slots(2, 12, hits) == [2]
    assert bm.allocate_slots(3, 1) is None  # nothing left, and nothing changed
    bm.check()


def test_eviction_takes_unkeyed_blocks_first_then_the_least_recently_freed():
    bm = BlockManager(num_blocks=4, block_size=2, enable_caching=True)
    first = _filled(bm, 1, [1, 2, 3])  # blocks 0 (keyed) and 1 (partial)
    bm.free(1)
    assert bm.allocate_slots(2, 6) == [2, 3, 1]  # the keyed block 0 is last to go
    assert first[0] in bm.cache.evictable
    bm.allocate_slots(2, 8)
    assert bm.block_table(2)[-1] == first[0] and first[0] not in bm.cache.info
    bm.check()


def test_a_duplicate_block_never_replaces_a_page_another_request_holds():
    # Two requests compute the same prompt in the same step (neither could hit): the
    # second's copy is not keyed, and nobody's table is rewritten to "deduplicate" it.
    bm = BlockManager(num_blocks=8, block_size=4, enable_caching=True)
    tokens = _tokens(9)
    bm.allocate_slots(1, 9)
    bm.allocate_slots(2, 9)
    bm.commit(1, 9, _slice(tokens))
    bm.commit(2, 9, _slice(tokens))
    t1, t2 = bm.block_table(1), bm.block_table(2)
    assert set(t1).isdisjoint(t2)
    assert all(bm.cache.info[b] for b in t1[:2]) and not set(t2) & set(bm.cache.info)
    bm.free(1)  # the keyed originals become evictable; request 2's copies stay its own
    assert bm.block_table(2) == t2 and all(bm.ref_counts[b] == 1 for b in t2)
    bm.check()


def test_swapping_out_a_sharer_copies_the_shared_block_and_drops_one_reference():
    bm = BlockManager(num_blocks=8, block_size=4, num_swap_blocks=8, enable_caching=True)
    a = _filled(bm, 1, _tokens(9))
    b = _filled(bm, 2, _tokens(8) + [50])
    pairs = bm.swap_out(2)
    assert [d for d, _ in pairs] == b  # the shared blocks are copied too
    assert bm.block_table(1) == a and [bm.ref_counts[x] for x in a] == [1, 1, 1]
    back = bm.swap_in(2, 9)  # (cpu block, device block) pairs: every swapped block returns
    assert [cpu for cpu, _ in back] == [cpu for _, cpu in pairs]
    bm.commit(2, 8, _slice(_tokens(8) + [50]))  # the originals are still keyed
    assert set(bm.block_table(2)).isdisjoint(a)
    bm.check()


def test_caching_off_keeps_one_owner_per_block():
    bm = BlockManager(num_blocks=4, block_size=4)
    _filled(bm, 1, _tokens(9))
    assert bm.lookup(_slice(_tokens(9)), 9) == []
    bm.free(1)
    assert bm.num_cached_blocks == 0 and not bm.cache.info


# ---- the scheduler, over FakeRunner -------------------------------------------------------
def test_admission_says_what_the_cache_supplied_and_skips_it():
    engine = fake_engine(num_kv_blocks=16, block_size=16, enable_prefix_caching=True)
    engine.add_request(_tokens(40), GREEDY)
    engine.step()
    rid = engine.add_request(_tokens(32) + [1] * 8, GREEDY)
    plan = engine.step().plan
    (admitted,) = plan.admitted
    assert admitted.num_cached_tokens == 32
    assert admitted.reason.endswith(
        "32 of 40 prompt tokens found in the cache: 2 blocks shared with request 0"
    )
    row = next(r for r in plan.scheduled if r.request_id == rid)
    assert (row.start_position, row.num_tokens, row.context_len) == (32, 8, 40)
    assert plan.kv_shared == 2 and (plan.prefix_query_tokens, plan.prefix_hit_tokens) == (40, 32)


def test_a_preempted_request_resumes_from_its_own_cached_blocks_with_the_right_count():
    # The index error several small engines hit: after a recompute preemption, the tokens
    # scheduled must be (all tokens - cached), starting where the cache ends.
    engine = fake_engine(
        num_kv_blocks=6, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )
    sched = engine.scheduler
    engine.add_request(_tokens(9), SamplingParams(max_tokens=12, temperature=0.0))
    engine.add_request(_tokens(9, start=100), SamplingParams(max_tokens=12, temperature=0.0))
    resumed = []
    while engine.has_unfinished():
        plan = engine.step().plan
        for d in plan.admitted:
            if d.num_cached_tokens and "recompute" in d.reason:
                row = next(r for r in plan.scheduled if r.request_id == d.request_id)
                all_tokens = 9 + row.num_output_tokens  # as the step began
                resumed.append(row)
                assert row.start_position == d.num_cached_tokens
                assert row.start_position + row.num_tokens == all_tokens and row.samples
        sched.blocks.check()
    assert resumed
    assert engine.kv_snapshot().num_used == 0


def test_a_prompt_whose_every_block_is_cached_computes_its_last_block():
    engine = fake_engine(num_kv_blocks=8, block_size=4, enable_prefix_caching=True)
    engine.add_request(_tokens(8), GREEDY)
    engine.run_until_done()
    engine.add_request(_tokens(8), GREEDY)
    plan = engine.step().plan
    (row,) = plan.scheduled
    assert (row.start_position, row.num_tokens, row.samples) == (4, 4, True)
    assert "1 taken back from the evictable cached blocks" in plan.admitted[0].reason


def test_aborting_a_sharer_leaves_the_other_its_blocks():
    engine = fake_engine(num_kv_blocks=16, block_size=4, enable_prefix_caching=True)
    a = engine.add_request(_tokens(12), SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    b = engine.add_request(_tokens(12), SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    shared = engine.block_table(a)[:2]
    assert engine.block_table(b)[:2] == shared
    engine.abort_request(a)
    assert engine.block_table(b)[:2] == shared
    engine.scheduler.blocks.check()
    engine.run_until_done()
    assert engine.kv_snapshot().num_used == 0
    assert set(shared) <= set(engine.kv_snapshot().cached_blocks)


def test_static_batching_does_not_share():
    engine = fake_engine(
        num_kv_blocks=16, block_size=4, batching="static", enable_prefix_caching=True
    )
    engine.add_request(_tokens(12), GREEDY)
    engine.run_until_done()
    engine.add_request(_tokens(12), GREEDY)
    plan = engine.step().plan
    assert plan.admitted[0].num_cached_tokens == 0 and not engine.kv_snapshot().cached_blocks


# ---- the hit rate, in the metrics and in /metrics ------------------------------------------
def test_metrics_and_prometheus_report_the_hit_rate_in_tokens():
    engine = fake_engine(num_kv_blocks=16, block_size=4, enable_prefix_caching=True)
    collector, prom = MetricsCollector(), PrometheusMetrics()
    engine.bus.subscribe(collector)
    engine.bus.subscribe(prom)
    engine.add_request(_tokens(10), GREEDY)  # 10 looked up, nothing found
    engine.run_until_done()
    engine.add_request(_tokens(8) + [1, 2], GREEDY)  # 10 looked up, 8 found
    engine.run_until_done()
    cache = collector.summary()["prefix_cache"]
    assert (cache["query_tokens"], cache["hit_tokens"], cache["hit_rate"]) == (20, 8, 0.4)
    assert cache["prefill_tokens"] == 10 + 2
    text = prom.exposition().decode()
    values = {
        (s.name, s.labels.get("tier")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("minicb:prefix_cache") and s.name.endswith("_total")
    }
    assert values == {
        ("minicb:prefix_cache_queries_total", None): 20.0,
        ("minicb:prefix_cache_hits_total", None): 8.0,
        # by tier: all on the device here (tests/test_offload_tier.py has host hits)
        ("minicb:prefix_cache_hits_by_tier_total", "device"): 8.0,
        ("minicb:prefix_cache_hits_by_tier_total", "host"): 0.0,
    }


# ---- the attention backends, from a cached prefix ------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_attention_from_a_cached_prefix_matches_no_cache(backend, tiny_llama_dir):
    """Whole prompts (no chunking): the only queries that start mid-context are the ones
    whose prefix came from the cache."""
    system = list(range(3, 40))  # two full blocks of 16, and a bit
    prompts = [system + [50 + i] * (i + 1) for i in range(4)]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    options = dict(dtype="float32", num_kv_blocks=32, block_size=16, max_num_seqs=1)
    plain = LLM(
        model=tiny_llama_dir, attention_backend="torch", enable_prefix_caching=False, **options
    )
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    cached = LLM(
        model=tiny_llama_dir, attention_backend=backend, enable_prefix_caching=True, **options
    )
    starts = []
    cached.engine.bus.subscribe(
        lambda es: starts.extend(
            r.start_position for e in es for r in e.plan.scheduled if r.phase == "prefill"
        ),
        kinds=["step"],
    )
    assert [o.token_ids for o in cached.generate(prompts, params)] == expected
    assert starts == [0, 32, 32, 32]


def test_the_option_on_the_command_line():
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    assert EngineConfig().enable_prefix_caching is True  # on by default, as in vLLM V1
    assert engine_kwargs(parser.parse_args([]))["enable_prefix_caching"] is True
    off = engine_kwargs(parser.parse_args(["--no-enable-prefix-caching"]))
    assert EngineConfig.from_kwargs(**off).enable_prefix_caching is False


def test_every_reason_of_a_cached_run_has_a_chinese_pattern():
    seen = set()
    no_chunks = {"enable_chunked_prefill": False, "max_num_batched_tokens": 64}
    host_tier = {"kv_offload_blocks": 16}  # its admissions say what came back from the host
    for options in ({}, {"preemption_mode": "swap"}, no_chunks, host_tier):
        seen |= _reasons_of_a_run(enable_prefix_caching=True, **options)
    assert any("found in the cache" in r for r in seen)
    patterns = _reason_patterns()
    assert sorted(r for r in seen if not any(p.match(r) for p in patterns)) == []


def test_a_cached_step_event_round_trips_through_json():
    engine = fake_engine(num_kv_blocks=16, block_size=4, enable_prefix_caching=True)
    engine.add_request(_tokens(10), GREEDY)
    engine.run_until_done()
    engine.add_request(_tokens(10), GREEDY)
    plan = engine.step().plan
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert data["kv_ops"] == [["uncache", None, [0, 1]], ["append", 1, [0, 1, 3]]]  # 2 hits
    assert data["admitted"][0]["num_cached_tokens"] == 8
    assert plan_from_dict(data) == plan
