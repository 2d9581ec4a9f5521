"""LLMEngine: the iteration loop. Each ``step()`` schedules, executes, samples, updates.

    plan = scheduler.schedule()          # who runs this iteration, and why
    tokens = runner.execute(plan)        # one ragged batch through the model
    scheduler.update(plan, tokens)       # append tokens, advance counters
    ... check stops, retire finished ... # finished requests leave the batch

Observers (metrics, traces, the server) subscribe with ``add_observer`` and are told of
arrivals, rejections, aborts and every step; the engine does not know what they do.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from minicb.config import EngineConfig
from minicb.models.loader import open_model
from minicb.outputs import RequestOutput, StepResult, TokenDelta
from minicb.request import Request, RequestStatus
from minicb.runner import ModelRunner
from minicb.sampling_params import SamplingParams
from minicb.scheduler import RequestRejected, make_scheduler
from minicb.stopping import check_stop, find_stop_string


class LLMEngine:
    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        share_weights_with: LLMEngine | None = None,
    ) -> None:
        """``share_weights_with``: another engine on the same model whose weights to reuse
        (static and continuous side by side on one copy of the weights)."""
        self.config = config or EngineConfig()
        if share_weights_with is not None:
            self.files = share_weights_with.files
            shared = share_weights_with.runner.model
        else:
            self.files, shared = open_model(model), None
        self.tokenizer = self.files.tokenizer
        self.eos_token_ids = self.files.stop_token_ids
        self.runner = ModelRunner(self.files, self.config, shared)
        self.max_model_len = self.runner.max_model_len
        self.scheduler = make_scheduler(
            self.config, self.runner.num_kv_blocks, self.max_model_len, self.runner.num_swap_blocks
        )
        self.observers: list[Any] = []
        self._ids = itertools.count()
        self._texts: dict[int, str] = {}  # decoded output text so far, per live request

    @property
    def model_name(self) -> str:
        return self.files.name

    def add_observer(self, observer: Any) -> None:
        """``observer`` may define request_arrived, request_rejected, request_aborted, step_done."""
        self.observers.append(observer)

    def remove_observer(self, observer: Any) -> None:
        self.observers = [o for o in self.observers if o is not observer]

    def _notify(self, event: str, *args: Any) -> None:
        for obs in self.observers:
            handler = getattr(obs, event, None)
            if handler is not None:
                handler(*args)

    # ---- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this model folder has no tokenizer; give token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        ids = list(prompt)
        vocab = self.runner.model_config.vocab_size
        bad = [
            t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
        ]
        if bad:
            raise RequestRejected(
                f"token id {bad[0]!r} is outside the vocabulary of {vocab} tokens"
            )
        return ids

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> int:
        """Queue a request and return its id.

        Raises ValueError, naming the limit, if the request can never be served.
        """
        params = params or SamplingParams()
        try:
            params.validate()
            token_ids = self.tokenize(prompt)
            req = Request(
                request_id=next(self._ids),
                prompt_token_ids=token_ids,
                params=params,
                arrival_time=time.time() if arrival_time is None else arrival_time,
                priority=priority,
                prompt=prompt if isinstance(prompt, str) else None,
            )
            self.scheduler.add(req)
        except ValueError as err:
            self._notify("request_rejected", prompt, str(err))
            raise
        self._texts[req.request_id] = ""
        self._notify("request_arrived", req)
        return req.request_id

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation in the model's chat template, ready for the reply."""
        from jinja2 import TemplateError

        if not messages:
            raise RequestRejected("messages is empty; give at least one message")
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise RequestRejected("this model has no chat template; give a plain prompt instead")
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        except TemplateError as err:  # e.g. a template that insists that roles alternate
            raise RequestRejected(f"the chat template refused these messages: {err}") from err
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions wrap the ids
            ids = ids["input_ids"]
        return list(ids)

    def abort_request(self, request_id: int) -> bool:
        """Stop a request wherever it is and free its KV blocks now. False if unknown."""
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        req.metrics.finished_time = time.time()
        self._texts.pop(request_id, None)
        self._notify("request_aborted", req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the iteration -------------------------------------------------------------------
    def step(self) -> StepResult:
        wall_start = time.time()
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        schedule_s = time.perf_counter() - t0
        result = StepResult(plan=plan, wall_start=wall_start, schedule_s=schedule_s)
        sampled, timings = self.runner.execute(plan)
        result.forward_s, result.sample_s = timings.forward_s, timings.sample_s
        now = time.time()
        for decision in plan.admitted:
            metrics = self.scheduler.requests[decision.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        for req in self.scheduler.update(plan, sampled):
            result.new_tokens.append(self._new_token(req, now))
        for req in self.scheduler.retire(plan):
            req.metrics.finished_time = now
            result.finished.append(self._output(req))
        result.wall_end = time.time()
        self._notify("step_done", result)
        return result

    def _new_token(self, req: Request, now: float) -> TokenDelta:
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        status = check_stop(req, self.eos_token_ids, self.max_model_len)
        delta = self._extend_text(req)
        cut = (
            find_stop_string(self._texts[req.request_id], req.params.stop)
            if req.params.stop
            else None
        )
        if cut is not None:
            old = len(self._texts[req.request_id]) - len(delta)
            self._texts[req.request_id] = self._texts[req.request_id][:cut]
            delta = delta[: max(0, cut - old)]
            status = RequestStatus.FINISHED_STOPPED
        if status is not None:
            self.scheduler.finish(req, status)
        return TokenDelta(
            req.request_id, req.output_token_ids[-1], delta, len(req.output_token_ids) - 1
        )

    def _extend_text(self, req: Request) -> str:
        """Decode the output so far and return what it adds to the text already shown."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # half a multi-byte character: wait for the rest
            return ""
        old = self._texts[req.request_id]
        self._texts[req.request_id] = text
        return text[len(old) :] if text.startswith(old) else text

    def _output(self, req: Request) -> RequestOutput:
        text = self._texts.pop(req.request_id, "")
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            text=text,
            token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason,
            metrics=req.metrics,
        )

    # ---- conveniences --------------------------------------------------------------------
    def run_until_done(self) -> list[RequestOutput]:
        """Step until nothing is left; returns outputs in the order they finished."""
        finished: list[RequestOutput] = []
        while self.has_unfinished():
            finished += self.step().finished
        return finished

    def stream(
        self, prompt: str | list[int], params: SamplingParams | None = None, priority: int = 0
    ) -> Iterator[TokenDelta]:
        """Add one request and yield its new tokens as they come; other requests advance too."""
        rid = self.add_request(prompt, params, priority)
        while True:
            result = self.step()
            yield from (d for d in result.new_tokens if d.request_id == rid)
            if any(o.request_id == rid for o in result.finished):
                return
