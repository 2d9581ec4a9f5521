"""LLMEngine: the iteration loop. Each ``step()`` schedules, executes, updates, publishes.

    plan = scheduler.schedule()          # who runs this iteration, and why
    out = runner.execute(plan)           # one ragged batch through the model (or a fake)
    _update(plan, out)                   # append tokens (accepted drafts too), detokenize,
                                         # check stops, retire the finished
    _publish(step_event, ...)            # the one event path: metrics, traces, browsers

The engine is given its runner and its clock (by default it builds the model runner and
reads the wall clock), so the scheduler under test, under a fake runner and in production
is the same code. Outsiders read the engine's views (``kv_snapshot``, ``queue_sizes``,
``block_table``, ``live_requests``, ``describe``: minicb/engine_views.py), never the
scheduler's internals.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.config import EngineConfig, SamplingParams
from minicb.detokenizer import IncrementalDetokenizer
from minicb.engine_views import EngineViews
from minicb.overlap import Launched, OverlapPipeline
from minicb.request import Request, RequestOutput, RequestStatus, TokenDelta
from minicb.scheduler import RequestRejected, SchedulerBase, make_scheduler
from minicb.scheduler.plan import StepPlan
from minicb.telemetry import events, request_events
from minicb.telemetry.bus import EventBus

if TYPE_CHECKING:
    from minicb.runner import Runner, RunnerOutput


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


class LLMEngine(EngineViews):
    """The step loop over a scheduler, a runner, a clock and a bus. Its views (the KV pool,
    queues, live requests, settings) are inherited from ``EngineViews`` (engine_views.py)."""

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
            from minicb.runner.model_runner import ModelRunner  # torch only when needed

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
        # Overlap scheduling: the plan in flight and the runner's thread (minicb/overlap.py).
        self.pipeline = (
            OverlapPipeline(runner, self.scheduler, self.clock)
            if self.config.overlap_scheduling
            else None
        )

    def rebuilt(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        clock: Callable[[], float] | None = None,
        scheduler: Callable[..., SchedulerBase] = make_scheduler,
    ) -> LLMEngine:
        """A new engine with ``config`` on the same weights (or on ``runner``: another
        simulated GPU), clock (or ``clock``: a scenario moving to another runner) and bus;
        ``scheduler`` builds its scheduler, as for a new engine (a lesson's roles).

        This engine's requests are aborted (subscribers see them leave), then the new one
        announces itself with an ``EngineReset`` event; drop this one afterwards.
        """
        if self.pipeline is not None:  # the new engine may share this one's runner
            self.pipeline.drain()
        runner = runner or self.runner.with_config(config)
        new = LLMEngine(config=config, runner=runner, clock=clock or self.clock, bus=self.bus,
                        scheduler=scheduler)  # fmt: skip
        self.abort_all()
        if self.bus.wants("reset"):
            self.bus.emit(events.EngineReset(time=self.clock(), info=new.describe()))
        return new

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
        req.metrics.finished_time = self.clock()
        self._texts.pop(request_id, None)
        if self.bus.wants("aborted"):
            self.bus.emit(
                request_events.RequestAborted(
                    time=req.metrics.finished_time,
                    request_id=request_id,
                    num_output_tokens=len(req.output_token_ids),
                )
            )
        self.publish_kv_changes()  # its blocks are free now, not at the next step
        return True

    def publish_kv_changes(self) -> None:
        """Publish the changes made to the KV pool since the last step (an abort, a role's
        release of KV it has sent) as one ``kv_changes`` event, so that a map drawn from
        the events is current between steps. Nothing while a plan is in flight (overlap):
        its changes were taken when it was planned, so these go with the next step's, in
        order; nor when nobody listens for them (the next step event carries them)."""
        in_flight = self.pipeline is not None and self.pipeline.in_flight is not None
        if in_flight or not self.bus.wants("kv_changes"):
            return
        blocks = self.scheduler.blocks
        ops = blocks.take_changes()
        if ops:
            self.bus.emit(
                events.KVChanges(
                    time=self.clock(),
                    step=self.step_count,
                    kv_ops=[list(op) for op in ops],
                    kv_used=blocks.num_used_blocks,
                    kv_free=blocks.num_free_blocks,
                    kv_cached=blocks.num_cached_blocks,
                )
            )

    def abort_all(self) -> list[int]:
        """Abort every request the engine holds; returns their ids."""
        ids = list(self.scheduler.requests)
        for rid in ids:
            self.abort_request(rid)
        return ids

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
        see ``_step_overlapped``."""
        if self.pipeline is not None:
            return self._step_overlapped()
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
        self._mark_admitted(plan, start)
        new_tokens, firsts, finished = self._update(plan, out, self.scheduler.update)
        event = self._end_step(plan, out, start, lanes, firsts, finished)
        self._publish(event, new_tokens, finished)
        return StepResult(event, new_tokens, finished)

    def _step_overlapped(self, call_start: float | None = None) -> StepResult:
        """Plan N+1, wait for N, launch N+1 with N's tokens in place, settle N while N+1
        runs, and report N (minicb/overlap.py). When nothing was in flight (the first step,
        or after an idle spell), the plan just launched is reported by stepping again.
        When N verifies speculative drafts, N+1 is planned only once N is settled (how many
        drafts N accepts decides where its requests' next rows start), then launched.
        ``busy_s`` counts the seconds of this call (from ``call_start``), not the time
        between calls that a plan spent in flight (a paused demo is not busy)."""
        call_start = self.clock() if call_start is None else call_start
        pipeline = self.pipeline
        wait_first = pipeline.in_flight is not None and pipeline.in_flight.verifies_drafts
        launch = None
        if not wait_first and (self.scheduler.has_unfinished() or pipeline.in_flight is None):
            launch = self._launch_next()
        done = pipeline.exchange(launch)  # a runner's error: both plans undone, raised
        if done is not None:
            prev, out = done
            lanes = Lanes(prev.schedule_s, prev.device_start, prev.execute_s)
            self._mark_admitted(prev.plan, prev.start)
            new_tokens, firsts, finished = self._update(prev.plan, out, pipeline.settle(prev))
        if wait_first and self.scheduler.has_unfinished():
            pipeline.exchange(self._launch_next())  # nothing in flight: it starts at once
        pipeline.advance()  # after the settling: rows of who stopped there are discarded
        if done is None:
            return self._step_overlapped(call_start)
        event = self._end_step(prev.plan, out, prev.start, lanes, firsts, finished, call_start)
        self._publish(event, new_tokens, finished)
        return StepResult(event, new_tokens, finished)

    def _launch_next(self) -> Launched:
        """The next plan, made now, for the overlap pipeline to launch."""
        start = self.clock()
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        return Launched(plan, start, time.perf_counter() - t0)

    def _mark_admitted(self, plan: StepPlan, start: float) -> None:
        """First admissions are stamped with the step's start, as their admitted events."""
        for decision in plan.admitted:
            req = self.scheduler.requests.get(decision.request_id)
            if req is None:  # overlap: aborted while its step ran
                continue
            metrics = req.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = start
                metrics.num_cached_tokens = decision.num_cached_tokens

    def _update(
        self, plan: StepPlan, out: RunnerOutput, apply: Callable[..., Any]
    ) -> tuple[list[TokenDelta], list[Request], list[RequestOutput]]:
        """Append the sampled tokens with ``apply`` (``Scheduler.update``, or the overlap's
        settling), each one detokenized and checked for a stop in turn, then retire the
        finished requests: the step's tokens, the requests given their first token, and
        the outputs of those that finished (``_end_step`` stamps both with the step's end)."""
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
        return new_tokens, firsts, finished

    def _end_step(
        self,
        plan: StepPlan,
        out: RunnerOutput,
        start: float,
        lanes: Lanes,
        firsts: list[Request],
        finished: list[RequestOutput],
        counted_from: float | None = None,
    ) -> events.StepEvent:
        """The step's event, at its end: when ``firsts`` got their first token and
        ``finished`` their end, the times their events carry (an output, a stream and a
        reader of the events agree on a request's TTFT and latency). ``busy_s``, the
        engine's own clock, grows by the seconds since ``counted_from`` (default ``start``;
        with overlap, each ``step()`` call counts its own seconds once)."""
        end = self.clock()
        self.busy_s += end - (start if counted_from is None else counted_from)
        for req in firsts:
            req.metrics.first_token_time, req.metrics.first_token_busy_s = end, self.busy_s
        for output in finished:
            output.metrics.finished_time = end
        prepare_s = max(0.0, lanes.execute_s - out.forward_s - out.sample_s)
        schedule_s, device_start = lanes.schedule_s, lanes.device_start
        process_s = time.perf_counter() - lanes.process_t0
        if out.host_lanes is not None:  # a simulated host's, on the virtual clock
            schedule_s, wait_s, process_s = out.host_lanes
            device_start, prepare_s = device_start + wait_s, 0.0
        return events.StepEvent(
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

    def _publish(
        self, event: events.StepEvent, new_tokens: list[TokenDelta], finished: list[RequestOutput]
    ) -> None:
        """The step's events on the bus at once, one call per listener; when nobody
        listens, nothing is built."""
        if not self.bus.listening:
            return
        batch: list[events.Event] = [event] if self.bus.wants("step") else []
        batch += request_events.step_request_events(event, new_tokens, finished, self.bus.wants)
        if batch:
            self.bus.emit_many(batch)

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
