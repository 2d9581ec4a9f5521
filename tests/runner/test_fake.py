"""FakeRunner: forced lengths end with the stop token, scripted step times are the events'
times exactly, and with_config keeps its settings on a new pool size."""

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams, VirtualClock
from minicb.core.runner.fake import FAKE_STOP_TOKEN, FAKE_TOKEN


def test_forced_output_lengths_stop_with_the_stop_token_at_exactly_that_length():
    runner = FakeRunner(output_lengths={0: 3, 2: 1}, token_fn=lambda rid, i: 10 * rid + i + 3)
    engine = LLMEngine(config=EngineConfig(block_size=4), runner=runner)
    for _ in range(3):
        engine.add_request([5, 6], SamplingParams(max_tokens=5, temperature=0.0))
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert outs[0].token_ids == [3, 4, FAKE_STOP_TOKEN] and outs[0].finish_reason == "stop"
    assert outs[1].token_ids == [13, 14, 15, 16, 17] and outs[1].finish_reason == "length"
    assert outs[2].token_ids == [FAKE_STOP_TOKEN] and outs[2].finish_reason == "stop"
    assert runner.steps == 5


def test_the_default_token_is_seven():
    engine = LLMEngine(config=EngineConfig(), runner=FakeRunner())
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0))
    (out,) = engine.run_until_done()
    assert out.token_ids == [FAKE_TOKEN] * 4 == [7] * 4 and out.text == ""


def test_step_times_advance_the_clock_and_are_the_events_times():
    clock = VirtualClock(10.0)
    runner = FakeRunner(clock=clock, step_times=[0.5, 0.25, 0.125], step_time=0.0625)
    engine = LLMEngine(config=EngineConfig(), runner=runner, clock=clock)
    steps = []
    engine.bus.subscribe(steps.extend, kinds=["step"])
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, temperature=0.0))
    engine.run_until_done()
    assert [(e.wall_start, e.wall_end, e.forward_s) for e in steps] == [
        (10.0, 10.5, 0.5),
        (10.5, 10.75, 0.25),
        (10.75, 10.875, 0.125),
        (10.875, 10.9375, 0.0625),
        (10.9375, 11.0, 0.0625),
    ]
    assert clock() == 11.0 and runner.steps_left == []


def test_with_config_keeps_settings_and_takes_the_pool_size_from_the_config():
    clock = VirtualClock()
    token_fn = lambda rid, i: 9  # noqa: E731
    runner = FakeRunner(
        num_kv_blocks=8,
        max_model_len=100,
        vocab_size=50,
        token_fn=token_fn,
        output_lengths={0: 2},
        clock=clock,
        step_time=0.5,
        stop_token_ids=[4],
    )
    LLMEngine(config=EngineConfig(), runner=runner, clock=clock).step()  # one (empty) plan
    bigger = runner.with_config(EngineConfig(num_kv_blocks=20))
    assert (bigger.num_kv_blocks, bigger.num_swap_blocks, bigger.steps) == (20, 20, 0)
    assert (bigger.max_model_len, bigger.vocab_size, bigger.stop_token_ids) == (100, 50, [4])
    assert bigger.token_fn is token_fn and bigger.clock is clock and bigger.step_time == 0.5
    assert bigger.output_lengths == {0: 2} and (runner.steps, clock()) == (1, 0.5)
    assert runner.with_config(EngineConfig()).num_kv_blocks == 8  # no pool size: keep it
