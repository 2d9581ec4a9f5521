"""What ``minicb demo``, ``minicb serve`` and ``minicb replay --serve`` start.

- demo: static and continuous batching side by side, live in the browser: two engines on
  one copy of the weights, fed the same workload by one feeder, stepped in turn by one
  engine thread (so both advance together); the OpenAI routes aim at the continuous one.
- serve: one continuous-batching engine behind the OpenAI-compatible API; the same app
  hosts the visualizer, so ``/`` shows API traffic joining the batch live:

      minicb serve --port 8000
      curl localhost:8000/v1/completions -H 'content-type: application/json' \\
           -d '{"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 8}'

- serve --replicas N --router POLICY: N engines, each in its own process with its own copy
  of the model and its own KV pool, behind the same API; the router (round-robin,
  least-loaded, prefix-aware) picks the replica of each request and says why on the page
  (minicb/fleet).
- replay: the visualizer fed from recorded traces, with a scrub slider and no model.
- demo --simulate GPU:MODEL: the same demo at data-centre scale on a GPU that is not
  there (minicb/sim/runner.py): 256 slots, the KV pool of that GPU, step times
  predicted, paced against the wall clock by ``--speed`` (pacing.py). The page, its
  title, the traces and the reports say "simulated" and name the profile.

Who may connect: with no ``--api-key`` the server listens on loopback only (a
non-loopback ``--host`` is refused unless ``--insecure-public``); with one, the
guard (guard.Guard) holds /v1, /ws, /metrics and the replay's traces, and
``--viewer-key`` gives a room read-only access. See docs/serving.md.

Building the parsers imports nothing heavy: torch, the model and uvicorn are imported
when a command runs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minicb.config import add_engine_options, describe_choices, engine_kwargs
from minicb.fleet.router import POLICIES
from minicb.server.guard import LOOPBACK, Guard
from minicb.server.workload import LENGTHS, PRESETS
from minicb.telemetry.trace import add_trace_option, traced

if TYPE_CHECKING:
    from fastapi import FastAPI

    from minicb.engine import LLMEngine
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.lesson import Lesson
    from minicb.telemetry.trace_reader import Trace

DEFAULT_HOST = "127.0.0.1"  # local only by default: the demo has controls anyone could use
DEFAULT_PORT = 8000
# Small enough to read on the projector and to move on two CPU cores.
DEMO_DEFAULTS = dict(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=128)
# The opening: a burst of three times the slots, sent again each time both engines are done
# (docs/teaching.md, 0:00); rate is for --workload poisson.
DEMO_WORKLOAD = dict(rate=0.7, burst=24, short=(4, 12), long=(24, 48), max_outstanding=48)
SERVE_ENGINE = "api"  # the one engine's name in serve mode
WS_MAX_BYTES = 2 << 20  # the largest WebSocket frame uvicorn reads


# ---- the command line ------------------------------------------------------------------
def add_server_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    g.add_argument("--open", action="store_true", help="open the page in a browser")
    g.add_argument("--api-key", help="the controller's key: /v1 (Bearer), /ws, /metrics")
    g.add_argument("--viewer-key", help="a read-only key for the page (needs --api-key)")
    g.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="another origin whose pages may open /ws (e.g. https://course.example.org)",
    )
    g.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name this server is reached by, beyond localhost and IP addresses (e.g. "
        "teacher.local); requests naming any other Host are refused",
    )
    g.add_argument("--show-text", action="store_true", help="viewers see prompts and outputs")
    g.add_argument("--metrics-public", action="store_true", help="/metrics without a key")
    g.add_argument(
        "--insecure-public",
        action="store_true",
        help="listen beyond loopback with no key (anyone who can reach the port can drive it)",
    )


def server_guard(args: argparse.Namespace) -> Guard:
    """The guard the options ask for; ValueError, saying why, for a host it would leave
    open to the network."""
    if args.viewer_key and not args.api_key:
        raise ValueError("--viewer-key needs --api-key (with no key the server has no door)")
    if args.viewer_key and args.viewer_key == args.api_key:
        raise ValueError("--viewer-key must differ from --api-key")
    if not args.api_key and args.host not in LOOPBACK and not args.insecure_public:
        raise ValueError(
            f"refusing to listen on {args.host} without --api-key: anyone who can reach the "
            "port could read every prompt and output and pause, step or rebuild the engine. "
            "Give --api-key KEY (and --viewer-key for a room), or --insecure-public on a "
            "network you trust"
        )
    return Guard(
        api_key=args.api_key,
        viewer_key=args.viewer_key,
        allowed_origins=tuple(args.allowed_origin),
        allowed_hosts=tuple(args.allowed_host),
        metrics_public=args.metrics_public,
        show_text=args.show_text,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` and ``serve`` subcommands."""
    p = subparsers.add_parser(
        "demo", help="static vs continuous batching, live in the browser (the visualizer)"
    )
    add_engine_options(p)  # --batching is ignored: the demo runs both
    p.set_defaults(measure_utilisation=True)  # the page charts each step's utilisation
    # Unset here, so that --simulate can pick its own defaults (resolve_demo_defaults).
    p.set_defaults(**{name: None for name in DEMO_DEFAULTS})
    add_server_options(p)
    add_trace_option(p)
    s = p.add_argument_group("simulation (no weights: a named GPU's step times, predicted)")
    s.add_argument(
        "--simulate",
        metavar="GPU:MODEL",
        help="run on a simulated GPU, e.g. H100:llama-3.1-8b (catalogue: docs/simulation.md)",
    )
    s.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per wall second (default 1)"
    )
    s.add_argument(
        "--host-time",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count the host's time per step (this engine's, measured on start: "
        "minicb/sim/host_time.py), so the lanes show the device's idle share; with "
        "--overlap-scheduling the simulated GPU hides it behind the device's (default on)",
    )
    s.add_argument(
        "--host-us-per-row",
        type=float,
        help="the host's microseconds per row of a step, instead of measuring this engine's",
    )
    p.add_argument(
        "--scenario",
        metavar="NAME",
        help="play a lesson: a shipped scenario's name or a scenario file (docs/scenarios.md); "
        "its settings replace the engine, workload and --simulate options",
    )
    w = p.add_argument_group("workload (the same for both engines; defaults depend on --simulate)")
    w.add_argument(
        "--workload",
        choices=PRESETS,
        help="arrival pattern (default: the opening, a burst of --burst requests sent again "
        "each time both engines are done; poisson if --rate is given)",
    )
    w.add_argument("--rate", type=float, help="poisson arrivals per second (0.7; simulated 60)")
    w.add_argument("--lengths", default="mixed", choices=LENGTHS, help="output lengths")
    w.add_argument("--burst", type=int, help="requests arriving at the start (24; simulated 768)")
    w.add_argument("--short", type=int, nargs=2, metavar=("MIN", "MAX"), help="(4 12; 16 128)")
    w.add_argument("--long", type=int, nargs=2, metavar=("MIN", "MAX"), help="(24 48; 256 768)")
    w.add_argument(
        "--max-outstanding", type=int, help="skip arrivals while an engine holds this many"
    )
    w.add_argument("--delay", type=float, default=0.0, help="seconds to wait between rounds")
    w.add_argument("--paused", action="store_true", help="start paused (step it from the page)")
    p.set_defaults(func=run_demo)

    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible API and the visualizer")
    add_server_options(p)
    p.add_argument("--served-model-name", help="the 'model' clients pass (default: its own name)")
    p.add_argument(
        "--max-waiting", type=int, default=256, help="waiting requests before a 429 (default 256)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    f = p.add_argument_group("replicas (each an engine in its own process, behind a router)")
    f.add_argument(
        "--replicas", type=int, default=1, help="engines behind the API (default 1: no router)"
    )
    f.add_argument(
        "--router",
        default="round-robin",
        choices=POLICIES,
        help="which replica gets a request (default round-robin; docs: minicb/fleet/router.py)",
    )
    f.add_argument(
        "--disaggregate",
        metavar="P:D",
        help="P prefill and D decode engines, each its own process, the KV cache sent between "
        "them over torch.distributed (minicb/fleet/disagg_fleet.py); not with --replicas",
    )
    add_engine_options(p)
    p.set_defaults(measure_utilisation=True)
    add_trace_option(p)
    p.set_defaults(func=run_serve)


def run_server(
    app: Any, args: argparse.Namespace, what: str, loop: EngineLoop | None = None
) -> None:
    """Serve ``app`` (and run ``loop``'s thread) until Ctrl-C or SIGTERM, after printing
    where to look; uvicorn logs at ``--log-level`` where the command has one."""
    import uvicorn

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{host}:{args.port}/"
    print(f"{what}: open {url} in a browser (Ctrl-C to stop)", flush=True)
    if args.api_key:
        print("  behind a key: the page asks for it once; a link can carry it as ?key=KEY")
    if args.open:
        webbrowser.open(url)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again under the handler it
    # found; with the default one the process would die there, before the caller's finally
    # blocks stop the engine thread and close the trace files. So make it a SystemExit.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    log_level = getattr(args, "log_level", "warning")
    keep_keys_out_of_logs()
    if loop is not None:
        loop.start()
    try:
        # A control is at most 16 KiB (viewer_socket.MAX_MESSAGE_CHARS, answered with an error); a
        # frame far beyond that closes its connection without being buffered whole. No
        # permessage-deflate: the broadcast compresses each frame once for every browser.
        uvicorn.run(
            app, host=args.host, port=args.port, log_level=log_level, ws_max_size=WS_MAX_BYTES,
            ws_per_message_deflate=False,
        )  # fmt: skip
    finally:
        if loop is not None:
            loop.stop()


def hide_query(record: logging.LogRecord) -> bool:
    """A log filter: paths without their query, which may hold ``?key=KEY``. uvicorn logs
    each request (``uvicorn.access``) and each WebSocket (``uvicorn.error``) with the path
    and query as one of the record's arguments."""
    if isinstance(record.args, tuple):
        record.args = tuple(
            a.split("?", 1)[0] if isinstance(a, str) and a.startswith("/") else a
            for a in record.args
        )
    return True


def keep_keys_out_of_logs() -> None:
    """Log every request's path without its query (uvicorn's logging setup keeps it)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(hide_query)


def _app(
    loop: EngineLoop,
    mode: str,
    engine: str,
    model_name: str,
    guard: Guard,
    lesson: Lesson | None = None,
    **api: Any,
) -> FastAPI:
    """The visualizer's app for ``loop`` (playing ``lesson``, if any) with the OpenAI
    routes aimed at ``engine``, both behind ``guard``."""
    from minicb.server.app import create_app
    from minicb.server.openai_api import install_openai_routes

    app = create_app(loop, mode=mode, model_name=model_name, guard=guard, lesson=lesson)
    install_openai_routes(app, loop, engine, model_name, guard=guard, **api)
    return app


# ---- demo ------------------------------------------------------------------------------
def resolve_demo_defaults(args: argparse.Namespace) -> None:
    """Fill the engine and workload options left unset with the demo's defaults: small for
    the real model on a CPU, a serving engine's scale for a simulated GPU."""
    from minicb.sim.demo import SIMULATED_DEFAULTS, SIMULATED_WORKLOAD

    simulated = getattr(args, "simulate", None)
    if getattr(args, "workload", "poisson") is None:  # the opening, unless a rate was asked
        args.workload = "poisson" if args.rate is not None else "burst"
        args.repeat = args.workload == "burst"
    engine = SIMULATED_DEFAULTS if simulated else DEMO_DEFAULTS
    workload = SIMULATED_WORKLOAD if simulated else DEMO_WORKLOAD
    for name, value in {**engine, **workload}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def demo_engines(args: argparse.Namespace) -> dict[str, LLMEngine]:
    """Static and continuous engines on one copy of the weights, or, with ``--simulate``,
    on two simulated GPUs of that profile, each with its own virtual clock."""
    from minicb.config import EngineConfig
    from minicb.engine import LLMEngine

    kwargs = engine_kwargs(args)
    kwargs.pop("batching")
    configs = {b: EngineConfig(batching=b, **kwargs) for b in ("static", "continuous")}
    if args.simulate:
        from minicb.sim.demo import simulated_engines

        host = None
        if getattr(args, "host_time", False):
            from minicb.sim.host_time import HostTime, measure_engine_host_time

            per_row = getattr(args, "host_us_per_row", None)
            if per_row is None:
                host = measure_engine_host_time(steps=8)
            else:
                host = HostTime("given", 0.0, per_row * 1e-6, "--host-us-per-row")
        return simulated_engines(args.simulate, configs, host_time=host)
    continuous = LLMEngine(args.model, configs["continuous"])
    runner = continuous.runner.with_config(configs["static"])
    return {"static": LLMEngine(config=configs["static"], runner=runner), "continuous": continuous}


def build_demo(args: argparse.Namespace) -> tuple[EngineLoop, FastAPI]:
    """The engine loop (not started) and the app of a demo, from parsed options."""
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.workload import WorkloadFeeder, WorkloadSpec
    from minicb.sim.pacing import MAX_TICK_S, Pacer

    guard = server_guard(args)  # before the model loads: a refused host costs no wait
    if args.scenario:
        return build_lesson(args, guard)
    resolve_demo_defaults(args)
    pacer = Pacer(args.speed) if args.simulate else None
    engines = demo_engines(args)
    opening = args.workload == "burst"  # the burst is the workload: --burst requests
    spec = WorkloadSpec(
        preset=args.workload,
        rate=args.rate,
        lengths=args.lengths,
        max_outstanding=args.max_outstanding,
        **({"count": args.burst, "repeat": getattr(args, "repeat", False)} if opening else {}),
    )
    timing = dict(clock=pacer.now, max_tick_s=MAX_TICK_S * pacer.speed) if pacer else {}
    feeder = WorkloadFeeder(spec, short=tuple(args.short), long=tuple(args.long), **timing)
    if not opening:
        feeder.burst(args.burst)
    loop = EngineLoop(engines, feeder=feeder)
    loop.paused, loop.delay_s, loop.pacer = args.paused, args.delay, pacer
    return loop, _app(loop, "demo", "continuous", engines["continuous"].model_name, guard)


def build_lesson(args: argparse.Namespace, guard: Guard) -> tuple[EngineLoop, FastAPI]:
    """The demo playing ``--scenario``: its engines, feeder and narration (lesson.py)."""
    from minicb.scenarios import load_scenario
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.lesson import PANELS, Lesson, lesson_engines

    if args.trace:
        raise ValueError(
            "--trace records a free demo; a scenario's trace comes from "
            "`minicb scenario export NAME --trace FILE`"
        )
    scenario = load_scenario(args.scenario)
    engines = lesson_engines(scenario, args.model)
    loop = EngineLoop(engines)
    lesson = Lesson(loop, scenario, args.model)
    loop.paused = args.paused
    model = engines[PANELS[1]].model_name
    return loop, _app(loop, "demo", PANELS[1], model, guard, lesson=lesson)


def trace_paths(path: str) -> dict[str, Path]:
    """One trace per engine: FILE for continuous, FILE's stem + .static.jsonl for static."""
    main = Path(path)
    return {"continuous": main, "static": main.with_name(main.stem + ".static" + main.suffix)}


def replica_trace_paths(path: str, names: list[str]) -> dict[str, Path]:
    """One trace per replica: FILE for the first, FILE's stem + .replicaK.jsonl for the
    others (each replica numbers its own requests, so one file could not hold two)."""
    main = Path(path)
    return {
        name: main if k == 0 else main.with_name(f"{main.stem}.{name}{main.suffix}")
        for k, name in enumerate(names)
    }


def record_traces(
    engines: dict[str, LLMEngine], files: dict[str, Path], command: str
) -> Callable[[], None]:
    """Record each engine's events to its file until its settings change or the run ends;
    returns the function that closes the files. A rebuilt engine numbers its requests from
    0 again, and a trace must not mix the two: its "reset" event closes the trace."""
    from minicb.telemetry.events import EVENT_KINDS
    from minicb.telemetry.trace import TraceWriter, trace_header

    writers: dict[str, TraceWriter] = {}

    def close(name: str, reset: bool = False) -> None:
        writer = writers.pop(name, None)
        if writer is None:
            return
        engines[name].bus.unsubscribe(writer)  # the bus that a rebuilt engine keeps
        writer.close()
        if reset:
            print(
                f"minicb {command}: settings changed; the {name} trace stops here", file=sys.stderr
            )

    def close_all() -> None:
        for name in list(writers):
            close(name)

    for name, file in files.items():
        bus = engines[name].bus
        header = trace_header(engines[name], command=command, panel=name)
        writers[name] = TraceWriter(file, header, engines[name].kv_snapshot_event)
        bus.subscribe(writers[name], kinds=EVENT_KINDS - {"reset"})
        bus.subscribe(lambda _events, name=name: close(name, reset=True), kinds=["reset"])
    return close_all


def run_demo(args: argparse.Namespace) -> int:
    if args.scenario:
        print(f"minicb demo: scenario {args.scenario}", flush=True)
    elif args.simulate:
        print(f"minicb demo: SIMULATED {args.simulate} (no weights, predicted step times)")
    else:
        print("minicb demo: loading the model ...", flush=True)
    loop, app = build_demo(args)
    runner = list(loop.engines.values())[-1].describe()["runner"]  # continuous, or right
    print(f"minicb demo: {describe_choices(runner)}", flush=True)
    engines = dict(loop.engines)
    close_traces = record_traces(engines, trace_paths(args.trace), "demo") if args.trace else None
    try:
        run_server(app, args, "minicb demo", loop)
    finally:
        if close_traces is not None:
            close_traces()  # after the engine thread stopped: no event comes any more
    return 0


# ---- serve -----------------------------------------------------------------------------
def build_serve(args: argparse.Namespace) -> tuple[FastAPI, EngineLoop, LLMEngine, str]:
    """The engine, its thread and the app, with the API routes; nothing started."""
    from minicb.config import EngineConfig
    from minicb.engine import LLMEngine
    from minicb.server.engine_loop import EngineLoop

    guard = server_guard(args)
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be at least 1, got {args.max_waiting}")
    if args.max_body_bytes < 1024:
        raise ValueError(f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}")
    api = dict(max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes)
    if getattr(args, "disaggregate", None):
        return build_disaggregated(args, guard, api)
    if getattr(args, "replicas", 1) != 1:
        return build_fleet(args, guard, api)
    engine = LLMEngine(args.model, EngineConfig.from_kwargs(**engine_kwargs(args)))
    name = args.served_model_name or engine.model_name
    loop = EngineLoop({SERVE_ENGINE: engine})
    return _app(loop, "serve", SERVE_ENGINE, name, guard, **api), loop, engine, name


def build_fleet(args: argparse.Namespace, guard: Guard, api: dict[str, Any]) -> tuple:
    """``serve --replicas N``: the replicas' processes (started, their models loaded), the
    loop that routes to them, and the app with the API aimed at the fleet."""
    from minicb.fleet.fleet import FLEET, Fleet

    if args.replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {args.replicas}")
    fleet = Fleet(args.model, args.replicas, args.router, **engine_kwargs(args))
    name = args.served_model_name or fleet.model_name
    loop = fleet.engine_loop()
    return _app(loop, "serve", FLEET, name, guard, **api), loop, fleet, name


def build_disaggregated(args: argparse.Namespace, guard: Guard, api: dict[str, Any]) -> tuple:
    """``serve --disaggregate P:D``: the engines' processes (started, their models loaded),
    the loop over them, and the app with the API aimed at the prefill/decode fleet."""
    from minicb.fleet.disagg_fleet import DisaggregatedFleet
    from minicb.fleet.fleet import FLEET

    prefill, decode = parse_disaggregate(args.disaggregate)
    options = engine_kwargs(args)
    refused = [
        words
        for words, clash in (
            (f"--replicas {args.replicas}", args.replicas != 1),
            (f"--tensor-parallel-size {options.get('tensor_parallel_size')}",
             (options.get("tensor_parallel_size") or 1) != 1),
            (f"--batching {options.get('batching')}",
             options.get("batching", "continuous") != "continuous"),
            ("--overlap-scheduling", bool(options.get("overlap_scheduling"))),
        )
        if clash
    ]  # fmt: skip
    if refused:
        raise ValueError(
            f"--disaggregate {args.disaggregate} does not work with {', '.join(refused)}: each "
            "prefill and decode engine is one continuous-batching engine on one rank"
        )
    fleet = DisaggregatedFleet(args.model, prefill, decode, **options)
    name = args.served_model_name or fleet.model_name
    loop = fleet.engine_loop()
    return _app(loop, "serve", FLEET, name, guard, **api), loop, fleet, name


def parse_disaggregate(text: str) -> tuple[int, int]:
    """P and D of "P:D", both at least 1; ValueError naming the form otherwise."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(
            f"--disaggregate takes P:D, two positive integers (e.g. 1:1), got {text!r}"
        )
    return int(parts[0]), int(parts[1])


def run_serve(args: argparse.Namespace) -> int:
    if getattr(args, "disaggregate", None):
        print(f"minicb serve: starting {args.disaggregate} prefill:decode engines ...", flush=True)
    elif getattr(args, "replicas", 1) != 1:
        print(f"minicb serve: starting {args.replicas} replicas ...", flush=True)
    app, loop, engine, model_name = build_serve(args)
    logging.basicConfig(level=args.log_level.upper())
    what = f"minicb serve: {model_name} (visualizer at /, API at /v1)"
    if loop.fleets:  # the replicas: each its own process, stopped with the server
        first = next(iter(engine.replicas.values()))
        what_routes = "disaggregated" if args.disaggregate else f"router {args.router}"
        print(f"minicb serve: {what_routes}; each engine: "
              f"{describe_choices(first.describe()['runner'])}", flush=True)  # fmt: skip
        replicas = dict(engine.replicas)
        files = replica_trace_paths(args.trace, list(replicas)) if args.trace else {}
        close_traces = record_traces(replicas, files, "serve")
        try:
            run_server(app, args, what, loop)
        finally:
            close_traces()  # after the engine thread stopped: no event comes any more
            engine.close()
        return 0
    print(f"minicb serve: {describe_choices(engine.describe()['runner'])}", flush=True)
    with traced(engine, args, served_model_name=model_name):
        run_server(app, args, what, loop)
    return 0


# ---- replay ----------------------------------------------------------------------------
def serve_replay(traces: dict[str, Trace], args: argparse.Namespace) -> int:
    """The visualizer over recorded traces (panel name -> trace), until Ctrl-C."""
    from minicb.server.app import create_app

    app = create_app(None, mode="replay", replay=traces, guard=server_guard(args))
    run_server(app, args, "minicb replay")
    return 0
