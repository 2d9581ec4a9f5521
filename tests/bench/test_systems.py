"""The systems under test: exact lengths, requests entering at their arrival times (the
real driver on a virtual clock), and transformers' runs (on the tiny model) rebuilt as
minicb events and measured like minicb's."""

from dataclasses import replace

import pytest
import torch

from minicb import EngineConfig, FakeRunner, LLMEngine, VirtualClock
from minicb.bench import measure_events, run_minicb
from minicb.bench.recipes import MINICB, QUICK, capped_exponential
from minicb.bench.systems import Systems, build_systems, minicb_siblings, sibling
from minicb.bench.transformers_systems import _batch_events, run_hf_continuous, run_hf_padded
from minicb.workload import RequestSpec, Workload


@pytest.fixture(scope="module")
def hf_tiny(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def test_padded_batch_events_give_the_figures_worked_by_hand():
    reqs = [RequestSpec([5, 6, 7], 1), RequestSpec([5, 6, 7, 8, 9], 3)]
    w = Workload("w", "two", reqs)
    events = _batch_events([0, 1], w, t0=10.0, began=10.0, times=[10.5, 11.0, 11.5], end=11.6)
    summary, steps, span = measure_events(events, 10.0, ttft_slo=None, tpot_slo=None)
    lat = summary["latency"]
    assert lat["ttft_s"]["p50"] == pytest.approx(0.5)
    assert lat["e2e_s"]["max"] == pytest.approx(1.6)
    assert lat["tpot_s"]["count"] == 1 and lat["tpot_s"]["p50"] == pytest.approx(0.5)
    assert summary["requests"]["tokens_generated"] == 4  # credited: 1 + 3, not 2 x 3
    # Tokens: step 1 prefills 3 + 5 and pads the short prompt by 2; steps 2-3 pad row 0.
    assert summary["batch"]["padding_waste"] == pytest.approx(4 / 14)
    assert summary["batch"]["slot_occupancy"] == pytest.approx(4 / 6)
    assert [s["decode_rows"] for s in steps] == [0, 2, 2]
    assert steps[0]["prefill_tokens"] == 10 and steps[1]["dt"] == pytest.approx(0.5)
    assert span == (0.0, pytest.approx(1.6))  # from when the batch began to its return


def test_minicb_driver_adds_requests_at_their_arrival_times():
    # Every step takes 0.25 s of virtual time; request 0 (6 tokens) is done at 1.5 s, so the
    # driver idles until request 1 arrives at 2.0 s; request 2 arrives at 2.125 s, during
    # request 1's prefill step, and enters at the next step (2.25 s): it is charged 0.125 s
    # of waiting, nobody is charged for the idle gap.
    clock = VirtualClock(10.0)
    runner = FakeRunner(num_kv_blocks=64, clock=clock, step_time=0.25)
    engine = LLMEngine(config=EngineConfig(max_num_seqs=4, num_kv_blocks=64), runner=runner,
                       clock=clock)  # fmt: skip
    w = capped_exponential(3, 4, 4, 6, vocab=256, seed=0).with_arrivals([0.0, 2.0, 2.125], "hand")
    assert w.output_lens == [6, 6, 2]
    rec = run_minicb(engine, w, "minicb-continuous", slo=(0.3, 1.0), sleep=clock.advance)
    s = rec.summary
    assert s["requests"]["finished"] == 3
    assert s["requests"]["tokens_generated"] == sum(w.output_lens)
    assert rec.wall_s == 3.5  # it waited for the late arrivals rather than end early
    assert [st["t"] for st in rec.steps] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25,
                                             2.0, 2.25, 2.5, 2.75, 3.0, 3.25]  # fmt: skip
    ttft = s["latency"]["ttft_s"]
    assert (ttft["p50"], ttft["max"]) == (0.25, 0.375)  # request 2: 0.125 s queued + a step
    assert s["latency"]["e2e_s"]["max"] == 1.5
    assert s["goodput"]["requests"] == 2  # request 2 misses the 0.3 s TTFT target
    assert not engine.has_unfinished()


def test_transformers_systems_generate_exactly_the_lengths_asked(hf_tiny):
    w = capped_exponential(6, 5, 4, 10, vocab=256, seed=2)
    assert len(set(w.output_lens)) > 1
    padded = run_hf_padded(hf_tiny, w, batch_size=4)
    assert padded.error is None
    assert padded.summary["requests"]["tokens_generated"] == sum(w.output_lens)
    assert padded.summary["batch"]["padding_waste"] > 0
    cb = run_hf_continuous(hf_tiny, w, max_requests_per_batch=4, max_batch_tokens=64,
                           page_size=16, num_blocks=32)  # fmt: skip
    assert cb.error is None, cb.error
    assert cb.summary["requests"]["finished"] == len(w.requests)
    assert cb.summary["requests"]["tokens_generated"] == sum(w.output_lens)
    late = w.with_arrivals([0.1 * i for i in range(6)], "spread")
    with pytest.raises(ValueError, match="offline only"):
        run_hf_padded(hf_tiny, late, 4)


def test_sorted_static_system_is_static_in_length_order_on_the_same_weights():
    runner = FakeRunner(num_kv_blocks=64)
    engine = LLMEngine(config=EngineConfig(max_num_seqs=2, num_kv_blocks=64), runner=runner)
    siblings = minicb_siblings(engine)
    assert set(siblings) == {"minicb-static", "minicb-static-sorted"}
    static, ordered = siblings["minicb-static"].config, siblings["minicb-static-sorted"].config
    assert (static.batching, static.static_order) == ("static", "arrival")
    assert (ordered.batching, ordered.static_order) == ("static", "length")
    # Long and short alternate: sorting pairs them by length, so fewer lockstep steps.
    reqs = [RequestSpec([5, 6], m) for m in (20, 3, 19, 4)]
    w = Workload("w", "alternating", reqs)
    steps = {n: len(run_minicb(e, w, n, slo=(None, None)).steps) for n, e in siblings.items()}
    assert steps["minicb-static-sorted"] < steps["minicb-static"]


def test_every_minicb_run_starts_from_an_empty_prefix_cache():
    # The same prompts run twice: a reused engine would find them in its prefix cache and
    # skip their prefill, making later repeats faster than the first (and than transformers').
    config = EngineConfig(max_num_seqs=4, num_kv_blocks=64, enable_prefix_caching=True)
    engine = LLMEngine(config=config, runner=FakeRunner(num_kv_blocks=64))
    reqs = [RequestSpec([3 + i] * 32, 4) for i in range(4)]
    w = Workload("w", "four 32-token prompts", reqs)
    prompt_tokens = sum(len(r.prompt) for r in reqs)

    def prefilled(record):
        return sum(s["prefill_tokens"] for s in record.steps)

    systems = Systems(QUICK, engine, minicb_siblings(engine), 64)
    runs = [systems.run("minicb-continuous", w) for _ in range(2)]
    assert [prefilled(r) for r in runs] == [prompt_tokens, prompt_tokens]
    # What the fresh engine prevents: the same engine twice hits its own cache.
    again = [run_minicb(engine, w, "minicb-continuous") for _ in range(2)]
    assert prefilled(again[0]) == prompt_tokens > prefilled(again[1])


def test_bench_compile_on_gives_every_minicb_system_the_one_compiled_step(tiny_llama_dir):
    # `minicb bench --compile on`: continuous, both static systems and the fresh engine of
    # every run share one compiled decode step (its graphs are built once, at the first
    # decode step of the suite); transformers' systems are not built when not asked for.
    plan = replace(QUICK, systems=MINICB)
    w = Workload("w", "two", [RequestSpec([5, 6, 7], 2), RequestSpec([5, 6], 3)])
    # The compiled step is the performance lab's (perflab.compiled), found beside the package.
    from perflab.compiled import CompiledRunner

    systems = build_systems(tiny_llama_dir, plan, [w], dtype="float32", device="cpu",
                            compile="on")  # fmt: skip
    compiled = systems.continuous.runner.decode
    assert compiled is not None and compiled.describe() == "compiled decode steps"
    engines = [systems.continuous, *systems.siblings.values()]
    assert all(sibling(e).runner.decode is compiled for e in engines)
    assert [e.config.batching for e in engines] == ["continuous", "static", "static"]
    assert systems.hf_model is None and systems.hf_error is None
    eager = build_systems(tiny_llama_dir, plan, [w], dtype="float32", device="cpu")
    assert not isinstance(eager.continuous.runner, CompiledRunner)
    assert eager.continuous.describe()["runner"]["compile"] == "eager"
