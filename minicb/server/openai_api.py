"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/models, plus
/health and /metrics, added to an app that may also host the visualizer.

    install_openai_routes(app, engine_loop, "api", "SmolLM2-135M-Instruct", api_key="...")

A request goes: body read under a size bound -> strict schema -> checks that name the
field -> (chat) template applied in the engine thread -> the waiting-queue gate ->
``EngineLoop.submit`` -> its token stream, returned whole or as server-sent events.
Handlers only await; model work and tokenizer calls run in the engine thread, so a slow
step never stalls other clients' chunks. The engine is looked up by name on every
request because the demo may rebuild it with new settings.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minicb.request import RequestOutput
from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.config import SamplingParams
from minicb.server.admission import WaitingGate, bearer_check
from minicb.server.engine_loop import EngineLoop, RequestStream
from minicb.server.openai_body import read_request
from minicb.server.openai_errors import APIError, api_error_handler, error_body
from minicb.server.openai_info import InfoRoutes
from minicb.server.openai_params import (
    chat_messages,
    check_unsupported,
    completion_prompt,
    requested_max_tokens,
    sampling_params,
)
from minicb.server.openai_responses import Reply
from minicb.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from minicb.server.openai_stream import sse_stream

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _guarded(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """A bug behind a route still answers in the OpenAI shape (500, server_error), logged."""

    @functools.wraps(handler)
    async def run(*args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(*args, **kwargs)
        except APIError:
            raise
        except Exception as err:
            log.exception("unexpected error in %s", handler.__name__)
            body = error_body(f"internal error: {type(err).__name__}", "server_error")
            return JSONResponse(body, status_code=500)

    return run


def chat_prompt_ids(engine: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat template applied by the engine; runs in the engine thread."""
    try:
        return engine.apply_chat_template(messages)
    except ValueError as err:
        raise APIError(str(err), param="messages") from err


class OpenAIRoutes:
    """The two generation routes and what they share (the gate, background aborts)."""

    def __init__(
        self,
        loop: EngineLoop,
        engine_name: str,
        model_name: str,
        gate: WaitingGate,
        max_body_bytes: int,
    ) -> None:
        self.loop, self.engine_name, self.model_name = loop, engine_name, model_name
        self.gate, self.max_body_bytes = gate, max_body_bytes
        self._tasks: set[asyncio.Task] = set()  # aborts in flight, kept from the GC

    @property
    def engine(self) -> Any:
        return self.loop.engines[self.engine_name]

    # ---- checks --------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(
                f"model {model!r} is not served here; this server serves {self.model_name!r} "
                "(see /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_max_tokens(self, max_tokens: int) -> None:
        limit = self.engine.max_model_len
        if max_tokens > limit:
            raise APIError(
                f"max_tokens is {max_tokens} but the model's context holds {limit} tokens",
                param="max_tokens",
                code="invalid_value",
            )

    # ---- the two generation routes -------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req = await read_request(request, CompletionRequest, self.max_body_bytes)
        self.check_model(req.model)
        check_unsupported(req)
        prompt = completion_prompt(req.prompt)
        max_tokens = requested_max_tokens(req) or DEFAULT_COMPLETION_MAX_TOKENS
        self.check_max_tokens(max_tokens)
        params = sampling_params(req, max_tokens)
        return await self._generate(request, req, prompt, params, Reply(False, self.model_name))

    async def chat_completions(self, request: Request) -> Response:
        req = await read_request(request, ChatCompletionRequest, self.max_body_bytes)
        self.check_model(req.model)
        check_unsupported(req)
        messages = chat_messages(req.messages)
        max_tokens = requested_max_tokens(req)
        if max_tokens is not None:
            self.check_max_tokens(max_tokens)
        sampling_params(req, max_tokens or 1)  # refuse bad settings before any tokenizing
        ids = await self.loop.acall(
            lambda: chat_prompt_ids(self.loop.engines[self.engine_name], messages)
        )
        if max_tokens is None:  # OpenAI's chat default: as much as the context allows
            engine = self.engine
            pool = engine.scheduler.blocks.num_blocks * engine.config.block_size
            max_tokens = max(1, min(engine.max_model_len, pool) - len(ids))
        params = sampling_params(req, max_tokens)
        return await self._generate(request, req, ids, params, Reply(True, self.model_name))

    async def _generate(
        self,
        request: Request,
        req: CompletionRequest | ChatCompletionRequest,
        prompt: str | list[int],
        params: SamplingParams,
        reply: Reply,
    ) -> Response:
        reply.return_token_ids = req.return_token_ids
        reply.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        with self.gate.admit(params):
            try:
                stream = await self.loop.submit(self.engine_name, prompt, params, req.priority)
            except ValueError as err:  # the engine's refusal already names the limit
                raise APIError(str(err), param=_param_of(str(err), reply.chat)) from err
        headers = {"X-Request-Id": reply.id, "X-Minicb-Request-Id": str(stream.request_id)}
        if req.stream:
            rid = stream.request_id
            body = sse_stream(stream, reply, params.stop, lambda: self.abort_soon(rid))
            return StreamingResponse(
                body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )
        out = await self._final(request, stream)
        if out.finish_reason == "error":
            raise APIError(out.text, 500, type="server_error", code="engine_error")
        return JSONResponse(reply.full(out), headers=headers)

    async def _final(self, request: Request, stream: RequestStream) -> RequestOutput:
        """The final output; a client that hangs up meanwhile gets its request aborted."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            await self.loop.abort(self.engine_name, stream.request_id)
            stream.queue.put_nowait(
                RequestOutput.ended(stream.request_id, "abort")
            )  # wake the waiter below

        watcher = asyncio.ensure_future(watch())
        try:
            async for item in stream:
                if isinstance(item, RequestOutput):
                    return item
            raise AssertionError("a request stream ended without its output")
        finally:
            watcher.cancel()

    def abort_soon(self, request_id: int) -> None:
        """Abort from a plain function (a closing generator cannot await)."""
        try:
            task = asyncio.get_running_loop().create_task(
                self.loop.abort(self.engine_name, request_id)
            )
        except RuntimeError:  # no running event loop (shutting down): go straight to the thread
            self.loop.call(lambda: self.engine.abort_request(request_id))
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _param_of(message: str, chat: bool) -> str:
    """Which request field an engine refusal is about."""
    if "max_tokens" in message and "prompt of" not in message:
        return "max_tokens"
    return "messages" if chat else "prompt"


def install_openai_routes(
    app: FastAPI,
    engine_loop: EngineLoop,
    engine_name: str,
    model_name: str,
    *,
    max_waiting: int = 256,
    max_body_bytes: int = 1 << 20,
    api_key: str | None = None,
    prometheus: PrometheusMetrics | None = None,
) -> None:
    """Add the OpenAI routes, /health and /metrics for one engine of ``engine_loop``.

    ``api_key`` protects /v1/* only (the visualizer and probes stay open). Without
    ``prometheus``, one is made and subscribed to the engine's EventBus.
    """
    engine = engine_loop.engines[engine_name]
    if prometheus is None:
        from minicb.telemetry.bus import attach

        prometheus = PrometheusMetrics(model_name)
        attach(engine).subscribe(prometheus)
    gate = WaitingGate(engine, max_waiting)
    hub = getattr(app.state, "hub", None)
    if hub is not None:  # the demo may replace the engine; keep counting its queue
        hub.rebuild_hooks.append(lambda engines: gate.attach(engines[engine_name]))
    routes = OpenAIRoutes(engine_loop, engine_name, model_name, gate, max_body_bytes)
    info = InfoRoutes(engine_loop, engine_name, model_name, prometheus, routes.check_model)
    app.state.openai = routes
    app.add_exception_handler(APIError, api_error_handler)
    guarded = [Depends(bearer_check(api_key))] if api_key else []
    v1 = APIRouter(prefix="/v1", dependencies=guarded)
    v1.add_api_route("/completions", _guarded(routes.completions), methods=["POST"])
    v1.add_api_route("/chat/completions", _guarded(routes.chat_completions), methods=["POST"])
    v1.add_api_route("/models", info.models, methods=["GET"])
    v1.add_api_route("/models/{model:path}", info.model, methods=["GET"])
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    v1.add_api_route("/{path:path}", info.unknown, methods=any_method, include_in_schema=False)
    app.include_router(v1)
    app.add_api_route("/health", info.health, methods=["GET"])
    app.add_api_route("/metrics", info.metrics, methods=["GET"])
