"""The results as markdown tables: printed on the terminal, pasted into the docs."""

from __future__ import annotations

from typing import Any

Spread = dict[str, float] | None


def _num(x: float | None, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def _cell(s: Spread, fmt: str = ".1f", scale: float = 1.0) -> str:
    """median (min-max), or just the median when there was one run."""
    if not s:
        return "-"
    med, lo, hi = (_num(s[k], fmt, scale) for k in ("median", "min", "max"))
    return med if lo == hi else f"{med} ({lo}-{hi})"


def _med(s: Spread) -> float | None:
    return s["median"] if s else None


def _pcts(fig: dict[str, Spread], name: str) -> str:
    """p50 / p90 / p99 medians, in ms."""
    return " / ".join(
        _num(_med(fig.get(f"{name}_{q}")), ".0f", 1000) for q in ("p50", "p90", "p99")
    )


def _table(header: list[str], rows: list[list[str]], text_cols: int = 1) -> list[str]:
    """A markdown table; the first ``text_cols`` columns align left, numbers right."""
    align = ["---"] * text_cols + ["---:"] * (len(header) - text_cols)
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def workload_section(name: str, data: dict[str, Any]) -> list[str]:
    d = data["definition"]
    lines = [f"### {name}", "", f"{d['description']}; arrivals {d['arrivals']}.", ""]
    figs = data["figures"]
    rows = []
    for system, f in figs.items():
        if data["errors"].get(system):
            rows.append([system, f"did not run: {data['errors'][system]}"] + [""] * 7)
            continue
        rows.append(
            [system, _cell(f["output_tok_s"]), _cell(f["total_tok_s"]), _cell(f["req_s"], ".2f"),
             _cell(f["slot_occupancy"], ".0f", 100), _cell(f["padding_waste"], ".0f", 100),
             _cell(f["kv_utilisation"], ".0f", 100), _cell(f["preemptions"], ".0f"),
             f"{_num(_med(f['goodput_req_s']), '.2f')} "
             f"({_num(_med(f['goodput_fraction']), '.0f', 100)} %)"]
        )  # fmt: skip
    lines += _table(
        ["system", "output tok/s", "total tok/s", "req/s", "occupancy %", "padding %",
         "KV util %", "preemptions", "goodput req/s (share)"], rows,
    )  # fmt: skip
    lines.append("")
    rows = [
        [s, _pcts(f, "ttft"), _pcts(f, "tpot"), _pcts(f, "itl"), _pcts(f, "e2e")]
        for s, f in figs.items()
        if not data["errors"].get(s)
    ]
    lines += _table(["latency, ms (p50 / p90 / p99)", "TTFT", "TPOT", "ITL", "end-to-end"], rows)
    lines += ["", _ratios_line(data), *_theory_lines(data), *_outside_lines(data), ""]
    return lines


def _ratios_line(data: dict[str, Any]) -> str:
    parts = [
        f"{pair} = {_cell(s, '.2f')}"
        for pair, s in data["ratios"].items()
        if pair.startswith("minicb-continuous /")
    ]
    return "Output tok/s ratios (paired by repeat): " + ("; ".join(parts) or "-") + "."


def _theory_lines(data: dict[str, Any]) -> list[str]:
    t = data.get("theory")
    if not t:
        return []
    m, pred = t["step_model"], t["predicted"]
    return [
        "",
        f"Step-time model fitted to {m['steps']} minicb steps: t = {m['a_s'] * 1000:.1f} ms + "
        f"{m['c_s'] * 1000:.2f} ms x rows + {m['p_s'] * 1000:.3f} ms x prompt tokens "
        f"(R^2 {m['r2']:.2f}). Predicted runtimes: static {pred['static_s']:.1f} s, "
        f"continuous {pred['continuous_s']:.1f} s (measured medians "
        f"{t['measured_wall_s']['minicb-static']:.1f} s and "
        f"{t['measured_wall_s']['minicb-continuous']:.1f} s). Continuous/static: measured "
        f"{_cell(t['measured_ratio'], '.2f')}, predicted {pred['ratio']:.2f} "
        f"(H_B = {pred['harmonic_B']:.2f}); error {_num(t['relative_error'], '+.0f', 100)} %.",
    ]


def _outside_lines(data: dict[str, Any]) -> list[str]:
    parts = []
    for system, s in data.get("outside_model", {}).items():
        if s.get("outside") is not None:
            parts.append(
                f"{system} {s['outside'] * 100:.1f} % (schedule {s['schedule'] * 100:.2f} %, "
                f"sample {s['sample'] * 100:.1f} %, other {s['other'] * 100:.1f} %)"
            )
    return (
        ["", "Share of iteration time outside the model forward: " + "; ".join(parts) + "."]
        if parts
        else []
    )


def _samples(hw: dict[str, Any], key: str, unit: float, fmt: str) -> str:
    values = hw.get(f"{key}_samples") or [hw[key]]
    return "best of " + " and ".join(format(v / unit, fmt) for v in values)


def roofline_section(results: dict[str, Any]) -> list[str]:
    hw, rf = results["hardware"], results["roofline"]
    lines = [
        "### Decode against the hardware ceiling",
        "",
        f"Copy bandwidth {hw['copy_bandwidth'] / 1e9:.1f} GB/s ({hw['copy_bytes'] >> 20} MiB "
        f"copy, read + write; {_samples(hw, 'copy_bandwidth', 1e9, '.1f')}), matmul "
        f"{hw['matmul_flops'] / 1e9:.0f} GFLOP/s ({hw['matmul_n']}^3; "
        f"{_samples(hw, 'matmul_flops', 1e9, '.0f')}); "
        f"weights streamed per step {rf['sizes']['weight_bytes'] / 1e6:.0f} MB, KV "
        f"{rf['sizes']['kv_bytes_per_token'] / 1e3:.1f} kB per token of context.",
        "",
    ]
    rows = [
        [str(p["batch"]), f"{p['context']:.0f}",
         _cell({"median": p["step_s"], "min": p.get("step_s_min", p["step_s"]),
                "max": p.get("step_s_max", p["step_s"])}, ".1f", 1000),
         f"{p['forward_s'] * 1000:.1f}", f"{p['tok_s']:.1f}", f"{p['ceiling_tok_s']:.0f}",
         p["bound"], f"{p['fraction'] * 100:.0f}", f"{p['forward_fraction'] * 100:.0f}",
         _num(p.get("hf_step_s"), ".1f", 1000), _num(p.get("hf_tok_s"))]
        for p in rf["points"]
    ]  # fmt: skip
    return lines + _table(
        ["batch", "context", "step ms", "forward ms", "tok/s", "ceiling tok/s", "bound",
         "% of ceiling", "forward only %", "hf step ms", "hf tok/s"], rows,
    )  # fmt: skip


def scheduler_section(results: dict[str, Any]) -> list[str]:
    rows = [
        [str(s["num_running"]), f"{s['median_s'] * 1000:.3f}", f"{s['mean_s'] * 1000:.3f}",
         f"{s['p90_s'] * 1000:.3f}"]
        for s in results["scheduler"]
    ]  # fmt: skip
    return ["### Scheduler cost (continuous, fake runner)", ""] + _table(
        ["running requests", "median ms", "mean ms", "p90 ms"], rows
    )


def sweep_section(results: dict[str, Any]) -> list[str]:
    rows = []
    for pt in results["rate_sweep"]:
        f = pt["figures"]
        if pt["error"]:
            rows.append([f"{pt['load']:g}", pt["arrivals"], pt["system"], pt["error"], "", "", ""])
            continue
        rows.append(
            [f"{pt['load']:g}", pt["arrivals"], pt["system"], _num(f.get("output_tok_s")),
             f"{_num(f.get('ttft_p50'), '.0f', 1000)} / {_num(f.get('ttft_p99'), '.0f', 1000)}",
             f"{_num(f.get('e2e_p50'), '.0f', 1000)} / {_num(f.get('e2e_p99'), '.0f', 1000)}",
             _num(f.get("goodput_fraction"), ".0f", 100)]
        )  # fmt: skip
    intro = (
        "Offered load is a fraction of the request rate minicb continuous sustained on the "
        "headline workload in this run."
    )
    return ["### Latency against request rate", "", intro, ""] + _table(
        ["load", "arrivals", "system", "output tok/s", "TTFT ms p50 / p99", "e2e ms p50 / p99",
         "goodput %"], rows, text_cols=3,
    )  # fmt: skip


def goals_section(results: dict[str, Any]) -> list[str]:
    mark = {True: "met", False: "MISSED", None: "not measured"}
    rows = [[g["goal"], mark[g["met"]], g["note"]] for g in results["goals"]]
    return ["### Goals", ""] + _table(["goal", "status", "detail"], rows, text_cols=3)


def render(results: dict[str, Any]) -> str:
    m = results["meta"]
    lines = [
        f"## minicb bench{' --quick' if m['quick'] else ''}: {m['model']}, {m['dtype']}, "
        f"{m['device']}, {m['threads']} torch thread(s), B = {m['max_num_seqs']}, "
        f"{m['repeats']} repeat(s)",
        "",
        f"Goodput targets: TTFT <= {m['ttft_slo']} s and TPOT <= {m['tpot_slo']} s.",
        "",
    ]
    for name, data in results["workloads"].items():
        lines += workload_section(name, data)
    for section in (roofline_section, scheduler_section, sweep_section, goals_section):
        lines += section(results) + [""]
    return "\n".join(lines)
