"""``minicb serve``: the OpenAI-compatible API, with the visualizer at ``/``.

One continuous-batching engine by default, so ``/`` shows API traffic joining the batch
live; ``--replicas N --router POLICY`` puts N engines, each in its own process with its own
KV pool, behind a router that says why on the page (minicb/fleet); ``--disaggregate P:D``
runs P prefill and D decode engines with the KV cache sent between them
(minicb/fleet/disagg_fleet.py).

    minicb serve --port 8000
    curl localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 8}'
"""

from __future__ import annotations

import argparse
import functools
import logging
from typing import TYPE_CHECKING, Any

from minicb.engine_options import add_engine_options, describe_choices, engine_kwargs
from minicb.fleet.router import POLICIES
from minicb.fleet.tenancy.fair_queue import QUANTUM
from minicb.fleet.tenancy.tenant import DEFAULT_TENANT, MAX_QUEUED, Tenant, parse_tenant
from minicb.server.launch import add_server_options, build_app, run_server, server_guard
from minicb.telemetry.trace import add_trace_option, traced
from minicb.telemetry.trace_files import record_traces, replica_trace_paths

if TYPE_CHECKING:
    from fastapi import FastAPI

    from minicb.core.engine import LLMEngine
    from minicb.driver.engine_loop import EngineLoop
    from minicb.server.guard import Guard

SERVE_ENGINE = "api"  # the one engine's name in serve mode


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible API and the visualizer")
    add_server_options(p)
    p.add_argument("--served-model-name", help="the 'model' clients pass (default: its own name)")
    p.add_argument(
        "--max-waiting", type=int, default=256, help="waiting requests before a 429 (default 256)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)"
    )
    p.add_argument(
        "--max-tokenizing-chars",
        type=int,
        help="characters of text waiting for the tokenizer before a 429 (default 2 Mi: "
        "tokenizer_queue.MAX_TOKENIZING_CHARS)",
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
        "--no-restart-replicas",
        dest="restart_replicas",
        action="store_false",
        help="leave a dead replica dead (default: a fresh process takes its place)",
    )
    f.add_argument(
        "--fleet",
        choices=("local", "ray"),
        default="local",
        help="where the replicas (or --disaggregate's engines) run: processes on this machine "
        "(default), or Ray actors on a cluster (pip install 'minicb[ray]'; minicb/fleet/ray/)",
    )
    f.add_argument(
        "--ray-address",
        help="the Ray cluster to join with --fleet ray ('auto', or the head's HOST:PORT; "
        "default: a local cluster started for this server)",
    )
    f.add_argument(
        "--disaggregate",
        metavar="P:D",
        help="P prefill and D decode engines, each its own process, the KV cache sent between "
        "them over torch.distributed (minicb/fleet/disagg_fleet.py); not with --replicas",
    )
    t = p.add_argument_group("tenants and the fair queue (minicb/fleet/tenancy/)")
    t.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="NAME:KEY:PRIORITY[:TOKENS_PER_S]",
        help="a tenant: its key opens /v1 (needs --api-key), its requests wait in its own "
        "queue, in band PRIORITY (lower first), at most TOKENS_PER_S of prompt + max_tokens; "
        "repeat for each tenant; turns the fair queue on",
    )
    t.add_argument(
        "--fair-queue",
        action="store_true",
        help="hold requests in a fair queue by tenant until a replica has room (on with "
        "--tenant; with no tenants, all traffic is one tenant, 'default')",
    )
    t.add_argument(
        "--max-in-flight",
        type=int,
        help="requests sent to each replica at once; the rest wait in the fair queue "
        "(default: --max-num-seqs, the replica's slots)",
    )
    t.add_argument(
        "--tenant-quantum",
        type=int,
        default=QUANTUM,
        help=f"uncached prompt tokens a tenant's turn adds in deficit round robin "
        f"(default {QUANTUM})",
    )
    t.add_argument(
        "--tenant-max-queued",
        type=int,
        default=MAX_QUEUED,
        help=f"requests a tenant may have waiting before a 429 (default {MAX_QUEUED})",
    )
    add_engine_options(p)
    p.set_defaults(measure_utilisation=True)
    add_trace_option(p)
    p.set_defaults(func=run_serve)


def build_serve(args: argparse.Namespace) -> tuple[FastAPI, EngineLoop, LLMEngine, str]:
    """The engine, its thread and the app, with the API routes; nothing started."""
    from minicb.core.config import EngineConfig
    from minicb.core.engine import LLMEngine
    from minicb.driver.engine_loop import EngineLoop

    guard = server_guard(args)
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be at least 1, got {args.max_waiting}")
    if args.max_body_bytes < 1024:
        raise ValueError(f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}")
    api = dict(max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes)
    if args.max_tokenizing_chars is not None:  # else install_openai_routes' default
        if args.max_tokenizing_chars < 1:
            raise ValueError(
                f"--max-tokenizing-chars must be at least 1, got {args.max_tokenizing_chars}"
            )
        api["max_tokenizing_chars"] = args.max_tokenizing_chars
    guard = with_tenants(args, guard, api)
    on_ray = getattr(args, "fleet", "local") == "ray"
    if getattr(args, "ray_address", None) and not on_ray:
        raise ValueError("--ray-address needs --fleet ray")
    if getattr(args, "disaggregate", None):
        return build_disaggregated(args, guard, api)
    if getattr(args, "replicas", 1) != 1 or on_ray:
        return build_fleet(args, guard, api)
    engine = LLMEngine(args.model, EngineConfig.from_kwargs(**engine_kwargs(args)))
    name = served_name(args)
    loop = EngineLoop({SERVE_ENGINE: engine})
    return build_app(loop, "serve", SERVE_ENGINE, name, guard, **api), loop, engine, name


def with_tenants(args: argparse.Namespace, guard: Guard, api: dict[str, Any]) -> Guard:
    """The guard knowing the ``--tenant`` keys, and the fair queue put in ``api``
    (when asked for)."""
    import dataclasses

    from minicb.fleet.tenancy.fair_queue import FairQueue

    specs = getattr(args, "tenant", [])
    if not specs and not getattr(args, "fair_queue", False):
        return guard
    if args.tenant_max_queued < 1:
        raise ValueError(f"--tenant-max-queued must be at least 1, got {args.tenant_max_queued}")
    named = [parse_tenant(spec, args.tenant_max_queued) for spec in specs]
    names = [tenant.name for tenant, _ in named]
    if len(set(names)) != len(names) or DEFAULT_TENANT in names:
        raise ValueError(f"--tenant names must differ from each other and from "
                         f"{DEFAULT_TENANT!r}, got {names}")  # fmt: skip
    api["fair_queue"] = FairQueue(
        [tenant for tenant, _ in named],
        quantum=args.tenant_quantum,
        default=Tenant(DEFAULT_TENANT, max_queued=args.tenant_max_queued),
    )
    api["max_in_flight"] = args.max_in_flight
    return dataclasses.replace(
        guard,
        tenant_keys=guard.tenant_keys + tuple(key for _, key in named),
        tenant_names=tuple((key, tenant.name) for tenant, key in named),
    )


def served_name(args: argparse.Namespace) -> str:
    """The ``model`` clients pass, the same in every mode (one engine, replicas,
    disaggregated) and as the Python API's fleets call it: loader.model_name's rule."""
    from minicb.core.runner.loader import model_name

    return model_name(args.model, args.served_model_name)


def build_fleet(args: argparse.Namespace, guard: Guard, api: dict[str, Any]) -> tuple:
    """``serve --replicas N``: the replicas' processes (started, their models loaded), the
    loop that routes to them, and the app with the API aimed at the fleet."""
    from minicb.fleet.fleet import FLEET, Fleet

    if args.replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {args.replicas}")
    make: Any = Fleet
    if getattr(args, "fleet", "local") == "ray":  # each replica a Ray actor on a cluster
        from minicb.fleet.ray.ray_fleet import RayFleet

        make = functools.partial(RayFleet, ray_address=args.ray_address)
    fleet = make(
        args.model, args.replicas, args.router,
        served_model_name=args.served_model_name, restart_replicas=args.restart_replicas,
        **engine_kwargs(args),
    )  # fmt: skip
    name = fleet.model_name
    loop = fleet.engine_loop()
    return build_app(loop, "serve", FLEET, name, guard, **api), loop, fleet, name


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
    make: Any = DisaggregatedFleet
    if getattr(args, "fleet", "local") == "ray":  # each engine a Ray actor, on its role's node
        from minicb.fleet.ray.ray_disagg import RayDisaggregatedFleet

        make = functools.partial(RayDisaggregatedFleet, ray_address=args.ray_address)
    fleet = make(
        args.model, prefill, decode, served_model_name=args.served_model_name, **options
    )
    name = fleet.model_name
    loop = fleet.engine_loop()
    return build_app(loop, "serve", FLEET, name, guard, **api), loop, fleet, name


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
