"""The engine's step-level API: requests arrive at any time, stream, and report metrics."""

import pytest

from minicb import LLM, SamplingParams


def test_requests_join_a_running_batch_and_stream_tokens(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64)
    engine = llm.engine
    finished = {}

    class Collect:
        def step_done(self, result):
            finished.update({o.request_id: o for o in result.finished})

    engine.add_observer(Collect())
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
    assert all(len(o.token_ids) == 6 for o in finished.values())


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
    from minicb import EngineConfig, LLMEngine

    continuous = LLMEngine(tiny_llama_dir, EngineConfig(num_kv_blocks=32))
    static = LLMEngine(
        config=EngineConfig(batching="static", num_kv_blocks=32), share_weights_with=continuous
    )
    assert static.runner.model is continuous.runner.model
    assert static.runner.kv_cache.data_ptr() != continuous.runner.kv_cache.data_ptr()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for engine in (continuous, static):
        engine.add_request([5, 6, 7], params)
    outs = [engine.run_until_done()[0].token_ids for engine in (continuous, static)]
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="cannot share weights held as torch.float32"):
        LLMEngine(config=EngineConfig(dtype="bfloat16"), share_weights_with=continuous)
