"""``minicb serve``: one continuous-batching engine behind the OpenAI-compatible API.

The same app hosts the visualizer, so ``/`` shows API traffic joining the batch live:

    minicb serve --port 8000
    curl localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 8}'
"""

from __future__ import annotations

import argparse
import logging

from minicb.config import add_engine_options, engine_kwargs
from minicb.telemetry.trace import add_trace_option, traced

ENGINE_NAME = "api"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible API and the visualizer")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients pass as 'model' (default: the model's own name)",
    )
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="waiting requests beyond which new ones get 429 (default 256)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_options(p)
    add_trace_option(p)
    p.set_defaults(func=run)


def build_app(args: argparse.Namespace):
    """The engine, its thread, its event bus and metrics, and the app; nothing started."""
    from minicb.config import EngineConfig
    from minicb.engine import LLMEngine
    from minicb.telemetry.bus import attach
    from minicb.telemetry.prometheus import PrometheusMetrics
    from minicb.server.app import create_app
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.openai_api import install_openai_routes

    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be at least 1, got {args.max_waiting}")
    if args.max_body_bytes < 1024:
        raise ValueError(f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}")
    engine = LLMEngine(args.model, EngineConfig.from_kwargs(**engine_kwargs(args)))
    model_name = args.served_model_name or engine.model_name
    loop = EngineLoop({ENGINE_NAME: engine})
    bus = attach(engine)
    prometheus = PrometheusMetrics(model_name)
    bus.subscribe(prometheus)
    app = create_app(loop, {ENGINE_NAME: bus}, mode="serve", model_name=model_name)
    install_openai_routes(
        app,
        loop,
        ENGINE_NAME,
        model_name,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key,
        prometheus=prometheus,
    )
    return app, loop, engine, model_name


def run(args: argparse.Namespace) -> int:
    import uvicorn

    app, loop, engine, model_name = build_app(args)
    logging.basicConfig(level=args.log_level.upper())
    with traced(engine, args, served_model_name=model_name):
        loop.start()
        try:
            print(
                f"minicb serve: {model_name} on http://{args.host}:{args.port} "
                f"(visualizer at /, API at /v1)",
                flush=True,
            )
            uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        finally:
            loop.stop()
    return 0
