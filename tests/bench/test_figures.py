"""Figures computed from fixed inputs: spreads, ratios, time shares, goals (the roofline's:
tests/perflab/test_roofline.py)."""

import pytest

from minicb.bench import (
    RunRecord,
    aggregate,
    outside_model_share,
    paired_ratio,
    ratio_table,
    spread,
)
from minicb.bench.measurements import time_schedule
from minicb.bench.report import evaluate
from minicb.bench.run_records import lookup


def _run(system, out_tok_s, ttft=None, error=None):
    summary = {
        "throughput": {"output_tokens_per_s": out_tok_s, "total_tokens_per_s": 2 * out_tok_s,
                       "requests_per_s": 1.0},
        "latency": {"ttft_s": {"p50": ttft, "p90": ttft, "p99": ttft}},
        "batch": {"slot_occupancy": 0.5, "padding_waste": None},
    }  # fmt: skip
    return RunRecord(system, "w", summary if not error else {}, wall_s=10.0, error=error)


def test_lookup_and_spread():
    s = {"a": {"b": 3, "c": None}}
    assert lookup(s, ("a", "b")) == 3.0
    assert lookup(s, ("a", "c")) is None and lookup(s, ("x",)) is None
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([None]) is None


def test_aggregate_takes_median_min_max_over_repeats():
    agg = aggregate([_run("x", 10.0, 0.2), _run("x", 30.0, 0.1), _run("x", 20.0, 0.3)])
    assert agg["output_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert agg["total_tok_s"]["median"] == 40.0
    assert agg["ttft_p99"]["max"] == 0.3
    assert agg["slot_occupancy"]["median"] == 0.5
    assert agg["padding_waste"] is None and agg["kv_utilisation"] is None
    assert agg["wall_s"]["median"] == 10.0
    assert aggregate([_run("x", 0, error="no")])["output_tok_s"] is None


def test_ratios_pair_repeat_with_repeat():
    a = [_run("a", 30.0), _run("a", 40.0), _run("a", 10.0)]
    b = [_run("b", 10.0), _run("b", 20.0), _run("b", 10.0)]
    assert paired_ratio(a, b) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    table = ratio_table({"a": a, "b": b, "c": [_run("c", 0, error="failed")]})
    assert set(table) == {"a / b", "b / a"}
    assert table["b / a"]["median"] == pytest.approx(0.5)


def test_share_of_time_outside_the_model():
    steps = [
        {"dt": 1.0, "schedule_s": 0.1, "forward_s": 0.7, "sample_s": 0.1},
        {"dt": 1.0, "schedule_s": 0.1, "forward_s": 0.9, "sample_s": 0.0},
    ]
    share = outside_model_share(steps)
    assert share["outside"] == pytest.approx(0.2)
    assert share["schedule"] == pytest.approx(0.1) and share["sample"] == pytest.approx(0.05)
    assert share["other"] == pytest.approx(0.05)
    assert outside_model_share([])["outside"] is None


def test_schedule_is_timed_with_everybody_decoding():
    # The real engine over a FakeRunner; time_schedule itself checks that all 16 requests
    # are decoding in every timed step. Figures are wall-clock seconds: only their order
    # is asserted.
    cost = time_schedule(16, iterations=5)
    assert cost["num_running"] == 16 and cost["iterations"] == 5
    assert 0 < cost["median_s"] <= cost["p90_s"]


def test_goals_report_met_and_missed_with_the_gap():
    cell = lambda m: {"median": m, "min": m, "max": m, "n": 1}  # noqa: E731
    results = {
        "workloads": {
            "capped-exp": {
                "ratios": {"minicb-continuous / hf-continuous": cell(1.2),
                           "minicb-continuous / hf-padded": cell(2.5)},
            },
            "fixed": {"ratios": {"minicb-continuous / hf-padded": cell(1.1)}},
        },
        "calibration": {"workloads": {"capped-exp": {
            "ratio_error": -0.2, "measured_ratio": 2.0, "predicted_ratio": 1.6}}},
        "roofline": {"points": [{"batch": 1, "fraction": 0.65}, {"batch": 32, "fraction": 0.3}]},
        "scheduler": [{"num_running": 256, "median_s": 0.0004}],
    }  # fmt: skip
    goals = {
        g["goal"].split(":")[0] + str(i): g
        for i, g in enumerate(evaluate(results, "capped-exp", "fixed"))
    }
    met = [g["met"] for g in goals.values()]
    assert met == [False, False, True, True, True, False, True]
    prediction = list(goals.values())[0]
    assert "off by 20 %, 5 points beyond" in prediction["note"]
    assert "missed by 20 %" in list(goals.values())[1]["note"]  # 1.2x against 1.5x
    batch32 = list(goals.values())[5]
    assert batch32["note"] == "missed by 57 % (0.3 against 0.7)"  # no linears timed


def test_roofline_goal_names_what_the_linear_layers_alone_reach():
    results = {
        "workloads": {},
        "roofline": {"points": [{"batch": 1, "fraction": 0.5, "linears_fraction": 0.72},
                                {"batch": 32, "fraction": 0.35, "linears_fraction": 0.64}]},
        "scheduler": [],
    }  # fmt: skip
    one, thirty_two = evaluate(results, "capped-exp", "fixed")[4:6]
    assert one["note"] == "missed by 17 % (0.5 against 0.6); the linear layers alone reach 72 %"
    assert not thirty_two["met"] and thirty_two["note"].endswith("linear layers alone reach 64 %")


def test_without_the_performance_lab_the_roofline_section_says_where_it_is(monkeypatch):
    # A minicb installed from a wheel has no perflab/ beside it: the bench runs without its
    # roofline sweep, counts no decode units, and its report says why.
    import sys

    from minicb.bench import NO_LAB, performance_lab
    from minicb.bench.measurements import count_runs
    from minicb.bench.recipes import QUICK
    from minicb.bench.report import roofline_section

    assert performance_lab("roofline") is not None  # the repository's checkout has it
    monkeypatch.setitem(sys.modules, "perflab", None)  # as if it were not there
    monkeypatch.delitem(sys.modules, "perflab.roofline", raising=False)
    assert performance_lab("roofline") is None
    decode_units = len(QUICK.decode_batches) * QUICK.decode_rounds
    assert count_runs(QUICK, 2, roofline=False) == count_runs(QUICK, 2) - decode_units
    hw = {"copy_bandwidth": 14e9, "matmul_flops": 1.4e12}
    lines = roofline_section({"hardware": hw, "roofline": {"skipped": NO_LAB, "points": []}})
    assert "14.0 GB/s, 1400 GFLOP/s" in lines[-1] and "perflab/" in lines[-1]
