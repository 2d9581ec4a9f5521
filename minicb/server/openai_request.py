"""An OpenAI request as it arrives: its body read and checked, then validated against the
endpoint's schema, every refusal a 400 (413 for size) naming what is wrong.

- the body: declared JSON (415 otherwise: what keeps a foreign page's plain-text POST
  out), a size bound (413, on Content-Length and again while reading, as chunked uploads
  have none), then UTF-8, JSON, an object, no lone surrogate escape (looked for in the
  raw text: a body without a ``\\uD800``-``\\uDFFF`` escape cannot hold one, UTF-8 bytes
  cannot encode one; the parsed body is walked, to name the field, only when it does);
- the schemas: strict, so "12" is not 12, and an unknown argument (``max_token``) is
  refused by name. Fields of several shapes (prompt, messages, stop) are typed Any and
  checked by hand (openai_params): one clear message instead of one per union branch.
  Extensions, as in vLLM: ``top_k``, ``ignore_eos``, ``priority``, ``return_token_ids``,
  ``cache_salt`` (the prefix cache scoped to the callers who send the same salt).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minicb.server.api_error import APIError, invalid

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A request's cache_salt: under SamplingParams' 256, leaving room for the tenant a key
# adds in front of it (Guard.tenant, "key:" and 32 hex digits, then "/").
MAX_CACHE_SALT_CHARS = 200
M = TypeVar("M", bound=BaseModel)
# A surrogate escape in JSON text (\uD800-\uDFFF): the only way a body can hold a lone
# surrogate. It may also match a valid pair, or an escaped backslash before "uD8..":
# those only cost the exact check that follows.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
    # Prefix-cache hits only among requests with this salt (vLLM's name; docs/serving.md).
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)


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
    _check_json_type(request.headers.get("content-type", ""))
    raw = await _read_body(request, max_bytes)
    try:
        return model.model_validate(_decode_json(raw))
    except ValidationError as err:
        raise _from_validation_error(err) from err
    except RecursionError as err:
        raise APIError("request body is nested too deeply", code="invalid_json") from err


def _check_json_type(content_type: str) -> None:
    """415 unless the body is declared JSON. A page of another site can POST text/plain
    (or a form) without asking first; declaring JSON makes the browser ask (a CORS
    preflight), which this server never grants: so no foreign page can start a
    generation, even on a server with no key."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise APIError(
            f"Content-Type must be application/json, got {media or 'none'!r}",
            status=415,
            code="unsupported_media_type",
        )


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
        text = raw.decode("utf-8")
        body = json.loads(text)
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
    if SURROGATE_ESCAPE.search(text) and not _encodable(body):
        where = _lone_surrogate(body, "")
        message = f"{where} holds invalid Unicode (a lone surrogate escape)"
        raise APIError(message, param=where, code="invalid_encoding")
    return body


def _encodable(body: dict[str, Any]) -> bool:
    """Whether every string of ``body`` encodes as UTF-8 (no lone surrogate): one pass of
    the C encoder, where walking it in Python built a path string per element (0.3-0.4 s
    for a body of a MiB of small elements, on the event loop)."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Path of the first string (key or value) that cannot be encoded as UTF-8 (walked only
    for a body that holds one, to name it)."""
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
