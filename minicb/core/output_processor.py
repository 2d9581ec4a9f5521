"""What a step's sampled tokens become for the callers: text, stops, and finished outputs.

The scheduler appends each accepted token to its request and hands it to an ``on_token``
callback; the ``OutputProcessor`` turns it into a ``TokenDelta`` (the text it adds, by the
request's incremental detokenizer), decides whether it ends the request (a stop token, the
length limit, a stop string in the text) and, once the scheduler has retired the finished
requests, builds their ``RequestOutput``s. ``StepOutputs`` gathers one step's share and
stamps the request times the step's event carries (admitted at its start, first token and
finished at its end) on each request's record (``RequestMetrics``, by the record's own
rules), so that an output and the collector that folds the events
(minicb/telemetry/request_times.py) hold the same record. Every step loop (the plain one
in engine.py, a step strategy) settles its steps through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.core.detokenizer import IncrementalDetokenizer
from minicb.core.request import Request, RequestOutput, RequestStatus, TokenDelta

if TYPE_CHECKING:
    from minicb.core import events
    from minicb.core.scheduler.plan import StepPlan


@dataclass
class StepResult:
    """Everything one ``LLMEngine.step()`` did: its step event (the plan and timings), the
    new tokens, and the requests that finished."""

    event: events.StepEvent
    new_tokens: list[TokenDelta] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)

    @property
    def plan(self) -> StepPlan:
        return self.event.plan


class OutputProcessor:
    """Each live request's detokenizer, the stop rules, and the outputs of the finished.

    ``finish`` marks a request stopped (``Scheduler.finish``); ``lookup`` finds a live
    request by id (None once it has left: aborted while its step ran)."""

    def __init__(
        self,
        tokenizer: Any | None,
        stop_token_ids: list[int],
        max_model_len: int,
        finish: Callable[[Request, RequestStatus], None],
        lookup: Callable[[int], Request | None],
    ) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.max_model_len = max_model_len
        self.finish = finish
        self.lookup = lookup
        self._texts: dict[int, IncrementalDetokenizer] = {}  # output text, per live request

    def add(self, req: Request) -> None:
        """A request is queued: its output text starts empty."""
        self._texts[req.request_id] = IncrementalDetokenizer(self.tokenizer, list(req.params.stop))

    def drop(self, request_id: int) -> None:
        """A request left without an output (aborted)."""
        self._texts.pop(request_id, None)

    def settling(self, plan: StepPlan, start: float) -> StepOutputs:
        """``plan`` has run: the requests it admitted are stamped as scheduled at the step's
        ``start`` (as their admitted events are), and its tokens are gathered from here."""
        for decision in plan.admitted:
            req = self.lookup(decision.request_id)
            if req is not None:  # None: aborted while its step ran (overlap)
                req.metrics.scheduled(start, decision.num_cached_tokens)
        return StepOutputs(self)

    def new_token(self, req: Request) -> TokenDelta:
        """The text one new token adds, and whether it ends its request (a stop token, a
        length limit or a stop string)."""
        status = req.check_stop(self.stop_token_ids, self.max_model_len)
        detok = self._texts[req.request_id]
        text = detok.add(req.output_token_ids, final=status is not None)
        if detok.stopped:  # the text ends where the stop string begins, as OpenAI's does
            status = RequestStatus.FINISHED_STOPPED
        if status is not None:
            self.finish(req, status)
        index = len(req.output_token_ids) - 1
        return TokenDelta(req.request_id, req.output_token_ids[-1], text, index)

    def output(self, req: Request) -> RequestOutput:
        """A finished request, as its caller gets it."""
        detok = self._texts.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            text=detok.text if detok is not None else "",
            token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason,
            metrics=req.metrics,
        )


class StepOutputs:
    """One step's share: its new tokens in the order they were accepted, the requests they
    gave a first token, and the outputs of the requests it retired."""

    def __init__(self, processor: OutputProcessor) -> None:
        self.processor = processor
        self.new_tokens: list[TokenDelta] = []
        self.firsts: list[Request] = []
        self.finished: list[RequestOutput] = []

    def on_token(self, req: Request) -> bool:
        """Each accepted token in turn (the scheduler's callback): stop right there?"""
        delta = self.processor.new_token(req)
        if delta.index == 0:  # a first token, by the rule of its first_token event
            self.firsts.append(req)
        self.new_tokens.append(delta)
        return req.finished

    def retire(self, retired: list[Request]) -> None:
        """The requests the scheduler let go this step become outputs."""
        self.finished = [self.processor.output(req) for req in retired]

    def result(self, event: events.StepEvent) -> StepResult:
        """The step is over at ``event.wall_end``: the times its events carry are stamped
        on the requests (first token, on the engine's own clock too, and finished)."""
        for req in self.firsts:
            req.metrics.first_token(event.wall_end, event.busy_s)
        for output in self.finished:
            output.metrics.ended(event.wall_end)
        return StepResult(event, self.new_tokens, self.finished)
