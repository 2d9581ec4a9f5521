"""Reading a request body safely: a size bound, UTF-8, JSON, then the pydantic model.

Each way a body can be wrong gets its own message: too large (413, checked on the
Content-Length header and again while reading, since chunked uploads have none), not
UTF-8, not JSON (with line and column), not an object, nested too deep, a string holding
a lone surrogate (valid JSON escapes that no tokenizer can encode), or a field pydantic
refuses.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from minicb.server.openai_errors import APIError, from_validation_error

M = TypeVar("M", bound=BaseModel)


def _too_large(max_bytes: int) -> APIError:
    return APIError(
        f"request body is larger than the limit of {max_bytes} bytes",
        status=413,
        code="request_too_large",
    )


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Path of the first string (key or value) that cannot be encoded as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found = _lone_surrogate(key, where) or _lone_surrogate(item, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}.{i}")
            if found:
                return found
    return None


def decode_json(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise APIError(
            f"request body is not valid UTF-8 (byte {err.start})", code="invalid_encoding"
        ) from err
    if not text.strip():
        raise APIError("request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise APIError(
            f"request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
            code="invalid_json",
        ) from err
    except RecursionError as err:
        raise APIError("request body JSON is nested too deeply", code="invalid_json") from err
    except ValueError as err:  # e.g. an integer of thousands of digits
        raise APIError(f"request body is not usable JSON: {err}", code="invalid_json") from err
    if not isinstance(body, dict):
        raise APIError(
            f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json"
        )
    try:
        bad = _lone_surrogate(body, "")
    except RecursionError as err:
        raise APIError("request body is nested too deeply", code="invalid_json") from err
    if bad:
        raise APIError(
            f"{bad} holds invalid Unicode (a lone surrogate escape)",
            param=bad,
            code="invalid_encoding",
        )
    return body


def parse(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise from_validation_error(err) from err
    except RecursionError as err:
        raise APIError("request body is nested too deeply", code="invalid_json") from err


async def read_request(request: Request, model: type[M], max_bytes: int) -> M:
    return parse(model, decode_json(await read_body(request, max_bytes)))
