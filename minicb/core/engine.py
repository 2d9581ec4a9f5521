"""LLMEngine: the iteration loop. Each ``step()`` schedules, executes, updates, publishes.

    plan = scheduler.schedule()               # who runs this iteration, and why
    out = runner.execute(plan)                # one ragged batch through the model (or a fake)
    scheduler.update(plan, out.sampled, ...)  # append tokens (accepted drafts too); each one
                                              # detokenized and checked for a stop
    scheduler.retire(plan)                    # the finished leave, their blocks freed
    publish(...)                              # the step event on the one event path:
                                              # metrics, traces, browsers

The engine is given its runner and its clock (by default it builds the model runner and
reads the wall clock), so the scheduler under test, under a fake runner and in production
is the same code. Collaborators, one concept each, keep the class one readable file: the
``InputProcessor`` (prompts into token ids), the ``OutputProcessor`` (tokens into text,
stops and outputs), the ``StepClock`` (the step event's lanes and the engine's own clock),
the ``EngineViews`` (what outsiders read: ``kv_snapshot``, ``queue_sizes``, ...; never the
scheduler's internals) and the ``EngineControls`` (aborts between steps).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self

from minicb.core import events, request_events
from minicb.core.bus import EventBus
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine_controls import EngineControls
from minicb.core.engine_views import EngineViews, KVSnapshot
from minicb.core.input_processor import InputProcessor, check_hint
from minicb.core.output_processor import OutputProcessor, StepResult
from minicb.core.request import Request, RequestOutput, TokenDelta
from minicb.core.scheduler import SchedulerBase, make_scheduler
from minicb.core.scheduler.hooks import attach_runner
from minicb.core.step_clock import StepClock
from minicb.core.step_strategy import StepStrategy, build_step_strategy

if TYPE_CHECKING:
    from minicb.core.runner import Runner
    from minicb.core.scheduler.prefix_cache import CachedBlock


def _check_pool_sizes(config: EngineConfig, runner: Runner) -> None:
    """A runner given from outside must have the pools the config asks for, if it asks."""
    for name in ("num_kv_blocks", "num_swap_blocks"):
        wanted, has = getattr(config, name), getattr(runner, name)
        if wanted is not None and wanted != has:
            raise ValueError(
                f"the config asks for {name}={wanted} but the runner has {has}; build the "
                f"runner with {name}={wanted} (or leave it unset in the config)"
            )


class LLMEngine:
    """The step loop over a scheduler, a runner, a clock and a bus. What outsiders read
    (the KV pool, queues, live requests, settings) the engine answers with its
    ``EngineViews`` (engine_views.py), and the aborts with its ``EngineControls``
    (engine_controls.py): collaborators, each one concept in its own file."""

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
            from minicb.core.runner.model_runner import build_runner  # torch only when needed

            runner = build_runner(model, self.config)
        _check_pool_sizes(self.config, runner)
        self.runner = runner
        self.clock = clock or time.time
        self.bus = bus or EventBus()
        self.tokenizer = runner.tokenizer
        self.eos_token_ids = runner.stop_token_ids
        self.max_model_len = runner.max_model_len
        self.scheduler = scheduler(
            self.config, runner.num_kv_blocks, self.max_model_len, runner.num_swap_blocks
        )
        attach_runner(self.scheduler.drafter, runner)  # a draft model's weights, a verifier
        self._ids = itertools.count()
        self.inputs = InputProcessor(self.tokenizer, runner.vocab_size)
        self.outputs = OutputProcessor(
            self.tokenizer,
            self.eos_token_ids,
            self.max_model_len,
            self.scheduler.finish,
            self.scheduler.requests.get,
        )
        self.step_clock = StepClock(self.clock)
        self.views = EngineViews(self.config, runner, self.scheduler, self.clock, self.step_clock)
        self.controls = EngineControls(
            self.scheduler, self.outputs, self.bus, self.clock, self._step_in_flight
        )
        # Another whole step loop, if the config asks for one (None: step()'s own).
        self.strategy: StepStrategy | None = build_step_strategy(self)

    def rebuilt(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        clock: Callable[[], float] | None = None,
        scheduler: Callable[..., SchedulerBase] = make_scheduler,
    ) -> Self:
        """A new engine with ``config`` on the same weights (or on ``runner``: another
        simulated GPU), clock (or ``clock``: a scenario moving to another runner) and bus;
        ``scheduler`` builds its scheduler, as for a new engine (a lesson's roles).

        This engine's requests are aborted (subscribers see them leave), then the new one
        announces itself with an ``EngineReset`` event; drop this one afterwards.
        """
        if self.strategy is not None:  # the new engine may share this one's runner
            self.strategy.close()
        runner = runner or self.runner.with_config(config)
        new = type(self)(config=config, runner=runner, clock=clock or self.clock, bus=self.bus,
                         scheduler=scheduler)  # fmt: skip
        self.abort_all()
        if self.bus.wants("reset"):
            self.bus.emit(events.EngineReset(time=self.clock(), info=new.describe()))
        return new

    # ---- requests (prompts: input_processor.py; aborts: engine_controls.py) -------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return self.inputs.tokenize(prompt)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return self.inputs.apply_chat_template(messages)

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
            check_hint(expected_output_tokens, params.max_tokens)
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
        self.outputs.add(req)
        if self.bus.wants("arrived"):
            self.bus.emit(request_events.arrived(req))
        return req.request_id

    def abort_request(self, request_id: int) -> bool:
        return self.controls.abort_request(request_id)

    def abort_all(self) -> list[int]:
        return self.controls.abort_all()

    def has_unfinished(self) -> bool:
        """Requests left, or (a step strategy) a step in flight still to be reported."""
        return self.scheduler.has_unfinished() or self._step_in_flight()

    def _step_in_flight(self) -> bool:
        return self.strategy is not None and self.strategy.in_flight is not None

    # ---- the iteration -------------------------------------------------------------------
    def step(self) -> StepResult:
        """One iteration: schedule, execute, update, publish.

        If the runner raises, the step is undone before the error goes on: every request
        it touched (ran a row, swapped in or out) waits again with its blocks freed and its
        tokens kept, as after a preemption by recompute, since the runner may have written
        part of their KV or none of their copies. Stepping again (after catching the error
        from here or from ``LLM.generate``) is then safe: no row ever reads a block that a
        failed step was meant to fill.

        A config may ask for another whole loop, a step strategy (step_strategy.py): with
        ``overlap_scheduling`` the next iteration is planned while this one computes."""
        if self.strategy is not None:
            return self.strategy.step()
        lap = self.step_clock.lap()  # the moments the step event's two lanes are drawn from
        plan = self.scheduler.schedule()
        lap.scheduled()
        try:
            out = self.runner.execute(plan)
        except BaseException:  # an interrupt in a notebook too: the retry must be safe
            self.scheduler.undo(plan)
            raise
        lap.executed()
        settled = self.outputs.settling(plan, lap.start)
        # Each sampled token appended in turn, detokenized and checked for a stop at once.
        self.scheduler.update(plan, out.sampled, settled.on_token)
        settled.retire(self.scheduler.retire(plan))
        event = self.step_clock.step_event(plan, out, lap)
        return self.publish(settled.result(event))

    def publish(self, result: StepResult) -> StepResult:
        """A step's events on the bus at once, one call per listener: its step event, then
        its requests' (docs/events.md); when nobody listens, nothing is built."""
        if self.bus.listening:
            batch: list[events.Event] = [result.event] if self.bus.wants("step") else []
            batch += request_events.step_request_events(
                result.event, result.new_tokens, result.finished, self.bus.wants
            )
            if batch:
                self.bus.emit_many(batch)
        return result

    def publish_kv_changes(self) -> None:
        self.controls.publish_kv_changes()

    # ---- the views (engine_views.py) -----------------------------------------------------
    @property
    def busy_s(self) -> float:
        """Seconds spent in this engine's own steps: its own clock (step_clock.py)."""
        return self.step_clock.busy_s

    @property
    def model_name(self) -> str:
        return self.runner.model_name

    @property
    def step_count(self) -> int:
        return self.views.step_count

    def kv_snapshot(self) -> KVSnapshot:
        return self.views.kv_snapshot()

    def kv_snapshot_event(self) -> events.KVSnapshotEvent:
        return self.views.kv_snapshot_event()

    def block_table(self, request_id: int) -> list[int]:
        return self.views.block_table(request_id)

    def cached_prefixes(self, blocks: Iterable[int]) -> tuple[int, dict[int, CachedBlock]]:
        return self.views.cached_prefixes(blocks)

    def queue_sizes(self) -> dict[str, int]:
        return self.views.queue_sizes()

    def live_requests(self) -> list[dict[str, Any]]:
        return self.views.live_requests()

    def describe(self) -> dict[str, Any]:
        return self.views.describe()

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
