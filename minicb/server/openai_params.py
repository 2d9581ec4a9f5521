"""From a validated request body to what the engine takes: a prompt and SamplingParams.

Each check raises APIError naming the parameter, so that every refusal tells the client
exactly which field to fix. Nothing here touches the engine or the tokenizer.
"""

from __future__ import annotations

from typing import Any

from minicb.config import SamplingParams
from minicb.server.openai_errors import APIError
from minicb.server.openai_schemas import ChatCompletionRequest, CompletionRequest

MAX_STOP_STRINGS = 4  # as OpenAI
CHAT_ROLES = ("system", "developer", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "name"}


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def completion_prompt(prompt: Any) -> str | list[int]:
    """A string or a non-empty list of token ids; a list holding exactly one of those too."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # the batch form with a single prompt
    if isinstance(prompt, str) or _is_token_ids(prompt):
        return prompt
    if isinstance(prompt, list) and prompt == []:
        raise APIError("prompt is empty; give a string or at least one token id", param="prompt")
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        raise APIError(
            f"prompt holds {len(prompt)} prompts; send one prompt per request",
            param="prompt",
        )
    raise APIError(
        "prompt must be a string or a list of integer token ids",
        param="prompt",
        code="invalid_type",
    )


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts are understood
        texts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(
                    f"{where}.{i}: content part of type {kind!r} is not supported; "
                    "only text parts are",
                    param=f"{where}.{i}",
                )
            if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                raise APIError(
                    f"{where}.{i}: a text part needs exactly a string 'text'",
                    param=f"{where}.{i}",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(
        f"{where} must be a string or a list of text parts", param=where, code="invalid_type"
    )


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """Plain {"role", "content"} dicts for the chat template; "developer" reads as "system"."""
    if not isinstance(messages, list) or not messages:
        raise APIError(
            "messages must be a non-empty list of messages", param="messages", code="invalid_value"
        )
    out = []
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(msg, dict):
            raise APIError(f"{where} must be an object with role and content", param=where)
        extra = sorted(set(msg) - MESSAGE_KEYS)
        if extra:
            raise APIError(f"{where}.{extra[0]} is not supported", param=f"{where}.{extra[0]}")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise APIError(
                f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {role!r}",
                param=f"{where}.role",
            )
        if "content" not in msg or msg["content"] is None:
            raise APIError(f"{where}.content is required", param=f"{where}.content")
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _content(msg["content"], f"{where}.content")})
    return out


def stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise APIError(
            f"stop must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them",
            param="stop",
        )
    return stops


def _refuse(param: str, why: str = "is not supported by minicb") -> None:
    raise APIError(f"{param} {why}", param=param, code="unsupported_parameter")


def check_unsupported(req: CompletionRequest | ChatCompletionRequest) -> None:
    """Refuse features minicb does not have rather than quietly ignoring them."""
    if req.n not in (None, 1):
        raise APIError(f"n must be 1, got {req.n}", param="n", code="unsupported_parameter")
    if req.logprobs not in (None, False, 0) or getattr(req, "top_logprobs", None):
        _refuse("logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            _refuse(name)
    if req.logit_bias:
        _refuse("logit_bias")
    if req.stream_options is not None and not req.stream:
        _refuse("stream_options", "is only allowed when stream is true")
    if isinstance(req, CompletionRequest):
        if req.echo:
            _refuse("echo")
        if req.best_of not in (None, 1):
            _refuse("best_of")
        if req.suffix:
            _refuse("suffix")
    else:
        if req.tools or req.tool_choice not in (None, "none"):
            _refuse("tools")
        if req.response_format and req.response_format.get("type") != "text":
            _refuse("response_format")


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest, max_tokens: int
) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0),
            seed=req.seed,
            stop=stop_strings(req.stop),
            ignore_eos=req.ignore_eos,
        )
    except ValueError as err:  # SamplingParams' own limits, already named in its message
        raise APIError(str(err), code="invalid_value") from err


def requested_max_tokens(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """max_completion_tokens (chat's newer name) wins over max_tokens when both are given."""
    newer = getattr(req, "max_completion_tokens", None)
    return newer if newer is not None else req.max_tokens
