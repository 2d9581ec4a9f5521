"""The request bodies of /v1/completions and /v1/chat/completions, as pydantic models.

Strict on purpose: a wrong type is an error, not a guess ("12" is not 12, true is not 1),
and an argument nobody reads is refused by name rather than silently ignored, so a typo
like ``max_token`` is caught. Fields that take several shapes (prompt, messages, stop)
are typed Any here and checked by hand in openai_params, which gives one clear message
instead of one per union branch.

Extensions beyond OpenAI's fields, as vLLM has them: ``top_k``, ``ignore_eos`` (load
generators use it to fix output lengths), ``priority`` (for the priority policy) and
``return_token_ids`` (the generated ids in each choice; models without a tokenizer).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
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
    ignore_eos: bool = False
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    return_token_ids: bool = False


class CompletionRequest(_Common):
    prompt: Any  # str, token ids, or a list holding one of those
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


class ChatCompletionRequest(_Common):
    messages: Any  # checked in openai_params.chat_messages
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
