"""Same decisions: a workload recorded on the real engine (a tiny random Llama), replayed
through the SimulatedRunner with the same config and the recorded output lengths, gives
exactly the same sequence of StepPlans (admissions, chunks, preemptions, finishes), in
every batching mode and KV reservation; only the times differ."""

import pytest

from minicb import LLMEngine, SamplingParams, VirtualClock
from minicb.core.config import EngineConfig
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.telemetry.event_json import plan_to_dict
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
    # Contiguous reservations (Orca's Max, Pow2, Oracle); a pool that makes them bind.
    "max": dict(kv_reservation="max", num_kv_blocks=24, block_size=4),
    "pow2": dict(kv_reservation="pow2", num_kv_blocks=24, block_size=4),
    "oracle": dict(kv_reservation="oracle", num_kv_blocks=24, block_size=4),
}


def run(engine, hints=None):
    """Queue the workload (``hints``: each request's expected output length), step to the
    end: the plans (as events carry them), every output length, and the length of each
    request that stopped early (the others stopped at max_tokens)."""
    hints, plans = hints or {}, []
    engine.bus.subscribe(lambda es: plans.extend(plan_to_dict(e.plan) for e in es), kinds=["step"])
    for i, (prompt, m, ignore) in enumerate(zip(PROMPTS, MAX_TOKENS, IGNORE_EOS, strict=True)):
        stops = [] if ignore else STOPS
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=ignore,
                                stop_token_ids=stops)  # fmt: skip
        engine.add_request(prompt, params, arrival_time=0.0, expected_output_tokens=hints.get(i))
    outs = engine.run_until_done()
    lengths = {o.request_id: len(o.token_ids) for o in outs}
    stopped = {o.request_id: len(o.token_ids) for o in outs if o.finish_reason == "stop"}
    return plans, lengths, stopped


@pytest.fixture(scope="module")
def true_lengths(tiny_llama_dir):
    """Every request's real output length (the same in every mode): the pow2 and oracle
    reservations' hints."""
    return run(LLMEngine(tiny_llama_dir, EngineConfig(num_kv_blocks=64)))[1]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_simulator_makes_the_real_engines_decisions(name, tiny_llama_dir, true_lengths):
    config = EngineConfig.from_kwargs(**(dict(num_kv_blocks=64, block_size=16) | CONFIGS[name]))
    real_plans, lengths, stopped = run(LLMEngine(tiny_llama_dir, config), true_lengths)
    assert lengths == true_lengths
    assert stopped  # some requests really stopped early, so the forced lengths matter
    clock = VirtualClock()
    runner = SimulatedRunner(f"H100:{tiny_llama_dir}", config, clock=clock,
                             output_lengths=stopped)  # fmt: skip
    engine = LLMEngine(config=config, runner=runner, clock=clock)
    sim_plans, sim_lengths, _ = run(engine, true_lengths)
    assert sim_lengths == lengths
    assert len(sim_plans) == len(real_plans)
    for real, sim in zip(real_plans, sim_plans, strict=True):
        assert sim == real
    if name in ("recompute", "swap"):
        assert any(p["preempted"] for p in real_plans)  # the case really arose
    if name in ("max", "pow2", "oracle"):
        assert any(f"({name}" in d["reason"] for p in real_plans for d in p["admitted"])
    assert clock() > 0  # the simulated steps took (virtual) time
