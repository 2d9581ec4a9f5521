"""The suite's prefix-caching section over FakeRunner: off and on in one run, its figures
in bench.json's shape and in the report, fewer prefill tokens with caching on."""

from dataclasses import replace
from types import SimpleNamespace

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.bench.measurements import Suite, count_runs
from minicb.bench.recipes import QUICK, cache_workloads
from minicb.bench.report import prefix_caching_section
from minicb.bench.systems import Systems


def test_suite_runs_prefix_workloads_off_and_on_and_reports_them():
    plan = replace(QUICK, repeats=2, warmup_each_workload=True)
    # Chat turns 10 ms apart rather than 0.5 s: enough for the fake to finish a turn.
    workloads = [replace(w, requests=[replace(r, arrival=r.arrival / 50) for r in w.requests])
                 for w in cache_workloads(plan, vocab=256)]  # fmt: skip
    config = EngineConfig(max_num_seqs=plan.max_num_seqs, num_kv_blocks=64,
                          max_num_batched_tokens=plan.max_num_batched_tokens)  # fmt: skip
    engine = LLMEngine(config=config, runner=FakeRunner(num_kv_blocks=64, max_model_len=512))
    ticks = []
    bar = SimpleNamespace(set_postfix_str=lambda *a, **k: None, update=lambda: ticks.append(1))
    suite = Suite(plan, Systems(plan, engine, {}, 64), bar, None)
    results = {"prefix_caching": {w.name: suite.prefix_caching(w) for w in workloads}}
    assert set(results["prefix_caching"]) == {"shared-system", "multi-turn"}
    assert len(ticks) == 2 * (plan.repeats + 1)  # what count_runs counts for them
    assert count_runs(plan, 0, 2) - count_runs(plan, 0, 0) == len(ticks)
    for name, data in results["prefix_caching"].items():
        off, on = data["figures"]["off"], data["figures"]["on"]
        for f in (off, on):
            assert f["prefill_tokens"]["n"] == 2 and f["output_tok_s"]["median"] > 0
            assert f["ttft_p50"] is not None
        assert on["prefill_tokens"]["max"] < off["prefill_tokens"]["min"], name
        assert on["prefix_hit_rate"]["min"] > 0 and off["prefix_hit_rate"] is None
        assert data["on_over_off"]["n"] == 2  # paired by repeat
        assert [r["system"] for r in data["runs"]["on"]] == ["minicb-cache-on"] * 2
    text = "\n".join(prefix_caching_section(results))
    assert "### Prefix caching: off against on" in text and "on / off (paired by repeat)" in text
    assert "| shared-system | on |" in text and "| multi-turn | off |" in text
    assert prefix_caching_section({}) == []
