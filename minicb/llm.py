"""LLM: the offline API. Give it prompts, get completions; the engine loop runs inside."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import minicb.features  # noqa: F401  (every feature registered at its seam)
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.request import RequestOutput

Prompt = str | list[int]


def _is_single_prompt(prompts: Any) -> bool:
    return isinstance(prompts, str) or (
        isinstance(prompts, list) and bool(prompts) and all(isinstance(t, int) for t in prompts)
    )


class LLM:
    """``LLM(model=None, **engine_options)``; model None is the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.engine = LLMEngine(model, EngineConfig.from_kwargs(**options))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in the order of the prompts."""
        if _is_single_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        priorities = list(priorities) if priorities is not None else [0] * len(prompts)
        ids = []
        try:
            for prompt, p, prio in zip(prompts, params, priorities, strict=True):
                ids.append(self.engine.add_request(prompt, p, prio))
        except ValueError:
            for rid in ids:  # nothing half-done is left behind in the engine
                self.engine.abort_request(rid)
            raise
        wanted = set(ids)
        done: dict[int, RequestOutput] = {}
        while wanted - done.keys():
            for out in self.engine.step().finished:
                if out.request_id in wanted:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        params: SamplingParams | None = None,
    ) -> RequestOutput | list[RequestOutput]:
        """One conversation gives one output; a list of conversations gives a list."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        prompts = [self.apply_chat_template(conv) for conv in conversations]
        outs = self.generate(prompts, params)
        return outs[0] if single else outs

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return self.engine.apply_chat_template(messages)
