"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/models, plus
/health and /metrics (status_routes.py), added to an app that may also host the visualizer.

    install_openai_routes(app, engine_loop, "api", "SmolLM2-135M-Instruct", guard=Guard("KEY"))

A request goes: the Guard (guard) -> body and schema (openai_request) -> parameter checks
and sampling settings (openai_params) -> the prompt tokenized (the chat template applied)
in the tokenizer's own thread, after a bound on its length and on that thread's queue
(tokenizer_queue) -> the fair queue by tenant, if the server has one (tenant_gate) -> the
waiting-queue gate (waiting_gate) -> ``EngineLoop.submit`` -> its token stream, returned
whole or as server-sent events (openai_reply). Every refusal is an APIError (api_error).
Handlers only await; model work runs in the engine thread and tokenizing in the
tokenizer's, so a slow step never stalls other clients' chunks and a long prompt never
stalls a step. The engine is looked up by name on every request because the demo may
rebuild it with new settings.

The name may be a fleet's (minicb.fleet: replicas behind a router): the fleet tokenizes,
the loop routes each request to a replica, and the request's stream names that replica,
so an abort (a client that hangs up) frees KV there; /metrics labels each replica's
figures with ``replica``, and /health names each replica's state (503 once none serves).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minicb.core.config import SamplingParams
from minicb.core.request import RequestOutput
from minicb.driver.command_queue import EngineStopped
from minicb.driver.engine_loop import EngineLoop
from minicb.driver.request_stream import RequestStream
from minicb.fleet.fleet_prometheus import FleetMetrics
from minicb.fleet.tenancy.fair_queue import FairQueue
from minicb.fleet.tenancy.tenant import DEFAULT_TENANT
from minicb.server.api_error import APIError, error_handler, invalid
from minicb.server.guard import CONTROLLER, VIEWER, Guard, check_hosts
from minicb.server.openai_params import (
    chat_messages,
    check_unsupported,
    completion_prompt,
    requested_max_tokens,
    sampling_params,
)
from minicb.server.openai_reply import SSE_HEADERS, Reply, sse_stream
from minicb.server.openai_request import (
    ChatCompletionRequest,
    Common,
    CompletionRequest,
    M,
    read_request,
)
from minicb.server.status_routes import StatusRoutes
from minicb.server.tenant_gate import TenantGate, install_tenant_route, released_after
from minicb.server.tokenizer_queue import MAX_TOKENIZING_CHARS, TokenizerQueue
from minicb.server.waiting_gate import WaitingGate
from minicb.telemetry.prometheus import PrometheusMetrics

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(eq=False)
class OpenAIRoutes:
    """The routes of one engine of an EngineLoop, and what they share."""

    loop: EngineLoop
    engine_name: str
    model_name: str
    gate: WaitingGate
    max_body_bytes: int
    # The tokenizer's thread, beside the engine's, and the bounds at its door.
    tokenizer: TokenizerQueue = field(default_factory=TokenizerQueue)
    tenants: TenantGate | None = None  # the fair queue by tenant (serve --tenant ...)

    @property
    def engine(self) -> Any:
        fleet = self.loop.fleets.get(self.engine_name)  # a fleet tokenizes as an engine does
        return fleet or self.loop.engines[self.engine_name]  # each time: rebuilds replace it

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            served = f"this server serves {self.model_name!r} (see /v1/models)"
            raise invalid("model", f"{model!r} is not served here; {served}", "model_not_found")

    # ---- generation ----------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req, params = await self._read(request, CompletionRequest)
        prompt, engine = completion_prompt(req.prompt), self.engine
        if isinstance(prompt, str):
            self.tokenizer.check_length(engine, len(prompt), "prompt")
            ids = await self.tokenizer.run(lambda: engine.tokenize(prompt), len(prompt), "prompt")
        else:  # token ids need no tokenizer, only a look at the vocabulary: not its queue
            try:
                ids = engine.tokenize(prompt)
            except ValueError as err:
                raise APIError(str(err), param="prompt") from err
        return await self._generate(request, req, prompt, params, ids)

    async def chat_completions(self, request: Request) -> Response:
        req, params = await self._read(request, ChatCompletionRequest)
        messages, engine = chat_messages(req.messages), self.engine
        chars = sum(len(m["content"]) for m in messages)
        self.tokenizer.check_length(engine, chars, "messages")
        template = lambda: engine.apply_chat_template(messages)  # noqa: E731
        ids = await self.tokenizer.run(template, chars, "messages")
        if requested_max_tokens(req) is None:
            params.max_tokens = await self.loop.acall(lambda: self._room(len(ids)))
        return await self._generate(request, req, ids, params, ids)

    async def _read(self, request: Request, schema: type[M]) -> tuple[M, SamplingParams]:
        """The request checked as far as it can be without the tokenizer, and its settings
        (chat's default max_tokens waits for the prompt's length)."""
        req = await read_request(request, schema, self.max_body_bytes)
        self.check_model(req.model)
        check_unsupported(req)
        default = DEFAULT_COMPLETION_MAX_TOKENS if schema is CompletionRequest else 1
        max_tokens, context = requested_max_tokens(req) or default, self.engine.max_model_len
        if max_tokens > context:
            why = f"is {max_tokens} but the model's context holds {context} tokens"
            raise invalid("max_tokens", why)
        return req, sampling_params(req, max_tokens, getattr(request.state, "tenant", None))

    def _room(self, num_prompt_tokens: int) -> int:
        """OpenAI's chat default for max_tokens: as much as the context and the KV pool
        leave after the prompt (engine thread)."""
        engine = self.engine
        kv = engine.kv_snapshot()
        pool = kv.num_blocks * kv.block_size
        return max(1, min(engine.max_model_len, pool) - num_prompt_tokens)

    async def _generate(
        self,
        request: Request,
        req: Common,
        prompt: str | list[int],
        params: SamplingParams,
        token_ids: list[int],
    ) -> Response:
        chat = isinstance(req, ChatCompletionRequest)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        reply = Reply(chat, self.model_name, usage, req.return_token_ids)
        release = await self._turn(request, token_ids, params.max_tokens)
        try:
            with self.gate.admit() as queued:
                try:
                    stream = await self.loop.submit(
                        self.engine_name, prompt, params, req.priority, queued, token_ids
                    )
                except ValueError as err:  # the engine's refusal already names the limit
                    why = str(err)
                    about_length = "max_tokens" in why and "prompt of" not in why
                    param = "max_tokens" if about_length else "messages" if chat else "prompt"
                    raise APIError(why, param=param) from err
        except BaseException:
            release()
            raise
        headers = {"X-Request-Id": reply.id, "X-Minicb-Request-Id": str(stream.request_id)}
        if req.stream:
            body = sse_stream(stream, reply, lambda: self.loop.abort_soon(stream))
            headers.update(SSE_HEADERS)
            body = released_after(body, release)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        try:
            out = await self._final(request, stream)
        finally:
            release()
        if out.finish_reason == "error":
            raise APIError(out.text, 500, type="server_error", code="engine_error")
        return JSONResponse(reply.full(out), headers=headers)

    async def _turn(
        self, request: Request, token_ids: list[int], max_tokens: int
    ) -> Callable[[], None]:
        """Wait in the fair queue, if the server has one, under the request's tenant
        (guard.py names it); returns what gives its place back when its reply ends."""
        if self.tenants is None:
            return lambda: None
        tenant = getattr(request.state, "tenant_name", None) or DEFAULT_TENANT
        return await self.tenants.enter(request, tenant, token_ids, max_tokens)

    async def _final(self, request: Request, stream: RequestStream) -> RequestOutput:
        """The final output; a client that hangs up meanwhile gets its request aborted
        (which ends the stream with finish reason "abort")."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            await self.loop.abort(stream)

        watcher = asyncio.ensure_future(watch())
        try:
            async for item in stream:
                if isinstance(item, RequestOutput):
                    return item
            raise AssertionError("a request stream ended without its output")
        finally:
            watcher.cancel()

    # ---- about the server ----------------------------------------------------------------
    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "minicb",
            "max_model_len": self.engine.max_model_len,
        }

    async def models(self) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, model: str) -> JSONResponse:
        self.check_model(model)
        return JSONResponse(self.model_card())

    async def unknown(self, request: Request, path: str) -> JSONResponse:
        known = "/v1/models, /v1/completions, /v1/chat/completions"
        why = f"no route {request.method} /v1/{path}; see {known}"
        raise APIError(why, status=404, code="unknown_url")


async def engine_stopped(request: Request, err: Exception) -> JSONResponse:
    """A request that reached an ended engine thread: 503 at once, never a wait."""
    return APIError(str(err), 503, type="server_error", code="engine_stopped").response()


def install_openai_routes(
    app: FastAPI,
    engine_loop: EngineLoop,
    engine_name: str,
    model_name: str,
    *,
    max_waiting: int = 256,
    max_body_bytes: int = 1 << 20,
    max_tokenizing_chars: int = MAX_TOKENIZING_CHARS,
    guard: Guard | None = None,
    fair_queue: FairQueue | None = None,
    max_in_flight: int | None = None,
) -> OpenAIRoutes:
    """Add the OpenAI routes, /health and /metrics for one engine of ``engine_loop``.

    ``guard`` (no key: open) holds /v1/* for the controller's key, and /metrics too unless
    it is public (scrapers often cannot send a key); /health stays open. The Prometheus
    metrics and the waiting-queue gate listen to the engine's bus, which a rebuilt engine
    keeps, so they go on counting across a demo's rebuilds. ``fair_queue``: requests wait
    in it by tenant until fewer than ``max_in_flight`` (default: the slots) are in flight
    per replica (tenant_gate.py).
    """
    fleet = engine_loop.fleets.get(engine_name)
    if fleet is not None:  # each replica counted on its own, shown with a replica label
        prometheus: PrometheusMetrics | FleetMetrics = FleetMetrics(model_name, fleet.replicas)
    else:
        prometheus = PrometheusMetrics(model_name)
        engine_loop.engines[engine_name].bus.subscribe(prometheus)
    # the queue bound: a fleet's waiting requests, all replicas together (Fleet.bus)
    engines = engine_loop.fleets if fleet is not None else engine_loop.engines
    gate = WaitingGate(engines, engine_name, max_waiting)
    tenants = None
    if fair_queue is not None:  # default room: each replica's slots
        room = max_in_flight or (fleet or engine_loop.engines[engine_name]).config.max_num_seqs
        tenants = TenantGate(engine_loop, engine_name, fair_queue, room)
    routes = OpenAIRoutes(
        engine_loop, engine_name, model_name, gate, max_body_bytes,
        TokenizerQueue(max_tokenizing_chars), tenants,
    )  # fmt: skip
    status = StatusRoutes(engine_loop, engine_name, model_name, prometheus, tenants)
    app.state.openai = routes
    for error in (APIError, Exception):
        app.add_exception_handler(error, error_handler)
    app.add_exception_handler(EngineStopped, engine_stopped)
    guard = guard or Guard()
    check_hosts(app, guard)  # a foreign Host (DNS rebinding) is refused before any route
    controller = [Depends(guard.http_check(CONTROLLER))]
    # /v1 takes the controller's key or a tenant's (whose requests it salts, guard.py)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(guard.api_check())])
    v1.add_api_route("/completions", routes.completions, methods=["POST"])
    v1.add_api_route("/chat/completions", routes.chat_completions, methods=["POST"])
    v1.add_api_route("/models", routes.models, methods=["GET"])
    v1.add_api_route("/models/{model:path}", routes.model, methods=["GET"])
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    v1.add_api_route("/{path:path}", routes.unknown, methods=any_method, include_in_schema=False)
    app.include_router(v1)
    app.add_api_route("/health", status.health, methods=["GET"])
    scrape = [] if guard.metrics_public else [Depends(guard.http_check(CONTROLLER, VIEWER))]
    app.add_api_route("/metrics", status.metrics, methods=["GET"], dependencies=scrape)
    install_tenant_route(app, tenants, scrape)  # the page's tenants panel
    # The API's description, for the controller only (create_app serves none of its own).
    app.add_api_route(
        "/openapi.json",
        lambda: JSONResponse(app.openapi()),
        dependencies=controller,
        include_in_schema=False,
    )
    return routes
