"""OpenAI-style errors: one exception type and the JSON body every client expects.

Every refusal of the API routes, whatever raised it, leaves as

    {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": ...}}

with a 4xx status, so the official clients raise their usual typed exceptions
(BadRequestError, AuthenticationError, RateLimitError...) and show the message.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError


class APIError(Exception):
    """A request the API refuses; carries its HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def api_error_handler(request: Request, err: Exception) -> JSONResponse:
    """FastAPI exception handler for APIError (raised by dependencies as well as routes)."""
    assert isinstance(err, APIError)
    return err.response()


def _loc(loc: tuple[Any, ...]) -> str:
    """("messages", 0, "content") -> "messages.0.content"."""
    return ".".join(str(p) for p in loc)


def from_validation_error(err: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field.

    (The schemas avoid unions, which pydantic reports once per branch under tag names;
    fields that take several shapes are typed Any and checked by hand.)
    """
    errors = err.errors(include_url=False)
    first = errors[0]
    param = _loc(first["loc"])
    if first["type"] == "extra_forbidden":
        message = f"unrecognized request argument: {param}"
        return APIError(message, param=param, code="unrecognized_argument")
    if first["type"] == "missing":
        return APIError(f"{param} is required", param=param, code="missing_required_parameter")
    given = first.get("input")
    shown = repr(given) if len(repr(given)) <= 60 else repr(given)[:57] + "..."
    message = f"{param or 'body'}: {first['msg']} (got {shown})"
    return APIError(message, param=param or None, code="invalid_value")
