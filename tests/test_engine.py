"""The engine's step-level API: requests arrive at any time, stream, and report metrics;
its views (KV snapshot, block tables, queues, live requests, description) agree with its
step events; abort_all and rebuilt leave nothing behind and keep the bus."""

import pytest

from minicb import LLM, EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.telemetry.kv_state import KVState
from tests.helpers import add, fake_engine


def test_requests_join_a_running_batch_and_stream_tokens(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64)
    engine = llm.engine
    finished = {}
    engine.bus.subscribe(
        lambda es: finished.update({e.request_id: e for e in es}), kinds=["finished"]
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = engine.add_request([5, 6, 7], params)
    engine.step()
    engine.step()
    late = engine.add_request([8, 9], params)
    result = engine.step()
    assert {r.request_id for r in result.plan.scheduled} == {first, late}
    assert [d.request_id for d in result.plan.admitted] == [late]
    streamed = list(engine.stream([1, 2, 3], params))
    assert [d.index for d in streamed] == list(range(6))
    engine.run_until_done()
    assert not engine.has_unfinished()
    assert sorted(finished) == [first, late, late + 1]
    assert all(e.num_output_tokens == 6 for e in finished.values())


def test_output_metrics_are_filled(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64)
    out = llm.generate(
        [[5, 6, 7, 8]], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    )[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert (m.num_prompt_tokens, m.num_generated_tokens, m.num_preemptions) == (4, 5, 0)


def test_generate_keeps_prompt_order_and_accepts_one_prompt(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 2, 5)]
    outs = llm.generate([[5], [6], [7]], params)
    assert [len(o.token_ids) for o in outs] == [9, 2, 5]
    assert len(llm.generate([5, 6], SamplingParams(max_tokens=2))) == 1


def test_two_engines_share_one_copy_of_the_weights(tiny_llama_dir):
    continuous = LLMEngine(tiny_llama_dir, EngineConfig(dtype="float32", num_kv_blocks=32))
    static_config = EngineConfig(dtype="float32", batching="static", num_kv_blocks=32)
    static = LLMEngine(config=static_config, runner=continuous.runner.with_config(static_config))
    assert static.runner.model is continuous.runner.model
    assert static.runner.kv_cache.data_ptr() != continuous.runner.kv_cache.data_ptr()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for engine in (continuous, static):
        engine.add_request([5, 6, 7], params)
    outs = [engine.run_until_done()[0].token_ids for engine in (continuous, static)]
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="cannot share weights held as torch.float32"):
        continuous.runner.with_config(EngineConfig(dtype="bfloat16"))


# ---- the views, on the real engine over FakeRunner -------------------------------------------
def swap_engine():
    """Three requests that cannot all fit a pool of 6 blocks: preemption by swap."""
    engine = fake_engine(
        num_kv_blocks=6,
        block_size=4,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        preemption_mode="swap",
        num_swap_blocks=12,
        step_time=0.1,
    )
    for n in (8, 8, 8):
        add(engine, n, 8)
    return engine


def test_views_agree_with_the_step_events():
    engine = swap_engine()
    steps, ended = [], set()
    engine.bus.subscribe(steps.extend, kinds=["step"])
    engine.bus.subscribe(
        lambda es: ended.update(e.request_id for e in es), kinds=["finished", "aborted"]
    )
    swapped_views = 0
    state = KVState.from_snapshot(engine.kv_snapshot_event())
    while engine.has_unfinished():
        engine.step()
        plan, kv = steps[-1].plan, engine.kv_snapshot()
        # What the KV map draws from the events is what the engine holds right after the step.
        state.apply(plan.kv_ops)
        assert state.as_tuple() == (kv.block_tables, kv.swap_tables, kv.cached_blocks)
        assert (plan.kv_used, plan.kv_free, plan.kv_total, plan.kv_swapped) == (
            kv.num_used,
            kv.num_free,
            kv.num_blocks,
            kv.num_swapped,
        )
        for row in plan.scheduled:
            if row.request_id not in ended:
                assert row.block_table == kv.block_tables[row.request_id]
                assert row.num_blocks == len(row.block_table)
        for rid in kv.block_tables.keys() | kv.swap_tables.keys():
            assert engine.block_table(rid) == kv.block_tables.get(rid, [])
        queues = engine.queue_sizes()
        assert (queues["waiting"], queues["swapped"]) == (plan.num_waiting, plan.num_swapped)
        assert queues["running"] == len(kv.block_tables)
        assert engine.step_count == plan.step == engine.describe()["step"]
        assert {r["request_id"] for r in engine.live_requests()} == {0, 1, 2} - ended
        swapped_views += bool(kv.swap_tables)
    assert swapped_views, "the run was meant to swap requests out"
    assert any(s.plan.swap_in_map for s in steps)


def test_describe_and_live_requests():
    engine = swap_engine()
    info = engine.describe()
    assert info == {
        "batching": "continuous",
        "config": engine.config.to_dict(),
        "model": "fake",
        "runner": engine.runner.describe(),
        "simulated": False,
        "kv_total": 6,
        "swap_total": 12,
        "block_size": 4,
        "has_tokenizer": False,
        "max_model_len": 256,
        "step": 0,
        "ended": 0,
        "busy_s": 0.0,
    }
    engine.step()
    first = engine.live_requests()[0]
    assert first == {
        "request_id": 0,
        "arrival": 0.0,
        "start_step": 1,
        "prompt": None,
        "num_prompt_tokens": 8,
        "max_tokens": 8,
        "first_token_time": 0.1,
        "arrival_busy_s": 0.0,
        "first_token_busy_s": 0.1,  # its own clock: one 0.1 s step
    }


def test_abort_all_frees_every_block():
    engine = swap_engine()
    aborted = []
    engine.bus.subscribe(lambda es: aborted.extend(e.request_id for e in es), kinds=["aborted"])
    while not engine.kv_snapshot().swap_tables:
        engine.step()
    assert sorted(engine.abort_all()) == [0, 1, 2] == sorted(aborted)
    kv = engine.kv_snapshot()
    assert (kv.num_used, kv.num_swapped, kv.block_tables, kv.swap_tables) == (0, 0, {}, {})
    assert engine.queue_sizes() == {"waiting": 0, "running": 0, "swapped": 0}
    assert not engine.has_unfinished() and engine.live_requests() == []
    assert engine.abort_all() == [] and engine.describe()["ended"] == 3


def test_rebuilt_keeps_the_bus_and_starts_ids_again():
    engine = fake_engine(block_size=4, step_time=0.5)
    seen = []
    engine.bus.subscribe(seen.extend)
    old = [add(engine, 3, 5), add(engine, 9, 5)]
    engine.step()
    del seen[:]
    new = engine.rebuilt(EngineConfig(block_size=8, num_kv_blocks=32, batching="static"))
    assert new.bus is engine.bus and new.clock is engine.clock
    # each abort frees its blocks at once (kv_changes), then the new engine says so
    assert [e.kind for e in seen] == ["aborted", "kv_changes"] * 2 + ["reset"]
    assert [e.request_id for e in seen[:4:2]] == old
    assert seen[4].info == new.describe() and seen[4].time == engine.clock()
    assert engine.kv_snapshot().num_used == 0 and not engine.has_unfinished()
    assert new.kv_snapshot().num_blocks == 32 and new.step_count == 0
    assert add(new, 3, 2) == 0
    new.run_until_done()
    after = seen[5:]
    assert after[0].kind == "arrived" and after[0].request_id == 0
    steps = [e.plan for e in after if e.kind == "step"]
    assert steps[0].step == 1 and {(p.batching, p.block_size) for p in steps} == {("static", 8)}
    assert [e.kind for e in after if e.kind in ("finished", "aborted")] == ["finished"]


class _CharTokenizer:
    """One token per character."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


@pytest.mark.parametrize(
    "stops, final, reason",
    [
        (["END"], "abcab", "stop"),  # the stop string spans three tokens: nothing of it shows
        (["cax"], "abcabcabca", "length"),  # "ca" was held back until the end proved it harmless
        ([], "abcabcabca", "length"),
        (["b"], "a", "stop"),
    ],
)
def test_token_texts_add_up_to_the_final_text(stops, final, reason):
    """A stop string can span tokens: the engine holds back a tail that could still begin one,
    so what the token deltas show is always exactly the final text, never more."""
    letters = "abcabEND" if stops == ["END"] else "abcabcabca"
    runner = FakeRunner(
        tokenizer=_CharTokenizer(), token_fn=lambda rid, i: ord(letters[i % len(letters)])
    )
    engine = LLMEngine(runner=runner)
    rid = engine.add_request([5, 5], SamplingParams(max_tokens=10, temperature=0.0, stop=stops))
    deltas, outputs = [], []
    while engine.has_unfinished():
        result = engine.step()
        deltas += [d.text for d in result.new_tokens if d.request_id == rid]
        outputs += result.finished
    assert "".join(deltas) == outputs[0].text == final
    assert outputs[0].finish_reason == reason
    if stops == ["cax"]:
        assert deltas[:5] == ["a", "b", "", "", "cab"]  # "c", then "ca", might begin "cax"


def test_first_scheduled_time_is_the_start_of_the_admitting_step():
    # The same moment as the request's admitted event (queue time excludes that step's
    # forward pass): steps of 0.5 s on the engine's virtual clock.
    engine = fake_engine(step_time=0.5)
    admitted = []
    engine.bus.subscribe(admitted.extend, kinds=["admitted"])
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    engine.step()
    rid = engine.add_request([4, 5, 6], SamplingParams(max_tokens=2))
    outputs = {o.request_id: o for o in engine.run_until_done()}
    assert [e.time for e in admitted] == [0.0, 0.5]
    assert outputs[rid].metrics.first_scheduled_time == 0.5
    assert outputs[rid].metrics.first_token_time == 1.0


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_an_outputs_times_are_those_its_events_carry(overlap):
    """One record of a request: its output's admission, first token and end are the times
    of its admitted, first_token and finished events, so the engine's outputs, a server's
    streams and every reader of the events agree on its TTFT and latency. The clock moves
    on every read, so a time taken anywhere else in the step would differ."""
    ticks = iter(range(1, 1_000_000))
    engine = LLMEngine(
        config=EngineConfig.from_kwargs(max_num_seqs=3, overlap_scheduling=overlap),
        runner=FakeRunner(num_kv_blocks=64),
        clock=lambda: next(ticks) / 1000,
    )
    heard: dict[str, dict[int, float]] = {"admitted": {}, "first_token": {}, "finished": {}}
    engine.bus.subscribe(
        lambda es: [heard[e.kind].setdefault(e.request_id, e.time) for e in es],
        kinds=list(heard),
    )
    ids = [add(engine, 3 + i, 2 + i % 3) for i in range(5)]  # more than one batch holds
    outputs = {o.request_id: o.metrics for o in engine.run_until_done()}
    assert sorted(outputs) == ids
    for rid, m in outputs.items():
        assert (m.first_scheduled_time, m.first_token_time, m.finished_time) == (
            heard["admitted"][rid], heard["first_token"][rid], heard["finished"][rid]
        ), rid
        assert m.first_scheduled_time < m.first_token_time <= m.finished_time


def replay_map(snapshot, events) -> KVState:
    """The KV map a reader draws: a snapshot, then every step's and between-steps' changes."""
    state = KVState.from_snapshot(snapshot)
    for e in events:
        state.apply(e.plan.kv_ops if e.kind == "step" else e.kv_ops)
    return state


def test_an_abort_between_steps_reaches_the_map_at_once():
    """An abort on an engine that then idles: its blocks leave the map with a kv_changes
    event, not with a next step that never comes."""
    engine = fake_engine(block_size=4)
    snapshot, seen = engine.kv_snapshot_event(), []
    engine.bus.subscribe(seen.extend, kinds=["step", "kv_changes"])
    rid = add(engine, 9, 20)
    engine.step()
    engine.step()
    assert engine.block_table(rid)
    engine.abort_request(rid)
    assert not engine.has_unfinished()
    kv = engine.kv_snapshot()
    state = replay_map(snapshot, seen)
    assert state.as_tuple() == (kv.block_tables, kv.swap_tables, kv.cached_blocks)
    assert not kv.block_tables
    (changes,) = [e for e in seen if e.kind == "kv_changes"]
    assert ["free", rid] in [op[:2] for op in changes.kv_ops]
    assert (changes.step, changes.kv_used, changes.kv_free) == (2, kv.num_used, kv.num_free)


def test_with_nobody_listening_for_them_the_next_step_carries_the_changes():
    engine = fake_engine(block_size=4)
    snapshot, steps = engine.kv_snapshot_event(), []
    engine.bus.subscribe(steps.extend, kinds=["step"])  # a reader of steps only
    first, second = add(engine, 9, 20), add(engine, 7, 20)
    engine.step()
    engine.abort_request(first)
    engine.step()
    assert ["free", first] in [op[:2] for op in steps[-1].plan.kv_ops]
    kv = engine.kv_snapshot()
    assert replay_map(snapshot, steps).as_tuple() == (kv.block_tables, kv.swap_tables,
                                                      kv.cached_blocks)  # fmt: skip
    assert list(kv.block_tables) == [second]
