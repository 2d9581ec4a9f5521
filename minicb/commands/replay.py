"""``minicb replay FILE``: the metrics of a recorded trace, its Perfetto export, and
``--serve``: the visualizer, fed from the trace, with a scrub slider and no model loaded."""

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
    p.add_argument(
        "--serve",
        action="store_true",
        help="open the trace in the visualizer (a demo trace's FILE.static.jsonl comes too)",
    )
    from minicb.server.serving import add_server_options

    add_server_options(p)
    p.set_defaults(func=run)


def replay_traces(path: str) -> dict:
    """Panel name -> Trace: the file itself, and its static sibling from ``minicb demo``."""
    from pathlib import Path

    from minicb.telemetry.trace import read_trace

    main = Path(path)
    sibling = main.with_name(main.stem + ".static" + main.suffix)
    traces = {}
    for p in [main] + ([sibling] if sibling.exists() and sibling != main else []):
        trace = read_trace(p)
        name = trace.header.get("panel") or (trace.header.get("config") or {}).get("batching")
        traces[name if name and name not in traces else p.stem] = trace
    return traces


def serve(args: argparse.Namespace) -> int:
    from minicb.server.app import create_app
    from minicb.server.serving import run_server

    try:
        traces = replay_traces(args.trace)
    except OSError as err:
        raise ValueError(f"cannot read {args.trace}: {err.strerror}") from err
    app = create_app(None, {}, mode="replay", replay=traces)
    run_server(app, args, "minicb replay")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.serve:
        return serve(args)
    from minicb.telemetry.metrics import compute_metrics
    from minicb.telemetry.metrics import format_summary
    from minicb.telemetry.trace import read_trace
    from minicb.telemetry.trace import write_chrome_trace

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
