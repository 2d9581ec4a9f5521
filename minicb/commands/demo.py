"""``minicb demo``: static and continuous batching side by side, live in the browser.

Two engines on one copy of the weights, fed the same workload by one feeder, stepped in
turn by one engine thread (so both advance together), and a web server that draws them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from minicb.config import add_engine_options, engine_kwargs
from minicb.telemetry.trace import add_trace_option
from minicb.server.serving import add_server_options, run_server
from minicb.server.workload import LENGTHS, PRESETS

# Small enough to read on the projector and to move on two CPU cores.
DEMO_DEFAULTS = dict(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=128)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="static vs continuous batching, live in the browser (the visualizer)"
    )
    add_engine_options(p)  # --batching is ignored: the demo runs both
    p.set_defaults(**DEMO_DEFAULTS)
    add_server_options(p)
    add_trace_option(p)
    w = p.add_argument_group("workload (the same for both engines)")
    w.add_argument("--workload", default="poisson", choices=PRESETS, help="arrival pattern")
    w.add_argument("--rate", type=float, default=0.7, help="poisson arrivals per second")
    w.add_argument("--lengths", default="mixed", choices=LENGTHS, help="output lengths")
    w.add_argument("--burst", type=int, default=12, help="requests arriving at the start")
    w.add_argument("--short", type=int, nargs=2, default=(4, 12), metavar=("MIN", "MAX"))
    w.add_argument("--long", type=int, nargs=2, default=(24, 48), metavar=("MIN", "MAX"))
    w.add_argument("--delay", type=float, default=0.0, help="seconds to wait between rounds")
    w.add_argument("--paused", action="store_true", help="start paused (step it from the page)")
    p.set_defaults(func=run)


def build_demo(args: argparse.Namespace) -> tuple[Any, Any]:
    """The engine loop (not started) and the app of a demo, from parsed options."""
    from minicb.config import EngineConfig
    from minicb.engine import LLMEngine
    from minicb.telemetry.bus import attach
    from minicb.server.app import create_app
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.workload import WorkloadFeeder, WorkloadSpec

    kwargs = engine_kwargs(args)
    kwargs.pop("batching")
    continuous = LLMEngine(args.model, EngineConfig(batching="continuous", **kwargs))
    static = LLMEngine(
        config=EngineConfig(batching="static", **kwargs), share_weights_with=continuous
    )
    loop = EngineLoop({"static": static, "continuous": continuous})
    loop.paused, loop.delay_s = args.paused, args.delay
    buses = {name: attach(engine) for name, engine in loop.engines.items()}
    spec = WorkloadSpec(preset=args.workload, rate=args.rate, lengths=args.lengths)
    feeder = WorkloadFeeder(spec, short=tuple(args.short), long=tuple(args.long))
    feeder.burst(args.burst)
    loop.round_hooks.append(feeder)
    app = create_app(loop, buses, mode="demo", model_name=continuous.model_name, feeder=feeder)
    _install_openai(app, loop, continuous.model_name)
    app.state.close_trace = _record(app, loop, args) if args.trace else (lambda: None)
    return loop, app


def _install_openai(app: Any, loop: Any, model_name: str) -> None:
    """Add the OpenAI-compatible routes, aimed at the continuous engine, when present."""
    if importlib.util.find_spec("minicb.server.openai_api") is None:
        return
    from minicb.server.openai_api import install_openai_routes

    install_openai_routes(app, loop, "continuous", model_name)


def trace_paths(path: str) -> dict[str, Path]:
    """One trace per engine: FILE for continuous, FILE's stem + .static.jsonl for static."""
    main = Path(path)
    return {"continuous": main, "static": main.with_name(main.stem + ".static" + main.suffix)}


def _record(app: Any, loop: Any, args: argparse.Namespace) -> Any:
    """Record each engine's events to its trace file until the settings change or the
    demo ends; returns the function that closes the files."""
    from minicb.telemetry.trace import TraceWriter, trace_header

    hub = app.state.hub
    writers = {}
    for name, path in trace_paths(args.trace).items():
        engine = loop.engines[name]
        writers[name] = TraceWriter(path, trace_header(engine, command="demo", panel=name))
        hub.buses[name].subscribe(writers[name])

    def close() -> None:
        for name, writer in writers.items():
            hub.buses[name].unsubscribe(writer)
            writer.close()
        writers.clear()

    def stop(_engines: Any) -> None:
        # New engines number their requests from 0 again: a trace must not mix the two.
        if writers:
            close()
            print("minicb demo: settings changed; the trace stops here", file=sys.stderr)

    hub.rebuild_hooks.append(stop)
    return close


def run(args: argparse.Namespace) -> int:
    print("minicb demo: loading the model ...", flush=True)
    loop, app = build_demo(args)
    loop.start()
    try:
        run_server(app, args, "minicb demo")
    finally:
        loop.stop()
        app.state.close_trace()
    return 0
