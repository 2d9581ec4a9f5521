"""What an OpenAI request must pass before it reaches the engine, and how a refusal reads.

- errors: every refusal leaves as ``{"error": {"message", "type", "param", "code"}}``
  with its status, so the official clients raise their usual typed exceptions;
- the body: a size bound (413, on Content-Length and again while reading, as chunked
  uploads have none), then UTF-8, JSON, an object, no lone surrogate escape;
- the schemas: strict, so "12" is not 12, and an unknown argument (``max_token``) is
  refused by name. Fields of several shapes (prompt, messages, stop) are typed Any and
  checked by hand: one clear message instead of one per union branch. Extensions, as in
  vLLM: ``top_k``, ``ignore_eos``, ``priority``, ``return_token_ids``;
- the parameters: each check names the field; features minicb lacks are refused;
- the door: the Guard (keys and roles, 401; the WebSocket's Origin) and a bound on the
  engine's waiting queue (429).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minicb.config import SamplingParams
from minicb.telemetry.events import Event

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 4  # as OpenAI
CHAT_ROLES = ("system", "developer", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "name"}
RETRY_AFTER_S = 1
# Features minicb lacks, each with the values that leave it unused (either endpoint's).
UNUSED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
}
M = TypeVar("M", bound=BaseModel)


# ---- the error shape -------------------------------------------------------------------
@dataclass(eq=False)
class APIError(Exception):
    """A request the API refuses: its HTTP status and the OpenAI error fields."""

    message: str
    status: int = 400
    _: KW_ONLY
    param: str | None = None
    code: str | None = "invalid_value"
    type: str = "invalid_request_error"
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        fields = ("message", "type", "param", "code")
        return {"error": {name: getattr(self, name) for name in fields}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str, why: str, code: str = "invalid_value") -> APIError:
    """A 400 about ``param``, its message starting with the field's name."""
    return APIError(f"{param} {why}", param=param, code=code)


async def error_handler(request: Request, err: Exception) -> JSONResponse:
    """The app's answer to an exception: an APIError's own (raised by a route or a
    dependency), else a bug's, 500 server_error in the same shape (Starlette raises it
    again after the answer, so the server logs it)."""
    if not isinstance(err, APIError):
        err = APIError(f"internal error: {type(err).__name__}", 500, type="server_error", code=None)
    return err.response()


def _from_validation_error(err: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = err.errors(include_url=False)[0]
    param = ".".join(str(p) for p in first["loc"])  # ("messages", 0) -> "messages.0"
    if first["type"] == "extra_forbidden":
        message = f"unrecognized request argument: {param}"
        return APIError(message, param=param, code="unrecognized_argument")
    if first["type"] == "missing":
        return invalid(param, "is required", "missing_required_parameter")
    shown = repr(first.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return APIError(f"{param or 'body'}: {first['msg']} (got {shown})", param=param or None)


# ---- the schemas -----------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class Common(_Strict):
    """Fields both endpoints share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # -1 or 0: off
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: Any = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    user: str | None = None  # accepted and ignored, as a label for the caller
    ignore_eos: bool = False  # load generators use it to fix output lengths
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)  # for the priority policy
    return_token_ids: bool = False  # the generated ids in each choice (no-tokenizer models)


class CompletionRequest(Common):
    prompt: Any  # str, token ids, or a list holding one of those
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


class ChatCompletionRequest(Common):
    messages: Any  # checked in chat_messages
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None


# ---- the body --------------------------------------------------------------------------
async def read_request(request: Request, model: type[M], max_bytes: int) -> M:
    """The body, parsed and validated into ``model``; APIError saying what is wrong."""
    raw = await _read_body(request, max_bytes)
    try:
        return model.model_validate(_decode_json(raw))
    except ValidationError as err:
        raise _from_validation_error(err) from err
    except RecursionError as err:
        raise APIError("request body is nested too deeply", code="invalid_json") from err


async def _read_body(request: Request, max_bytes: int) -> bytes:
    too_large = APIError(
        f"request body is larger than the limit of {max_bytes} bytes",
        status=413,
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _decode_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (a RecursionError for one nested too deeply)."""
    if not raw.strip():
        raise APIError("request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        message = f"request body is not valid UTF-8 (byte {err.start})"
        raise APIError(message, code="invalid_encoding") from err
    except json.JSONDecodeError as err:
        message = (
            f"request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        )
        raise APIError(message, code="invalid_json") from err
    except ValueError as err:  # e.g. an integer of thousands of digits
        raise APIError(f"request body is not usable JSON: {err}", code="invalid_json") from err
    if not isinstance(body, dict):
        message = f"request body must be a JSON object, got {type(body).__name__}"
        raise APIError(message, code="invalid_json")
    where = _lone_surrogate(body, "")
    if where:
        message = f"{where} holds invalid Unicode (a lone surrogate escape)"
        raise APIError(message, param=where, code="invalid_encoding")
    return body


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Path of the first string (key or value) that cannot be encoded as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if not isinstance(value, dict | list):
        return None
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        where = f"{path}.{key}" if path else str(key)
        found = _lone_surrogate(str(key), where) or _lone_surrogate(item, where)
        if found:
            return found
    return None


# ---- the parameters --------------------------------------------------------------------
def completion_prompt(prompt: Any) -> str | list[int]:
    """A string or a non-empty list of token ids; a list holding exactly one of those too."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # the batch form with a single prompt
    if prompt == []:
        raise APIError("prompt is empty; give a string or at least one token id", param="prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and all(type(t) is int for t in prompt)
    ):
        return prompt  # type() and not isinstance(): true and false are no token ids
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        message = f"prompt holds {len(prompt)} prompts; send one prompt per request"
        raise APIError(message, param="prompt")
    message = "prompt must be a string or a list of integer token ids"
    raise APIError(message, param="prompt", code="invalid_type")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "must be a string or a list of text parts", "invalid_type")
    texts = []
    for i, part in enumerate(content):  # content parts: only text parts are understood
        at = f"{where}.{i}"
        if not (isinstance(part, dict) and part.get("type") == "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            message = f"{at}: content part of type {kind!r} is not supported; only text parts are"
            raise APIError(message, param=at)
        if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
            raise APIError(f"{at}: a text part needs exactly a string 'text'", param=at)
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """Plain {"role", "content"} dicts for the chat template; "developer" reads as "system"."""
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(msg, dict):
            raise invalid(where, "must be an object with role and content")
        extra = sorted(set(msg) - MESSAGE_KEYS)
        if extra:
            raise invalid(f"{where}.{extra[0]}", "is not supported")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise invalid(f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if msg.get("content") is None:
            raise invalid(f"{where}.content", "is required")
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _content(msg["content"], f"{where}.content")})
    return out


def check_unsupported(req: Common) -> None:
    """Refuse features minicb does not have rather than quietly ignoring them."""
    unsupported = "unsupported_parameter"
    if req.n not in (None, 1):
        raise invalid("n", f"must be 1, got {req.n}", unsupported)
    for name, off in UNUSED.items():
        if getattr(req, name, None) not in off:
            raise invalid(name, "is not supported by minicb", unsupported)
    if (getattr(req, "response_format", None) or {"type": "text"}).get("type") != "text":
        raise invalid("response_format", "is not supported by minicb", unsupported)
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options", "is only allowed when stream is true", unsupported)


def _stop_strings(stop: Any) -> list[str]:
    stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if isinstance(stops, list) and len(stops) <= MAX_STOP_STRINGS:
        if all(isinstance(s, str) and s for s in stops):
            return stops
    raise invalid(
        "stop", f"must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them"
    )


def sampling_params(req: Common, max_tokens: int) -> SamplingParams:
    """The engine's settings; the schema already holds each within SamplingParams' limits."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        seed=req.seed,
        stop=_stop_strings(req.stop),
        ignore_eos=req.ignore_eos,
    )


def requested_max_tokens(req: Common) -> int | None:
    """max_completion_tokens (chat's newer name) wins over max_tokens when both are given."""
    newer = getattr(req, "max_completion_tokens", None)
    return newer if newer is not None else req.max_tokens


# ---- the door --------------------------------------------------------------------------
class WaitingGate:
    """A bound on the engine's waiting queue, answered with 429 and ``Retry-After``.

    The scheduler refuses a request that could never fit, not *too many* that each fit
    (they would queue without limit): the gate gives a load generator back-pressure.
    It listens to the engine's bus and reads ``queue_sizes()`` on every arrival, abort and
    step (the engine looked up by name, so a rebuild needs no hook). Handlers add the
    submissions still on their way to the engine thread, so a burst cannot slip past the
    bound between two reads; each ticket is struck off in the engine thread just after its
    arrival made the count grow, so no request is counted twice.
    """

    KINDS = ("arrived", "aborted", "step")

    def __init__(self, engines: dict[str, Any], name: str, max_waiting: int) -> None:
        self.engines, self.name, self.max_waiting = engines, name, max_waiting
        self.waiting = 0  # written in the engine thread, read on the event loop (one int)
        self.in_transit: set[object] = set()  # tickets of submissions not queued yet
        engines[name].bus.subscribe(self, kinds=self.KINDS)

    def __call__(self, event: Event) -> None:
        self.waiting = self.engines[self.name].queue_sizes()["waiting"]

    @contextmanager
    def admit(self) -> Iterator[Callable[[], None]]:
        """Hold a place while a submission travels to the engine thread, or 429 if the
        queue is full. Yields the function that strikes the place off: hand it to
        ``EngineLoop.submit(on_queued=...)``."""
        if self.waiting + len(self.in_transit) >= self.max_waiting:
            raise APIError(
                f"the server's queue is full ({self.max_waiting} requests waiting); "
                f"retry in {RETRY_AFTER_S} s",
                status=429,
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        ticket = object()
        self.in_transit.add(ticket)
        try:
            yield lambda: self.in_transit.discard(ticket)
        finally:
            self.in_transit.discard(ticket)  # refused by the engine, or already struck off


CONTROLLER, VIEWER = "controller", "viewer"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Guard:
    """The one door for everything that shows traffic or changes state: /v1, /ws, /metrics
    (unless ``metrics_public``), /viz/info and the replay's traces.

    With no ``api_key`` there is no door (the server then listens on loopback only, see
    launch.server_guard) and every connection is a controller. With one, a connection
    shows a key: ``api_key`` makes it a controller (the API, pause, step, settings,
    prompts), ``viewer_key`` a read-only viewer of the timeline; anything else is refused.
    ``show_text`` lets viewers (and, in serve mode, everyone) see prompts and outputs.
    """

    api_key: str | None = None
    viewer_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    metrics_public: bool = False
    show_text: bool = False

    def role(self, key: str | None) -> str | None:
        """CONTROLLER, VIEWER, or None for a key that opens nothing."""
        if self.api_key is None:
            return CONTROLLER
        given = (key or "").encode("utf-8", "replace")
        # compare_digest: the time taken does not tell how much of a guess was right
        for role, secret in ((CONTROLLER, self.api_key), (VIEWER, self.viewer_key)):
            if secret and hmac.compare_digest(given, secret.encode("utf-8")):
                return role
        return None

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """Whether a WebSocket from a page at ``origin`` may connect. Browsers send Origin
        on every WebSocket and apply no same-origin rule to them, so this check is what
        keeps a page of any other site from reading and driving the server; a client
        that is no browser sends none."""
        if origin is None:
            return True
        own = {f"http://{host}", f"https://{host}"} if host else set()
        return origin.rstrip("/") in own | {o.rstrip("/") for o in self.allowed_origins}

    @staticmethod
    def key_of(request: Request) -> str | None:
        """The key an HTTP request shows: ``Authorization: Bearer`` or, for a browser's
        address bar, ``?key=``."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else request.query_params.get("key")

    def http_check(self, *roles: str) -> Callable[[Request], Awaitable[None]]:
        """A route dependency: 401 unless the request's key has one of ``roles``."""

        async def check(request: Request) -> None:
            if self.role(self.key_of(request)) not in roles:
                raise APIError(
                    "missing or incorrect API key; send the header Authorization: Bearer <key>",
                    status=401,
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )

        return check
