"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/models, plus
/health and /metrics, added to an app that may also host the visualizer.

    install_openai_routes(app, engine_loop, "api", "SmolLM2-135M-Instruct", guard=Guard("KEY"))

A request goes: body, schema and parameter checks (openai_request) -> (chat) template
applied in the engine thread -> the waiting-queue gate -> ``EngineLoop.submit`` -> its
token stream, returned whole or as server-sent events. Handlers only await; model work
and tokenizer calls run in the engine thread, so a slow step never stalls other clients'
chunks. The engine is looked up by name on every request because the demo may rebuild it
with new settings.

A stream's chunks add up to the final text, a stop string cut off, because the engine's
token deltas do (it holds back a tail that could still begin a stop string). When the
client goes away, Starlette closes the SSE generator before its end, and its ``finally``
hands the abort to a plain function (awaiting inside a cancelled task is not possible),
so the engine frees the request's KV blocks at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minicb.config import SamplingParams
from minicb.request import RequestOutput, TokenDelta
from minicb.server import openai_request as rq
from minicb.server.engine_loop import EngineLoop, RequestStream
from minicb.telemetry.prometheus import PrometheusMetrics

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
METRICS_READ_TIMEOUT_S = 2.0
DONE = b"data: [DONE]\n\n"


# ---- the answers -----------------------------------------------------------------------
@dataclass
class Reply:
    """One request's answer, whole or in chunks, with one id, creation time and model:

    completion:  {"object": "text_completion", "choices": [{"text", "finish_reason"}]}
    chat:        {"object": "chat.completion", "choices": [{"message": {role, content}}]}
    chat chunk:  {"object": "chat.completion.chunk", "choices": [{"delta": {...}}]}

    ``return_token_ids`` (as vLLM has it) adds the generated ids to each choice.
    """

    chat: bool
    model: str
    include_usage: bool = False  # streaming: a last chunk with the usage
    return_token_ids: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def _body(
        self, choices: list[dict], chunk: bool, out: RequestOutput | None = None
    ) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        body["choices"] = choices
        if out is not None:
            prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
            body["usage"] = dict(
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
                prompt_tokens_details={"cached_tokens": out.metrics.num_cached_tokens},
            )
        elif chunk and self.include_usage:
            body["usage"] = None  # only the last chunk carries it, as OpenAI does
        return body

    def _choice(self, key: str, value: Any, finish: str | None, ids: list[int] | None) -> dict:
        choice = {"index": 0, key: value, "logprobs": None, "finish_reason": finish}
        if self.return_token_ids:
            choice["token_ids"] = list(ids or [])
        return choice

    def full(self, out: RequestOutput) -> dict[str, Any]:
        key, value = "text", out.text
        if self.chat:
            key, value = "message", {"role": "assistant", "content": out.text}
        return self._body([self._choice(key, value, out.finish_reason, out.token_ids)], False, out)

    def chunk(
        self, text: str | None, ids: list[int] | None = None, finish: str | None = None
    ) -> dict[str, Any]:
        """A stream's chunk; ``text`` None: a chat stream's first, with the role only."""
        if not self.chat:
            choice = self._choice("text", text, finish, ids)
        elif text is None:
            choice = self._choice("delta", {"role": "assistant", "content": ""}, None, ids)
        else:
            delta = {"content": text} if text or finish is None else {}
            choice = self._choice("delta", delta, finish, ids)
        return self._body([choice], chunk=True)

    def usage_chunk(self, out: RequestOutput) -> dict[str, Any]:
        return self._body([], chunk=True, out=out)


# ---- server-sent events ----------------------------------------------------------------
def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def sse_stream(
    stream: RequestStream, reply: Reply, on_abandon: Callable[[], None]
) -> AsyncIterator[bytes]:
    """A chunk per generated token, the closing chunk (and usage), then ``[DONE]``."""
    finished = False
    try:
        if reply.chat:
            yield sse(reply.chunk(None))
        async for item in stream:
            if isinstance(item, TokenDelta):
                yield sse(reply.chunk(item.text, [item.token_id]))
                continue
            finished = True
            if item.finish_reason == "error":  # the engine failed a step; tell, then end
                error = rq.APIError(item.text, 500, type="server_error", code="engine_error")
                yield sse(error.body())
                break
            yield sse(reply.chunk("", finish=item.finish_reason))
            if reply.include_usage:
                yield sse(reply.usage_chunk(item))
        yield DONE
    finally:
        if not finished:
            on_abandon()


# ---- the routes ------------------------------------------------------------------------
@dataclass(eq=False)
class OpenAIRoutes:
    """The routes of one engine of an EngineLoop, and what they share."""

    loop: EngineLoop
    engine_name: str
    model_name: str
    gate: rq.WaitingGate
    prometheus: PrometheusMetrics
    max_body_bytes: int

    @property
    def engine(self) -> Any:
        return self.loop.engines[self.engine_name]  # looked up each time: rebuilds replace it

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            served = f"this server serves {self.model_name!r} (see /v1/models)"
            raise rq.invalid("model", f"{model!r} is not served here; {served}", "model_not_found")

    # ---- generation ----------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req, params = await self._read(request, rq.CompletionRequest)
        return await self._generate(request, req, rq.completion_prompt(req.prompt), params)

    async def chat_completions(self, request: Request) -> Response:
        req, params = await self._read(request, rq.ChatCompletionRequest)
        messages = rq.chat_messages(req.messages)
        ids, room = await self.loop.acall(lambda: self._chat_prompt(messages))
        if rq.requested_max_tokens(req) is None:
            params.max_tokens = room
        return await self._generate(request, req, ids, params)

    async def _read(self, request: Request, schema: type[rq.M]) -> tuple[rq.M, SamplingParams]:
        """The request checked as far as it can be without the tokenizer, and its settings
        (chat's default max_tokens waits for the prompt's length)."""
        req = await rq.read_request(request, schema, self.max_body_bytes)
        self.check_model(req.model)
        rq.check_unsupported(req)
        default = DEFAULT_COMPLETION_MAX_TOKENS if schema is rq.CompletionRequest else 1
        max_tokens, context = rq.requested_max_tokens(req) or default, self.engine.max_model_len
        if max_tokens > context:
            why = f"is {max_tokens} but the model's context holds {context} tokens"
            raise rq.invalid("max_tokens", why)
        return req, rq.sampling_params(req, max_tokens)

    def _chat_prompt(self, messages: list[dict[str, str]]) -> tuple[list[int], int]:
        """The template applied (engine thread), and OpenAI's chat default for max_tokens:
        as much as the context and the KV pool leave after the prompt."""
        engine = self.engine
        try:
            ids = engine.apply_chat_template(messages)
        except ValueError as err:
            raise rq.APIError(str(err), param="messages") from err
        kv = engine.kv_snapshot()
        return ids, max(1, min(engine.max_model_len, kv.num_blocks * kv.block_size) - len(ids))

    async def _generate(
        self, request: Request, req: rq.Common, prompt: str | list[int], params: SamplingParams
    ) -> Response:
        chat = isinstance(req, rq.ChatCompletionRequest)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        reply = Reply(chat, self.model_name, usage, req.return_token_ids)
        with self.gate.admit() as queued:
            try:
                stream = await self.loop.submit(
                    self.engine_name, prompt, params, req.priority, on_queued=queued
                )
            except ValueError as err:  # the engine's refusal already names the limit
                why = str(err)
                about_length = "max_tokens" in why and "prompt of" not in why
                param = "max_tokens" if about_length else "messages" if chat else "prompt"
                raise rq.APIError(why, param=param) from err
        headers = {"X-Request-Id": reply.id, "X-Minicb-Request-Id": str(stream.request_id)}
        if req.stream:
            body = sse_stream(stream, reply, lambda: self.abort_soon(stream.request_id))
            headers.update(SSE_HEADERS)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        out = await self._final(request, stream)
        if out.finish_reason == "error":
            raise rq.APIError(out.text, 500, type="server_error", code="engine_error")
        return JSONResponse(reply.full(out), headers=headers)

    async def _final(self, request: Request, stream: RequestStream) -> RequestOutput:
        """The final output; a client that hangs up meanwhile gets its request aborted
        (which ends the stream with finish reason "abort")."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            await self.loop.abort(self.engine_name, stream.request_id)

        watcher = asyncio.ensure_future(watch())
        try:
            async for item in stream:
                if isinstance(item, RequestOutput):
                    return item
            raise AssertionError("a request stream ended without its output")
        finally:
            watcher.cancel()

    def abort_soon(self, request_id: int) -> None:
        """Abort from a plain function (a closing generator cannot await): queue it."""
        self.loop.call(lambda: self.engine.abort_request(request_id))

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

    async def health(self) -> JSONResponse:
        if not self.loop.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics(self) -> Response:
        # KV usage is otherwise set by steps only, so an idle engine would keep showing its
        # last busy figure after aborts; read the pool now, in the engine thread.
        read = self.loop.acall(lambda: self.engine.kv_snapshot())
        try:
            kv = await asyncio.wait_for(read, METRICS_READ_TIMEOUT_S)
            self.prometheus.kv_usage.set(kv.num_used / kv.num_blocks if kv.num_blocks else 0.0)
        except TimeoutError:
            pass  # a stuck engine thread must not stall the scrape; serve what is known
        return Response(self.prometheus.exposition(), media_type=self.prometheus.content_type)

    async def unknown(self, request: Request, path: str) -> JSONResponse:
        raise rq.APIError(
            f"no route {request.method} /v1/{path}; see /v1/models, /v1/completions, "
            "/v1/chat/completions",
            status=404,
            code="unknown_url",
        )


def install_openai_routes(
    app: FastAPI,
    engine_loop: EngineLoop,
    engine_name: str,
    model_name: str,
    *,
    max_waiting: int = 256,
    max_body_bytes: int = 1 << 20,
    guard: rq.Guard | None = None,
) -> OpenAIRoutes:
    """Add the OpenAI routes, /health and /metrics for one engine of ``engine_loop``.

    ``guard`` (no key: open) holds /v1/* for the controller's key, and /metrics too unless
    it is public (scrapers often cannot send a key); /health stays open. The Prometheus
    metrics and the waiting-queue gate listen to the engine's bus, which a rebuilt engine
    keeps, so they go on counting across a demo's rebuilds.
    """
    prometheus = PrometheusMetrics(model_name)
    engine_loop.engines[engine_name].bus.subscribe(prometheus)
    gate = rq.WaitingGate(engine_loop.engines, engine_name, max_waiting)
    routes = OpenAIRoutes(engine_loop, engine_name, model_name, gate, prometheus, max_body_bytes)
    app.state.openai = routes
    for error in (rq.APIError, Exception):
        app.add_exception_handler(error, rq.error_handler)
    guard = guard or rq.Guard()
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(guard.http_check(rq.CONTROLLER))])
    v1.add_api_route("/completions", routes.completions, methods=["POST"])
    v1.add_api_route("/chat/completions", routes.chat_completions, methods=["POST"])
    v1.add_api_route("/models", routes.models, methods=["GET"])
    v1.add_api_route("/models/{model:path}", routes.model, methods=["GET"])
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    v1.add_api_route("/{path:path}", routes.unknown, methods=any_method, include_in_schema=False)
    app.include_router(v1)
    app.add_api_route("/health", routes.health, methods=["GET"])
    scrape = [Depends(guard.http_check(rq.CONTROLLER, rq.VIEWER))]
    scrape = [] if guard.metrics_public else scrape
    app.add_api_route("/metrics", routes.metrics, methods=["GET"], dependencies=scrape)
    return routes
