"""The reproductions' shapes at a small size: paging and continuous batching beat static
and contiguous reservations, chunked prefill keeps P99 TBT down, and everything is
labelled SIMULATED."""

import json

import pytest

from minicb.bench.all_reproductions import render, render_html, run_all
from minicb.cli import main
from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.sim import paper_reproductions as rp
from minicb.sim.run import run_simulated
from minicb.workload import from_lengths


def by(rows, key):
    return {row[key]: row for row in rows}


def test_anyscale_paged_beats_contiguous_beats_static_when_caps_are_long():
    result = rp.anyscale(size=0.06, caps=(512,))
    rows = by(result["rows"], "system")
    static, contiguous, paged = (rows[s]["output_tok_s"] for s in rp.ANYSCALE_SYSTEMS)
    assert paged > contiguous > static
    assert rows["continuous, paged"]["mean_batch"] > rows["static, contiguous"]["mean_batch"]


def test_vllm_reservations_order_batch_size_and_kv_use():
    rows = rp.vllm(size=0.1, rounds=1)["rows"]
    batches = [r["mean_batch"] for r in rows]  # max, pow2, oracle, paged
    kv = [r["kv_utilisation"] for r in rows]
    assert batches == sorted(batches) and batches[0] < batches[-1]
    assert kv == sorted(kv) and kv[-1] > 0.9 > 0.5 > kv[0]


def test_sarathi_small_chunks_keep_p99_tbt_lowest():
    rows = by(rp.sarathi(size=0.1, loads=(0.6,))["rows"], "system")
    tbt = {s: rows[s]["itl_p99_s"] for s in rp.SARATHI_SYSTEMS}
    assert tbt["chunks of 512"] < tbt["no chunking"]


def test_scale_continuous_beats_static_below_the_limit_case():
    result = rp.scale(size=0.06, profile_name="H100:llama-3.1-8b")
    assert 1.0 < result["measured_ratio"] < result["harmonic_B"]
    assert set(result["occupancy"]) == {"static", "continuous"}


def test_every_report_says_simulated_and_names_the_profile():
    results = run_all(["scale"], "L4:smollm2-135m", size=0.02)
    assert results["scale"]["simulated"] is True
    markdown = render(results)
    assert "SIMULATED" in markdown and "L4:smollm2-135m" in markdown
    page = render_html(results, markdown)
    assert "SIMULATED (L4:smollm2-135m)" in page and "plotly" in page


def test_the_simulated_runner_reports_the_time_its_steps_took():
    profile = load_profile("H100:llama-3.1-8b")
    reqs = from_lengths([100] * 5, [8, 8, 8, 8, 3], max_tokens=8)
    result = run_simulated(profile, EngineConfig(enable_prefix_caching=False), reqs)
    s = result["summary"]
    assert result["runner"]["runner"] == "simulated" and result["runner"]["simulated"]
    assert s["requests"]["tokens_generated"] == 4 * 8 + 3  # the early one stopped at 3
    # One step prefills all five (500 tokens), then 7 decode steps; each step costs at
    # least the weights' read, 7.50e9 streamed parameters x 2 bytes at 3.35 TB/s x 0.8,
    # plus the 2 ms step overhead.
    assert s["batch"]["steps"] == 8
    assert s["duration_s"] >= 8 * (15.01e9 / (3.35e12 * 0.8) + 0.002)


def test_the_command_line_names_a_bad_profile(capsys, tmp_path):
    code = main(["bench", "--simulate", "Z80:opt-13b", "--out-dir", str(tmp_path)])
    assert code == 2 and "GPU 'Z80' is not in the catalogue" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_writes_the_report(tmp_path):
    args = ["bench", "--simulate", "H100:llama-3.1-8b", "--reproduce", "scale", "--quick"]
    assert main([*args, "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "reproductions.json").read_text())
    assert data["scale"]["simulated"] and (tmp_path / "reproductions.html").is_file()


def test_normalized_latency_is_end_to_end_over_output_tokens():
    profile = load_profile("H100:llama-3.1-8b")
    config = EngineConfig(enable_prefix_caching=False)
    result = run_simulated(profile, config, from_lengths([100], [8]))
    assert result["normalized_latency_s"] == pytest.approx(result["summary"]["duration_s"] / 8)
