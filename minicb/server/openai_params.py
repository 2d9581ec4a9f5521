"""What the engine gets from a validated OpenAI request, each check naming the field:

- the prompt: a completion's string or token ids (one prompt per request), a chat's
  messages as plain ``{"role", "content"}`` dicts for the chat template (text parts only;
  "developer" reads as "system");
- the features minicb lacks (logprobs, penalties, tools, n > 1, ...): refused by name
  rather than quietly ignored, unless given the value that leaves them unused;
- the sampling settings: ``SamplingParams`` from temperature, top_p, top_k, seed, stop
  (up to 4 strings, as OpenAI, of up to 256 characters each) and ignore_eos; chat's
  ``max_completion_tokens`` wins over ``max_tokens``; the cache salt from the request's
  ``cache_salt`` behind the tenant its key names, if any (Guard.tenant), so a tenant's
  requests never share cached blocks with another tenant's whatever salt they send.
"""

from __future__ import annotations

from typing import Any

from minicb.core.config import SamplingParams
from minicb.server.api_error import APIError, invalid
from minicb.server.openai_request import Common

MAX_STOP_STRINGS = 4  # as OpenAI
# Characters per stop string: a stop is a few words ("\n\nUser:"), and a request's cost
# per token must not grow with what it sends (the text held back for a stop is this long).
MAX_STOP_CHARS = 256
CHAT_ROLES = ("system", "developer", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "name"}
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
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP_STRINGS) or not all(
        isinstance(s, str) and s for s in stops
    ):
        raise invalid(
            "stop", f"must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them"
        )
    longest = max(stops, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        why = f"holds a string of {len(longest)} characters; the limit is {MAX_STOP_CHARS}"
        raise invalid("stop", why)
    return stops


def cache_salt(req: Common, tenant: str | None) -> str | None:
    """The engine's salt: the request's, scoped to its key's ``tenant`` when it has one."""
    if tenant is None:
        return req.cache_salt
    return tenant if req.cache_salt is None else f"{tenant}/{req.cache_salt}"


def sampling_params(req: Common, max_tokens: int, tenant: str | None = None) -> SamplingParams:
    """The engine's settings; the schema already holds each within SamplingParams' limits."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        seed=req.seed,
        stop=_stop_strings(req.stop),
        ignore_eos=req.ignore_eos,
        cache_salt=cache_salt(req, tenant),
    )


def requested_max_tokens(req: Common) -> int | None:
    """max_completion_tokens (chat's newer name) wins over max_tokens when both are given."""
    newer = getattr(req, "max_completion_tokens", None)
    return newer if newer is not None else req.max_tokens
