"""LLMEngine: the iteration loop. Each ``step()`` schedules, executes, updates, publishes.

    plan = scheduler.schedule()          # who runs this iteration, and why
    out = runner.execute(plan)           # one ragged batch through the model (or a fake)
    apply_outputs(plan, out, ...)        # append tokens (accepted drafts too), detokenize,
                                         # check stops, retire the finished
    report_step(plan, out, ...)          # the step event on the one event path: metrics,
                                         # traces, browsers

The engine is given its runner and its clock (by default it builds the model runner and
reads the wall clock), so the scheduler under test, under a fake runner and in production
is the same code. Outsiders read the engine's views (``kv_snapshot``, ``queue_sizes``,
``block_table``, ``live_requests``, ``describe``: minicb/core/engine_views.py), never the
scheduler's internals.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.core import events, request_events
from minicb.core.bus import EventBus
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.detokenizer import IncrementalDetokenizer
from minicb.core.engine_controls import EngineControls
from minicb.core.engine_views import EngineViews
from minicb.core.request import Request, RequestOutput, RequestStatus, TokenDelta
from minicb.core.scheduler import RequestRejected, SchedulerBase, make_scheduler
from minicb.core.scheduler.plan import StepPlan

if TYPE_CHECKING:
    from minicb.core.runner import Runner, RunnerOutput
    from minicb.overlap.pipeline import OverlapPipeline


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


@dataclass
class Settled:
    """What a step's outputs did to its requests: the new tokens, the requests given their
    first token, and the outputs of those that finished (stamped by ``report_step``)."""

    new_tokens: list[TokenDelta]
    firsts: list[Request]
    finished: list[RequestOutput]


@dataclass
class Lanes:
    """A step's times for the host's and the device's lanes (the step event's fields)."""

    schedule_s: float
    device_start: float  # engine clock when the runner took the plan up
    execute_s: float  # the runner's execute, perf_counter seconds: forward, sample, the rest
    process_t0: float = field(default_factory=time.perf_counter)  # outputs processed from


def _check_pool_sizes(config: EngineConfig, runner: Runner) -> None:
    """A runner given from outside must have the pools the config asks for, if it asks."""
    for name in ("num_kv_blocks", "num_swap_blocks"):
        wanted, has = getattr(config, name), getattr(runner, name)
        if wanted is not None and wanted != has:
            raise ValueError(
                f"the config asks for {name}={wanted} but the runner has {has}; build the "
                f"runner with {name}={wanted} (or leave it unset in the config)"
            )


def _check_hint(expected: int | None, max_tokens: int) -> None:
    """Raise RequestRejected unless ``expected`` is None or an int in [1, max_tokens]."""
    if expected is None:
        return
    if not isinstance(expected, int) or isinstance(expected, bool) or expected < 1:
        raise RequestRejected(
            f"expected_output_tokens must be a positive integer, got {expected!r}"
        )
    if expected > max_tokens:
        raise RequestRejected(
            f"expected_output_tokens={expected} exceeds max_tokens={max_tokens}: a request "
            f"never generates more than max_tokens"
        )


class LLMEngine(EngineViews, EngineControls):
    """The step loop over a scheduler, a runner, a clock and a bus. Its views (the KV pool,
    queues, live requests, settings) are inherited from ``EngineViews`` (engine_views.py),
    its controls (abort, rebuild, chat template) from ``EngineControls``
    (engine_controls.py)."""

    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        *,
        runner: Runner | None = None,
        clock: Callable[[], float] | None = None,
        bus: EventBus | None = None,
        scheduler: Callable[..., SchedulerBase] = make_scheduler,
    ) -> None:
        """``runner``: who executes the plans (default: the model runner on ``model``);
        ``clock``: seconds for every timestamp (default: the wall clock); ``bus``: where
        events go (default: a new one; a rebuilt engine keeps its predecessor's);
        ``scheduler``: what builds the scheduler, called as ``make_scheduler`` is (a lab
        tries its own admission policy through it)."""
        self.config = config or EngineConfig()
        if runner is None:
            from minicb.core.runner.model_runner import ModelRunner  # torch only when needed

            runner = ModelRunner(model, self.config)
        _check_pool_sizes(self.config, runner)
        self.runner = runner
        self.clock = clock or time.time
        self.bus = bus or EventBus()
        self.tokenizer = runner.tokenizer
        self.eos_token_ids = runner.stop_token_ids
        self.max_model_len = runner.max_model_len
        self.scheduler = scheduler(
            self.config,
            runner.num_kv_blocks,
            self.max_model_len,
            runner.num_swap_blocks,
        )
        self._ids = itertools.count()
        self._texts: dict[int, IncrementalDetokenizer] = {}  # output text, per live request
        self.busy_s = 0.0  # seconds spent in this engine's own steps: its own clock
        # Overlap scheduling: the plan in flight, the runner's thread and the overlapped
        # step (minicb/overlap/pipeline.py), imported only where it is on.
        self.pipeline: OverlapPipeline | None = None
        if self.config.overlap_scheduling:
            from minicb.overlap.pipeline import OverlapPipeline

            self.pipeline = OverlapPipeline(runner, self.scheduler, self.clock)

    # ---- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this model folder has no tokenizer; give token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        ids = list(prompt)
        vocab = self.runner.vocab_size
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
        expected_output_tokens: int | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> int:
        """Queue a request and return its id.

        ``expected_output_tokens``: the output length the ``pow2`` and ``oracle`` KV
        reservations plan for (default ``max_tokens``); a wrong hint costs memory, never
        tokens. ``prompt_token_ids``: ``tokenize(prompt)``, when the caller has it already
        (the server tokenizes off the engine thread: a long prompt's cost stays there).
        Raises ValueError, naming the limit, if the request can never be served.
        """
        params = params or SamplingParams()
        try:
            params.validate()
            _check_hint(expected_output_tokens, params.max_tokens)
            token_ids = self.tokenize(prompt) if prompt_token_ids is None else prompt_token_ids
            req = Request(
                request_id=next(self._ids),
                prompt_token_ids=token_ids,
                params=params,
                arrival_time=self.clock() if arrival_time is None else arrival_time,
                priority=priority,
                prompt=prompt if isinstance(prompt, str) else None,
                expected_output_tokens=expected_output_tokens,
            )
            req.metrics.arrival_busy_s = self.busy_s
            self.scheduler.add(req)
        except ValueError as err:
            if self.bus.wants("rejected"):
                self.bus.emit(request_events.rejected(prompt, str(err), self.clock()))
            raise
        self._texts[req.request_id] = IncrementalDetokenizer(self.tokenizer, list(params.stop))
        if self.bus.wants("arrived"):
            self.bus.emit(request_events.arrived(req))
        return req.request_id

    def has_unfinished(self) -> bool:
        """Requests left, or (overlap) a plan in flight that still has to be reported."""
        in_flight = self.pipeline is not None and self.pipeline.in_flight is not None
        return self.scheduler.has_unfinished() or in_flight

    # ---- the iteration -------------------------------------------------------------------
    def step(self) -> StepResult:
        """One iteration: schedule, execute, update, publish.

        If the runner raises, the step is undone before the error goes on: every request
        it touched (ran a row, swapped in or out) waits again with its blocks freed and its
        tokens kept, as after a preemption by recompute, since the runner may have written
        part of their KV or none of their copies. Stepping again (after catching the error
        from here or from ``LLM.generate``) is then safe: no row ever reads a block that a
        failed step was meant to fill.

        With ``overlap_scheduling`` the next iteration is planned while this one computes:
        ``OverlapPipeline.step`` (minicb/overlap/pipeline.py) does it, with the same two halves
        (``apply_outputs``, ``report_step``)."""
        if self.pipeline is not None:
            return self.pipeline.step(self)
        start = self.clock()
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        schedule_s = time.perf_counter() - t0
        device_start = self.clock()
        try:
            out = self.runner.execute(plan)
        except BaseException:  # an interrupt in a notebook too: the retry must be safe
            self.scheduler.undo(plan)
            raise
        lanes = Lanes(schedule_s, device_start, time.perf_counter() - t0 - schedule_s)
        settled = self.apply_outputs(plan, out, start, self.scheduler.update)
        return self.report_step(plan, out, start, lanes, settled)

    def apply_outputs(
        self, plan: StepPlan, out: RunnerOutput, start: float, apply: Callable[..., Any]
    ) -> Settled:
        """A step's first half once the runner has answered: first admissions are stamped
        with the step's ``start`` (as their admitted events), the sampled tokens appended
        with ``apply`` (``Scheduler.update``, or the overlap's settling), each one
        detokenized and checked for a stop in turn, then the finished requests retired."""
        for decision in plan.admitted:
            req = self.scheduler.requests.get(decision.request_id)
            if req is not None and req.metrics.first_scheduled_time is None:  # None: aborted
                req.metrics.first_scheduled_time = start  # while its step ran (overlap)
                req.metrics.num_cached_tokens = decision.num_cached_tokens
        new_tokens: list[TokenDelta] = []
        firsts: list[Request] = []

        def on_token(req: Request) -> bool:  # each accepted token in turn: stop right there?
            delta = self._new_token(req)
            if delta.index == 0:  # a first token, by the rule of its first_token event
                firsts.append(req)
            new_tokens.append(delta)
            return req.finished

        apply(plan, out.sampled, on_token)
        finished = [self._output(req) for req in self.scheduler.retire(plan)]
        return Settled(new_tokens, firsts, finished)

    def report_step(
        self,
        plan: StepPlan,
        out: RunnerOutput,
        start: float,
        lanes: Lanes,
        settled: Settled,
        counted_from: float | None = None,
    ) -> StepResult:
        """The second half: the step's event, at its end, published. The end is when the
        first tokens were given and the finished requests ended, the times their events
        carry (an output, a stream and a reader of the events agree on a request's TTFT
        and latency). ``busy_s``, the engine's own clock, grows by the seconds since
        ``counted_from`` (default ``start``; with overlap, each ``step()`` call counts its
        own seconds once)."""
        end = self.clock()
        self.busy_s += end - (start if counted_from is None else counted_from)
        for req in settled.firsts:
            req.metrics.first_token_time, req.metrics.first_token_busy_s = end, self.busy_s
        for output in settled.finished:
            output.metrics.finished_time = end
        prepare_s = max(0.0, lanes.execute_s - out.forward_s - out.sample_s)
        schedule_s, device_start = lanes.schedule_s, lanes.device_start
        process_s = time.perf_counter() - lanes.process_t0
        if out.host_lanes is not None:  # a simulated host's, on the virtual clock
            schedule_s, wait_s, process_s = out.host_lanes
            device_start, prepare_s = device_start + wait_s, 0.0
        event = events.StepEvent(
            plan,
            start,
            end,
            schedule_s,
            out.forward_s,
            out.sample_s,
            tensor_parallel_size=self.config.tensor_parallel_size,
            collective_s=out.collective_s,
            bandwidth_util=out.bandwidth_util,
            flop_util=out.flop_util,
            busy_s=self.busy_s,
            device_start=device_start,
            prepare_s=prepare_s,
            process_s=process_s,
        )
        # The step's events on the bus at once, one call per listener; when nobody
        # listens, nothing is built.
        if self.bus.listening:
            batch: list[events.Event] = [event] if self.bus.wants("step") else []
            batch += request_events.step_request_events(
                event, settled.new_tokens, settled.finished, self.bus.wants
            )
            if batch:
                self.bus.emit_many(batch)
        return StepResult(event, settled.new_tokens, settled.finished)

    def _new_token(self, req: Request) -> TokenDelta:
        """The text one new token adds, and whether it ends its request (a stop token, a
        length limit or a stop string)."""
        status = req.check_stop(self.eos_token_ids, self.max_model_len)
        detok = self._texts[req.request_id]
        text = detok.add(req.output_token_ids, final=status is not None)
        if detok.stopped:  # the text ends where the stop string begins, as OpenAI's does
            status = RequestStatus.FINISHED_STOPPED
        if status is not None:
            self.scheduler.finish(req, status)
        index = len(req.output_token_ids) - 1
        return TokenDelta(req.request_id, req.output_token_ids[-1], text, index)

    def _output(self, req: Request) -> RequestOutput:
        detok = self._texts.pop(req.request_id, None)
        text = detok.text if detok is not None else ""
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
