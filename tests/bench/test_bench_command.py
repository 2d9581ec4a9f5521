"""Smoke test: ``minicb bench --quick`` end to end on the tiny random model."""

import json
import re

import pytest
import torch

from minicb.cli import main
from minicb.telemetry.trace_reader import read_trace

pytestmark = pytest.mark.slow  # a minute or two: every section of the suite runs

SECTIONS = {"meta", "hardware", "scheduler", "roofline", "workloads", "rate_sweep", "goals",
            "prefix_caching"}  # fmt: skip


def test_bench_quick_runs_end_to_end(tiny_llama_dir, tmp_path, capsys):
    out, traces = tmp_path / "out", tmp_path / "traces" / "run.jsonl"
    argv = ["bench", "--quick", "--model", tiny_llama_dir, "--out-dir", str(out),
            "--no-progress", "--trace", str(traces)]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the command pins one thread for the whole process
    printed = capsys.readouterr().out
    assert "### capped-exp" in printed and "### Goals" in printed

    results = json.loads((out / "bench.json").read_text())
    assert SECTIONS <= set(results)
    assert results["meta"]["threads"] == 1 and results["meta"]["quick"]
    assert results["meta"]["compile"] == "eager"  # the default; --compile on builds graphs
    assert set(results["workloads"]) == {"capped-exp", "uniform", "nanovllm", "fixed"}
    for name, w in results["workloads"].items():
        assert not w["errors"], (name, w["errors"])
        for system, runs in w["runs"].items():
            run = runs[0]
            assert run["summary"]["requests"]["tokens_generated"] == sum(
                w["definition"]["output_lens"]
            ), (name, system)
        assert results["calibration"]["workloads"][name]["predicted_ratio"] > 0
    assert [p["batch"] for p in results["roofline"]["points"]] == [1, 8, 32]
    assert [s["num_running"] for s in results["scheduler"]] == [16, 64, 256]
    assert {p["system"] for p in results["rate_sweep"]} == {
        "minicb-continuous", "minicb-static", "minicb-static-sorted"
    }  # fmt: skip
    assert [g["goal"].split(" >= ")[-1] for g in results["goals"][-3:]] == [
        "60 % of the hardware ceiling", "70 % of the hardware ceiling",
        "schedule() with 256 running < 0.5 ms (median)",
    ]  # fmt: skip
    assert len(results["goals"]) == 7  # prediction, three peers, batch 1, batch 32, schedule()
    assert set(results["prefix_caching"]) == {"shared-system", "multi-turn"}
    for name, pc in results["prefix_caching"].items():
        off, on = pc["figures"]["off"], pc["figures"]["on"]
        assert on["prefill_tokens"]["median"] < off["prefill_tokens"]["median"], name
        assert on["prefix_hit_rate"]["median"] > 0 and pc["on_over_off"]["median"] > 0
    assert "### Prefix caching: off against on" in printed

    page = (out / "bench.html").read_text()
    # plotly.js is inline (megabytes of it), never fetched: the report works offline.
    assert len(page) > 1_000_000 and re.search(r"<script[^>]*\bsrc=", page) is None
    assert "Slot occupancy over time" in page
    assert (out / "bench.md").read_text().startswith("## minicb bench --quick")
    recorded = sorted(p.name for p in traces.parent.iterdir())
    assert "run.capped-exp.minicb-continuous.jsonl" in recorded
    assert "run.shared-system.minicb-cache-on.jsonl" in recorded
    assert read_trace(traces.parent / "run.fixed.minicb-static.jsonl").header["system"] == (
        "minicb-static"
    )
