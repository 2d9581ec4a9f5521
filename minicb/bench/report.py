"""The report of one ``minicb bench`` run: the goals judged, and the markdown tables (for
the terminal and the docs, one section per part of bench.json, the goals among them). The
self-contained HTML page (charts, then these tables) is charts.py.

- the goals (issue 14's): continuous over static against its prediction (the real
  schedulers on the simulated runner's ``cpu`` profile, bench/calibration.py), three ratios
  to transformers on the headline and the control, the decode roofline at batch 1 and 32
  (with what the linear layers alone reach), and ``schedule()``'s cost. A goal is a figure
  to report, not a pass/fail test: a missed goal says by how much (``evaluate``);
- the markdown (``render``).
"""

from __future__ import annotations

from typing import Any

from minicb.bench import median_of
from minicb.sim.markdown_table import markdown_table


# ---- the goals ---------------------------------------------------------------------------
def _goal(
    name: str, measured: float | None, target: float, unit: str = "", lower_is_better: bool = False
) -> dict[str, Any]:
    goal = {"goal": name, "target": target, "measured": measured, "met": None}
    if measured is None:
        return {**goal, "note": "not measured"}
    met = measured <= target if lower_is_better else measured >= target
    gap = abs(measured / target - 1) * 100 if target else 0.0
    note = f"missed by {gap:.0f} % ({measured:.3g}{unit} against {target:.3g}{unit})"
    return {**goal, "met": met, "note": "met" if met else note}


def _ratio(results: dict[str, Any], workload: str, other: str) -> float | None:
    ratios = results["workloads"].get(workload, {}).get("ratios", {})
    return median_of(ratios.get(f"minicb-continuous / {other}"))


def evaluate(results: dict[str, Any], headline: str, control: str) -> list[dict[str, Any]]:
    """The goals (issue 14's): the prediction, three ratios to transformers, the roofline at
    batch 1 and 32, schedule()."""
    cal = (results.get("calibration") or {}).get("workloads", {}).get(headline) or {}
    err = cal.get("ratio_error")
    name = f"{headline}: continuous/static within 15 % of the prediction"
    goals = [_goal(name, None if err is None else abs(err), 0.15, lower_is_better=True)]
    if err is not None:
        goals[0]["note"] = (
            f"measured {cal['measured_ratio']:.2f} vs predicted {cal['predicted_ratio']:.2f} "
            f"(the real schedulers on the simulated cpu): off by {abs(err) * 100:.0f} %"
        )
        if not goals[0]["met"]:
            goals[0]["note"] += f", {(abs(err) - 0.15) * 100:.0f} points beyond the 15 % allowed"
    for name, workload, other, target in (
        (f"{headline}: minicb continuous >= 1.5x hf-continuous (generate_batch)", headline,
         "hf-continuous", 1.5),
        (f"{headline}: minicb continuous >= 2x hf padded generate", headline, "hf-padded", 2.0),
        (f"{control}: minicb continuous >= hf padded generate", control, "hf-padded", 1.0),
    ):  # fmt: skip
        goals.append(_goal(name, _ratio(results, workload, other), target, "x"))
    points = {p["batch"]: p for p in results.get("roofline", {}).get("points", [])}
    s256 = {s["num_running"]: s["median_s"] * 1000 for s in results.get("scheduler", [])}
    return goals + [
        _roofline_goal(points.get(1), 1, 0.60),
        _roofline_goal(points.get(32), 32, 0.70),
        _goal("schedule() with 256 running < 0.5 ms (median)", s256.get(256), 0.5, " ms", True),
    ]


def _roofline_goal(point: dict[str, Any] | None, batch: int, target: float) -> dict[str, Any]:
    """The goal, and how much of the ceiling the linear layers alone reach: a goal above
    that is out of reach of any engine on this matmul library."""
    name = f"decode at batch {batch} >= {target * 100:.0f} % of the hardware ceiling"
    goal = _goal(name, point and point["fraction"], target)
    bound = point and point.get("linears_fraction")
    if bound is not None:
        goal["note"] += f"; the linear layers alone reach {bound * 100:.0f} %"
    return goal


Spread = dict[str, float] | None


# ---- the markdown -----------------------------------------------------------------------------
def _num(x: float | None, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def _cell(s: Spread, fmt: str = ".1f", scale: float = 1.0) -> str:
    """median (min-max), or just the median when there was one run."""
    if not s:
        return "-"
    med, lo, hi = (_num(s[k], fmt, scale) for k in ("median", "min", "max"))
    return med if lo == hi else f"{med} ({lo}-{hi})"


def _pcts(fig: dict[str, Any], name: str, qs: tuple[str, ...] = ("p50", "p90", "p99")) -> str:
    """Percentiles of one latency, in ms, "p50 / p90 / p99"."""
    return " / ".join(_num(median_of(fig.get(f"{name}_{q}")), ".0f", 1000) for q in qs)


# column -> (figure, format, scale) of a workload's throughput table
COLUMNS = {
    "output tok/s": ("output_tok_s", ".1f", 1), "total tok/s": ("total_tok_s", ".1f", 1),
    "req/s": ("req_s", ".2f", 1), "occupancy %": ("slot_occupancy", ".0f", 100),
    "padding %": ("padding_waste", ".0f", 100), "KV util %": ("kv_utilisation", ".0f", 100),
    "preemptions": ("preemptions", ".0f", 1),
}  # fmt: skip


def workload_section(
    name: str, data: dict[str, Any], prediction: dict[str, Any] | None = None
) -> list[str]:
    """A workload's tables; ``prediction``: its entry in the calibration (bench/calibration.py)."""
    d, errors = data["definition"], data["errors"]
    rows, latency = [], []
    for system, f in data["figures"].items():
        if errors.get(system):
            rows.append([system, f"did not run: {errors[system]}"] + [""] * len(COLUMNS))
            continue
        goodput = _num(median_of(f["goodput_req_s"]), ".2f")
        share = _num(median_of(f["goodput_fraction"]), ".0f", 100)
        cells = [_cell(f[key], fmt, scale) for key, fmt, scale in COLUMNS.values()]
        rows.append([system, *cells, f"{goodput} ({share} %)"])
        latency.append([system, *(_pcts(f, n) for n in ("ttft", "tpot", "itl", "e2e"))])
    return [
        f"### {name}", "", f"{d['description']}; arrivals {d['arrivals']}.", "",
        *markdown_table(["system", *COLUMNS, "goodput req/s (share)"], rows, text_cols=1), "",
        *markdown_table(["latency, ms (p50 / p90 / p99)", "TTFT", "TPOT", "ITL", "end-to-end"],
                        latency, text_cols=1),
        "", _ratios_line(data), *_prediction_lines(prediction), *_outside_lines(data), "",
    ]  # fmt: skip


def _ratios_line(data: dict[str, Any]) -> str:
    parts = [
        f"{pair} = {_cell(s, '.2f')}"
        for pair, s in data["ratios"].items()
        if pair.startswith("minicb-continuous /")
    ]
    return "Output tok/s ratios (paired by repeat): " + ("; ".join(parts) or "-") + "."


def _prediction_lines(c: dict[str, Any] | None) -> list[str]:
    """The real schedulers on the simulated runner's ``cpu`` profile, against the runs."""
    if not c or c.get("predicted_ratio") is None:
        return []
    pred, meas = c["predicted_wall_s"], c["measured_wall_s"]
    return [
        "",
        "Predicted by the real schedulers on the simulated runner (the `cpu` profile, see the "
        f"calibration): static {_num(pred['minicb-static'])} s, continuous "
        f"{_num(pred['minicb-continuous'])} s (measured medians {_num(meas['minicb-static'])} s "
        f"and {_num(meas['minicb-continuous'])} s). Continuous/static: measured "
        f"{_num(c['measured_ratio'], '.2f')}, predicted {c['predicted_ratio']:.2f}; error "
        f"{_num(c['ratio_error'], '+.0f', 100)} %.",
    ]


def _outside_lines(data: dict[str, Any]) -> list[str]:
    parts = [
        f"{system} {s['outside'] * 100:.1f} % (schedule {s['schedule'] * 100:.2f} %, "
        f"sample {s['sample'] * 100:.1f} %, other {s['other'] * 100:.1f} %)"
        for system, s in data.get("outside_model", {}).items()
        if s.get("outside") is not None
    ]
    intro = "Share of iteration time outside the model forward: "
    return ["", intro + "; ".join(parts) + "."] if parts else []


def roofline_section(results: dict[str, Any]) -> list[str]:
    hw, rf = results["hardware"], results["roofline"]
    if "skipped" in rf:  # no performance lab beside the package
        rates = f"{hw['copy_bandwidth'] / 1e9:.1f} GB/s, {hw['matmul_flops'] / 1e9:.0f} GFLOP/s"
        return ["### Decode against the hardware ceiling", "",
                f"Copy bandwidth and matmul {rates}; the decode sweep: {rf['skipped']}."]
    best = {
        key: "best of " + " and ".join(format(v / 1e9, fmt) for v in hw[f"{key}_samples"])
        for key, fmt in (("copy_bandwidth", ".1f"), ("matmul_flops", ".0f"))
    }
    rows = [
        [str(p["batch"]), f"{p['context']:.0f}",
         _cell({"median": p["step_s"], "min": p["step_s_min"], "max": p["step_s_max"]}, scale=1000),
         f"{p['forward_s'] * 1000:.1f}", f"{p['tok_s']:.1f}", f"{p['ceiling_tok_s']:.0f}",
         p["bound"], f"{p['fraction'] * 100:.0f}", f"{p['forward_fraction'] * 100:.0f}",
         _num(p.get("linears_fraction"), ".0f", 100),
         _num(p.get("hf_step_s"), ".1f", 1000), _num(p.get("hf_tok_s"))]
        for p in rf["points"]
    ]  # fmt: skip
    return [
        "### Decode against the hardware ceiling",
        "",
        f"Copy bandwidth {hw['copy_bandwidth'] / 1e9:.1f} GB/s ({hw['copy_bytes'] >> 20} MiB "
        f"copy, read + write; {best['copy_bandwidth']}), matmul "
        f"{hw['matmul_flops'] / 1e9:.0f} GFLOP/s ({hw['matmul_n']}^3; {best['matmul_flops']}); "
        f"weights streamed per step {rf['sizes']['weight_bytes'] / 1e6:.0f} MB, KV "
        f"{rf['sizes']['kv_bytes_per_token'] / 1e3:.1f} kB per token of context. \"Linears "
        "alone\": the model's linear layers run back to back on as many rows, nothing between "
        "them, through the step's own kernels (the compiled step's, when compiled): the most "
        "any step on those kernels can reach.",
        "",
        *markdown_table(
            ["batch", "context", "step ms", "forward ms", "tok/s", "ceiling tok/s", "bound",
             "% of ceiling", "forward only %", "linears alone %", "hf step ms", "hf tok/s"],
            rows, text_cols=1,
        ),
    ]  # fmt: skip


def scheduler_section(results: dict[str, Any]) -> list[str]:
    keys = ("median_s", "mean_s", "p90_s")
    rows = [[str(s["num_running"]), *(_num(s[k], ".3f", 1000) for k in keys)]
            for s in results["scheduler"]]  # fmt: skip
    return ["### Scheduler cost (continuous, fake runner)", ""] + markdown_table(
        ["running requests", "median ms", "mean ms", "p90 ms"], rows, text_cols=1
    )


def sweep_section(results: dict[str, Any]) -> list[str]:
    rows = []
    for pt in results["rate_sweep"]:
        f, ends = pt["figures"], ("p50", "p99")
        rows.append(
            [f"{pt['load']:g}", pt["arrivals"], pt["system"]]
            + ([pt["error"], "", "", ""] if pt["error"] else
               [_num(f["output_tok_s"]), _pcts(f, "ttft", ends), _pcts(f, "e2e", ends),
                _num(f["goodput_fraction"], ".0f", 100)])
        )  # fmt: skip
    intro = (
        "Offered load is a fraction of the request rate minicb continuous sustained on the "
        "headline workload in this run."
    )
    return ["### Latency against request rate", "", intro, ""] + markdown_table(
        ["load", "arrivals", "system", "output tok/s", "TTFT ms p50 / p99", "e2e ms p50 / p99",
         "goodput %"], rows, text_cols=3,
    )  # fmt: skip


def prefix_caching_section(results: dict[str, Any]) -> list[str]:
    rows, ratios = [], []
    for name, data in results.get("prefix_caching", {}).items():
        for k, f in data["figures"].items():
            rows.append([name, k, _cell(f["prefill_tokens"], ".0f"),
                         _cell(f["prefix_hit_rate"], ".0f", 100), _cell(f["ttft_p50"], ".0f", 1000),
                         _cell(f["output_tok_s"])])  # fmt: skip
        ratios.append(f"{name} = {_cell(data['on_over_off'], '.2f')}")
    if not rows:
        return []
    intro = (
        "minicb continuous with prefix caching off and on, in the same run: two siblings "
        "sharing the weights, a fresh KV pool each run."
    )
    return ["### Prefix caching: off against on", "", intro, ""] + markdown_table(
        ["workload", "caching", "prefill tokens computed", "prefix hit rate %", "TTFT p50 ms",
         "output tok/s"], rows, text_cols=2,
    ) + ["", "Output tok/s on / off (paired by repeat): " + "; ".join(ratios) + "."]  # fmt: skip


def goals_section(results: dict[str, Any]) -> list[str]:
    mark = {True: "met", False: "MISSED", None: "not measured"}
    rows = [[g["goal"], mark[g["met"]], g["note"]] for g in results["goals"]]
    return ["### Goals", ""] + markdown_table(["goal", "status", "detail"], rows, text_cols=3)


def render(results: dict[str, Any]) -> str:
    m = results["meta"]
    lines = [
        f"## minicb bench{' --quick' if m['quick'] else ''}: {m['model']}, {m['dtype']}, "
        f"{m['device']}, forward {m.get('compile', 'eager')}, {m['threads']} torch thread(s), "
        f"B = {m['max_num_seqs']}, "
        f"{m['repeats']} repeat(s)",
        "",
        f"Goodput targets: TTFT <= {m['ttft_slo']} s and TPOT <= {m['tpot_slo']} s.",
        "",
    ]
    predictions = (results.get("calibration") or {}).get("workloads", {})
    for name, data in results["workloads"].items():
        lines += workload_section(name, data, predictions.get(name))
    sections = (roofline_section, scheduler_section, sweep_section, prefix_caching_section)
    for section in (*sections, goals_section):
        lines += section(results) + [""]
    return "\n".join(lines)
