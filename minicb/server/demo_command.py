"""``minicb demo``: static and continuous batching side by side, live in the browser.

Two engines on one copy of the weights (or, with ``--simulate GPU:MODEL``, on two simulated
GPUs of that profile, each with its own virtual clock: minicb/sim/demo.py), fed the same
workload by one feeder and stepped in turn by one engine thread, so both advance together;
the OpenAI routes aim at the continuous one. ``--scenario NAME`` plays a lesson instead
(minicb/server/lesson.py). The parser imports nothing heavy: the model, torch and uvicorn
load when the command runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from minicb.engine_options import add_engine_options, describe_choices, engine_kwargs
from minicb.server.demo_feeder import LENGTHS, PRESETS
from minicb.server.launch import add_server_options, build_app, run_server, server_guard
from minicb.telemetry.trace import add_trace_option
from minicb.telemetry.trace_files import record_traces, trace_paths

if TYPE_CHECKING:
    from fastapi import FastAPI

    from minicb.core.engine import LLMEngine
    from minicb.driver.engine_loop import EngineLoop
    from minicb.server.guard import Guard

# Small enough to read on the projector and to move on two CPU cores.
DEMO_DEFAULTS = dict(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=128)
# The opening: a burst of three times the slots, sent again each time both engines are done
# (docs/teaching.md, 0:00); rate is for --workload poisson.
DEMO_WORKLOAD = dict(rate=0.7, burst=24, short=(4, 12), long=(24, 48), max_outstanding=48)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
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
    w.add_argument(
        "--paused",
        action="store_true",
        help="start paused, and stay paused until resumed (step it from the page)",
    )
    w.add_argument(
        "--wait-for-page",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start when the first page opens, so that it is watched from its first "
        "iteration (a lesson: the first page with the controls); --no-wait-for-page starts "
        "at once, for a server with no page (API clients, a --trace recording) (default on)",
    )
    p.set_defaults(func=run_demo)


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
    from minicb.core.config import EngineConfig
    from minicb.core.engine import LLMEngine

    kwargs = engine_kwargs(args)
    kwargs.pop("batching")
    configs = {b: EngineConfig.from_kwargs(batching=b, **kwargs) for b in ("static", "continuous")}
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
    from minicb.driver.engine_loop import EngineLoop
    from minicb.driver.pacing import MAX_TICK_S, Pacer
    from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec

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
    for engine in engines.values():  # a pool too small for it: said now, not 24 times a round
        feeder.check_fits(engine)
    loop = EngineLoop(engines, feeder=feeder)
    loop.paused, loop.delay_s, loop.pacer = args.paused, args.delay, pacer
    app = build_app(loop, "demo", "continuous", engines["continuous"].model_name, guard)
    return loop, waiting(app, args)


def waiting(app: FastAPI, args: argparse.Namespace) -> FastAPI:
    """The app, its hub told to hold the loop until the first page, unless ``--paused``
    (paused until resumed) or ``--no-wait-for-page`` (running at once)."""
    if args.wait_for_page and not args.paused:
        app.state.hub.wait_for_page()
    return app


def build_lesson(args: argparse.Namespace, guard: Guard) -> tuple[EngineLoop, FastAPI]:
    """The demo playing ``--scenario``: its engines, feeder and narration (lesson.py)."""
    from minicb.driver.engine_loop import EngineLoop
    from minicb.scenarios import load_scenario
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
    return loop, waiting(build_app(loop, "demo", PANELS[1], model, guard, lesson=lesson), args)


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
    if app.state.hub.awaited:
        print("minicb demo: waiting for the first page to start (--no-wait-for-page: at once)")
    engines = dict(loop.engines)
    close_traces = record_traces(engines, trace_paths(args.trace), "demo") if args.trace else None
    try:
        run_server(app, args, "minicb demo", loop)
    finally:
        if close_traces is not None:
            close_traces()  # after the engine thread stopped: no event comes any more
    return 0
