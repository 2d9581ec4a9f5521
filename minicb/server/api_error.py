"""How a refusal reads: every error the server's HTTP routes give leaves as

    {"error": {"message", "type", "param", "code"}}

with its status (and headers such as ``Retry-After``), the shape of OpenAI's errors, so the
official clients raise their usual typed exceptions. Routes and dependencies raise
``APIError``; ``error_handler`` answers it, and answers any other exception (a bug) with a
500 ``server_error`` in the same shape.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse


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


RETRY_AFTER_S = 1  # what a busy answer asks a client to wait


def busy(why: str, code: str) -> APIError:
    """A 429: the server is busy (``why``), with ``Retry-After`` and the same in words."""
    return APIError(
        f"{why}; retry in {RETRY_AFTER_S} s",
        status=429,
        type="rate_limit_error",
        code=code,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


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
