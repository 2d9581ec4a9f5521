"""The disaggregation reproduction's tables (SIMULATED), and the command that prints them.

``python -m minicb.fleet.disagg_report [--size 1.0] [--json PATH]`` runs
``disagg_reproduction.disaggregation`` (colocated against disaggregated prefill and decode
at equal GPU count, beside DistServe's and vLLM's claims) and prints its markdown: the
section docs/reproductions.md quotes. Every heading says SIMULATED and names the
profile. Pure Python: no torch.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from minicb.fleet.disagg_reproduction import disaggregation
from minicb.fleet.fleet_reproductions import PUBLISHED
from minicb.sim.markdown_table import markdown_table


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _table(rows: list[dict[str, Any]], extra: bool = False) -> list[str]:
    header = ["rate (req/s)", "system", "GPUs", "output tok/s", "TTFT P99", "TPOT P99",
              "within SLO", "goodput (req/s)"]  # fmt: skip
    if extra:
        header += ["link", "KV per request", "transfer"]
    cells = []
    for r in rows:
        row = [f"{r['rate']:g}", r["system"], r["split"], f"{r['output_tok_s']:.0f}",
               _ms(r["ttft_p99_s"]), _ms(r["tpot_p99_s"]), f"{r['attainment']:.0%}",
               f"{r['goodput_req_s']:.2f}"]  # fmt: skip
        if extra:
            row += [r["link"], f"{r['kv_mb_mean']:.0f} MB", f"{r['transfer_ms_mean']:.2f} ms"]
        cells.append(row)
    return markdown_table(header, cells)


def disaggregation_section(r: dict[str, Any]) -> list[str]:
    """The reproduction as markdown: the rate sweep, the SLO capacity of each system, the
    links, and the splits of four GPUs."""
    lines = [
        f"### Disaggregated prefill and decode (SIMULATED, {r['profile']})",
        "",
        f"Setup: {r['setup']}.",
        "",
        f"Published: {PUBLISHED['disaggregation']}.",
        "",
        "Two GPUs per system, at each rate:",
        "",
        *_table(r["rows"]),
        "",
        "Capacity under the SLO (the highest swept rate with 90 % of requests within both "
        "targets): "
        + ", ".join(f"{s} {c:g} req/s" for s, c in r["slo_capacity_req_s"].items())
        + ".",
        "",
        "The disaggregated pair over each link (the KV cache crosses it before the second token):",
        "",
        *_table(r["link_rows"], extra=True),
    ]
    if r["pool_rows"]:
        header = ["rate (req/s)", "decode blocks", "held back", "KV wait P99", "TTFT P99",
                  "TPOT P99", "within SLO"]  # fmt: skip
        rows = [
            [f"{p['rate']:g}", str(p["decode_blocks"]), str(p["held_back"]),
             _ms(p["queued_p99_s"]), _ms(p["ttft_p99_s"]), _ms(p["tpot_p99_s"]),
             f"{p['attainment']:.0%}"]
            for p in r["pool_rows"]
        ]  # fmt: skip
        lines += ["", "The disaggregated pair with smaller decode pools (backpressure: a request "
                  "that does not fit waits with its KV on the prefill side):", "",
                  *markdown_table(header, rows)]  # fmt: skip
    if r["split_rows"]:
        lines += ["", "Four GPUs, each split:", "", *_table(r["split_rows"])]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=float, default=1.0, help="scale of the request counts")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)
    t = time.perf_counter()
    result = disaggregation(args.size)
    print("\n".join(disaggregation_section(result)))
    print(f"(simulated; computed in {time.perf_counter() - t:.1f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**result, "simulated": True}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
