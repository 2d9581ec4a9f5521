"""``minicb replay FILE``: the metrics of a recorded trace, and its Perfetto export."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="print the metrics of a recorded trace")
    p.add_argument("trace", metavar="FILE", help="a JSONL trace written with --trace")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument(
        "--perfetto",
        metavar="OUT.json",
        help="also write a Chrome/Perfetto trace (open it in ui.perfetto.dev)",
    )
    p.add_argument("--ttft-slo", type=float, default=None, metavar="S", help="TTFT target (s)")
    p.add_argument("--tpot-slo", type=float, default=None, metavar="S", help="TPOT target (s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minicb.metrics import compute_metrics
    from minicb.metrics_report import format_summary
    from minicb.trace import read_trace
    from minicb.trace_export import write_chrome_trace

    try:
        trace = read_trace(args.trace)
    except OSError as err:
        raise ValueError(f"cannot read {args.trace}: {err.strerror}") from err
    summary = compute_metrics(trace.events, args.ttft_slo, args.tpot_slo)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        h = trace.header
        print(f"trace {args.trace}: model {h.get('model')}, {len(trace.events)} events")
        print(format_summary(summary))
    if args.perfetto:
        write_chrome_trace(trace.events, args.perfetto, trace.header)
        if not args.json:
            print(f"Perfetto trace written to {args.perfetto} (open it in ui.perfetto.dev)")
    return 0
