"""A side's own clock: two engines stepped in turn on one clock (the demo's one thread on one
CPU), each step event carrying the seconds of its own engine's steps (``busy_s``), and the
scenarios' figures and a joining page's request times read from it, never the shared clock."""

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.core.runner import VirtualClock
from minicb.scenarios.side_figures import SideRecord, side_metric

PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def engine_on(clock: VirtualClock, step_time: float) -> tuple[LLMEngine, SideRecord]:
    runner = FakeRunner(num_kv_blocks=32, clock=clock, step_time=step_time)
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=32), runner=runner, clock=clock)
    record = SideRecord({})
    engine.bus.subscribe(record)
    return engine, record


def test_each_step_event_counts_only_its_own_engines_steps():
    shared = VirtualClock()  # one clock for both, as the wall clock is in the real demo
    fast, fast_record = engine_on(shared, 1.0)
    slow, slow_record = engine_on(shared, 3.0)
    for engine in (fast, slow):
        engine.add_request([5, 6, 7], PARAMS)
    while fast.has_unfinished() or slow.has_unfinished():
        for engine in (fast, slow):  # interleaved: each waits while the other steps
            if engine.has_unfinished():
                engine.step()
    # fast ran 0-1, 4-5, 8-9 on the shared clock; slow ran 1-4, 5-8, 9-12
    assert [s.wall_end for s in fast_record.steps] == [1.0, 5.0, 9.0]
    assert [s.busy_s for s in fast_record.steps] == [1.0, 2.0, 3.0]
    assert [s.busy_s for s in slow_record.steps] == [3.0, 6.0, 9.0]
    # its tokens come 4 s apart on the shared clock, 1 s apart on its own
    assert side_metric(fast_record, "max_tbt") == 1.0
    assert side_metric(fast_record, "mean_ttft") == 1.0
    assert side_metric(slow_record, "max_tbt") == 3.0
    assert side_metric(fast_record, "makespan") == 3.0  # not 9
    assert fast.describe()["busy_s"] == 3.0


def test_a_joining_page_gets_each_live_requests_times_on_the_own_clock():
    shared = VirtualClock()
    engine, _ = engine_on(shared, 1.0)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    shared.advance(10.0)  # another engine's step
    late = engine.add_request([5, 6], PARAMS)
    engine.step()
    live = {r["request_id"]: r for r in engine.live_requests()}
    assert live[late]["arrival"] == 11.0 and live[late]["arrival_busy_s"] == 1.0
    assert live[late]["first_token_busy_s"] == 2.0  # the end of its first step, own clock
    assert live[0]["first_token_busy_s"] == 1.0
