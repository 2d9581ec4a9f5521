"""Same decisions: a workload recorded on the real engine (a tiny random Llama), replayed
through the SimulatedRunner with the same config and the recorded output lengths, gives
exactly the same sequence of StepPlans (admissions, chunks, preemptions, finishes), in
every batching mode; only the times differ."""

import pytest

from minicb import LLMEngine, SamplingParams, VirtualClock
from minicb.config import EngineConfig
from minicb.runner.simulated import SimulatedRunner
from tests.helpers import mixed_prompts

PROMPTS = mixed_prompts(12, vocab=256, seed=5, min_len=3, max_len=40)
MAX_TOKENS = [3 + (5 * i) % 17 for i in range(12)]
IGNORE_EOS = [i % 2 == 0 for i in range(12)]  # the others may stop early
# Stand-ins for EOS (a random tiny model rarely says its own): a sixth of the vocabulary,
# so some requests stop early at lengths only the real model decides.
STOPS = list(range(40, 256, 6))

CONFIGS = {
    "continuous": dict(),
    "static": dict(batching="static", max_num_seqs=4),
    "small-chunks": dict(max_num_batched_tokens=8),
    # ~60 tokens of KV for 12 requests of up to 59: preemption is forced.
    "recompute": dict(num_kv_blocks=15, block_size=4, max_num_seqs=8),
    "swap": dict(num_kv_blocks=15, block_size=4, max_num_seqs=8, preemption_mode="swap"),
}


def run(engine, output_lengths=None):
    """Queue the workload, step to the end: the plans (as events carry them), and the output
    length of each request that stopped at EOS (the others stopped at max_tokens)."""
    plans = []
    engine.bus.subscribe(lambda e: plans.append(e.plan.to_dict()), kinds=["step"])
    for prompt, m, ignore in zip(PROMPTS, MAX_TOKENS, IGNORE_EOS, strict=True):
        stops = [] if ignore else STOPS
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=ignore,
                                stop_token_ids=stops)  # fmt: skip
        engine.add_request(prompt, params, arrival_time=0.0)
    outs = engine.run_until_done()
    return plans, {o.request_id: len(o.token_ids) for o in outs if o.finish_reason == "stop"}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_simulator_makes_the_real_engines_decisions(name, tiny_llama_dir):
    config = EngineConfig(**(dict(num_kv_blocks=64, block_size=16) | CONFIGS[name]))
    real_plans, lengths = run(LLMEngine(tiny_llama_dir, config))
    clock = VirtualClock()
    runner = SimulatedRunner(f"H100:{tiny_llama_dir}", config, clock=clock,
                             output_lengths=lengths)  # fmt: skip
    sim_plans, sim_lengths = run(LLMEngine(config=config, runner=runner, clock=clock))
    assert sim_lengths == lengths
    if name == "continuous":
        assert lengths  # some requests really stopped at EOS, so the forced lengths mattered
    assert len(sim_plans) == len(real_plans)
    for real, sim in zip(real_plans, sim_plans, strict=True):
        assert sim == real
    if name in ("recompute", "swap"):
        assert any(p["preempted"] for p in real_plans)  # the case really arose
    assert clock() > 0  # the simulated steps took (virtual) time
