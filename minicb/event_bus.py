"""EventBus: turns what the engine did into events and hands them to whoever listens.

The bus is an engine observer (``attach(engine)``). Each callback builds the events of
minicb.events from the engine's StepResult or Request and passes each one to

- synchronous subscribers (metrics, trace writer, Prometheus), called in the engine thread
  in the order they subscribed; keep them quick, they are part of the step;
- asynchronous subscriptions (``subscribe_async``): bounded queues read from other threads
  or an asyncio loop, which never make the engine wait (see minicb.subscription).

Subscribers may ask for some kinds of event only. Nothing is built for a kind nobody asked
for, and when nobody listens at all each callback returns at once.

Per-step request events come in this order after their StepEvent: preempted, swapped out,
swapped in, admitted (stamped with the step's ``wall_start``, when the scheduler decided),
then first token, token and finished (stamped with ``wall_end``, when results were ready).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from minicb.events import (
    EVENT_KINDS,
    DecisionInfo,
    Event,
    RequestAborted,
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    RequestFirstToken,
    RequestPreempted,
    RequestRejected,
    RequestSwappedIn,
    RequestSwappedOut,
    RequestToken,
    RowInfo,
    StepEvent,
)
from minicb.subscription import Subscription

if TYPE_CHECKING:
    from minicb.outputs import StepResult
    from minicb.request import Request
    from minicb.scheduler.plan import Decision

Listener = Callable[[Event], Any]


class EventBus:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # Copy-on-write tuples: the engine thread reads them without a lock while other
        # threads subscribe and unsubscribe.
        self._sync: tuple[tuple[Listener, frozenset[str] | None], ...] = ()
        self._async: tuple[Subscription, ...] = ()
        self._wanted: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    # ---- subscribing ---------------------------------------------------------------------
    def subscribe(self, listener: Listener, kinds: Iterable[str] | None = None) -> Listener:
        """Call ``listener(event)`` in the engine thread for every event (of ``kinds``)."""
        with self._lock:
            self._sync += ((listener, _kinds(kinds)),)
            self._refresh()
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._sync = tuple(s for s in self._sync if s[0] is not listener)
            self._refresh()

    def subscribe_async(
        self, maxsize: int = 1024, kinds: Iterable[str] | None = None
    ) -> Subscription:
        """A bounded queue of events for another thread; ``close()`` it when done."""
        sub = Subscription(maxsize, _kinds(kinds), on_close=self._forget)
        with self._lock:
            self._async += (sub,)
            self._refresh()
        return sub

    def _forget(self, sub: Subscription) -> None:
        with self._lock:
            self._async = tuple(s for s in self._async if s is not sub)
            self._refresh()

    def _refresh(self) -> None:
        wanted: set[str] = set()
        for kinds in [k for _, k in self._sync] + [s.kinds for s in self._async]:
            wanted |= EVENT_KINDS if kinds is None else kinds
        self._wanted = frozenset(wanted)

    @property
    def listening(self) -> bool:
        return bool(self._wanted)

    def wants(self, kind: str) -> bool:
        return kind in self._wanted

    def emit(self, event: Event) -> None:
        kind = event.kind
        for listener, kinds in self._sync:
            if kinds is None or kind in kinds:
                listener(event)
        for sub in self._async:
            if sub.kinds is None or kind in sub.kinds:
                sub.put(event)

    # ---- engine observer callbacks -------------------------------------------------------
    def request_arrived(self, req: Request) -> None:
        if "arrived" not in self._wanted:
            return
        self.emit(
            RequestArrived(
                time=req.arrival_time,
                request_id=req.request_id,
                prompt=req.prompt,
                num_prompt_tokens=req.num_prompt_tokens,
                max_tokens=req.params.max_tokens,
                priority=req.priority,
                params=asdict(req.params),
            )
        )

    def request_rejected(self, prompt: Any, error: str) -> None:
        if "rejected" not in self._wanted:
            return
        text = prompt if isinstance(prompt, str) else None
        length = len(prompt) if isinstance(prompt, list | tuple) else None
        self.emit(
            RequestRejected(time=time.time(), prompt=text, num_prompt_tokens=length, error=error)
        )

    def request_aborted(self, req: Request) -> None:
        if "aborted" not in self._wanted:
            return
        when = req.metrics.finished_time or time.time()
        self.emit(
            RequestAborted(
                time=when, request_id=req.request_id, num_output_tokens=len(req.output_token_ids)
            )
        )

    def step_done(self, result: StepResult) -> None:
        if not self._wanted:  # nobody listens: build nothing
            return
        plan = result.plan
        if "step" in self._wanted:
            self.emit(step_event(result, self.block_size))
        start, end, step = result.wall_start, result.wall_end, plan.step
        if "preempted" in self._wanted:
            for d in plan.preempted:
                self.emit(
                    RequestPreempted(
                        time=start,
                        request_id=d.request_id,
                        step=step,
                        mode=d.mode or "",
                        reason=d.reason,
                    )
                )
        for kind, decisions, cls in (
            ("swapped_out", plan.swapped_out, RequestSwappedOut),
            ("swapped_in", plan.swapped_in, RequestSwappedIn),
            ("admitted", plan.admitted, RequestAdmitted),
        ):
            if kind in self._wanted:
                for d in decisions:
                    self.emit(cls(time=start, request_id=d.request_id, step=step, reason=d.reason))
        self._token_events(result, end, step)
        if "finished" in self._wanted:
            self._finished_events(result, end, step)

    def _token_events(self, result: StepResult, end: float, step: int) -> None:
        first, token = "first_token" in self._wanted, "token" in self._wanted
        if not (first or token):
            return
        for delta in result.new_tokens:
            rid = delta.request_id
            if first and delta.index == 0:
                self.emit(RequestFirstToken(time=end, request_id=rid, step=step))
            if token:
                self.emit(
                    RequestToken(
                        time=end,
                        request_id=rid,
                        step=step,
                        token_id=delta.token_id,
                        index=delta.index,
                        text=delta.text,
                    )
                )

    def _finished_events(self, result: StepResult, end: float, step: int) -> None:
        outputs = {o.request_id: o for o in result.finished}
        for d in result.plan.finished:
            out = outputs.get(d.request_id)
            if out is None:  # aborted between steps: already told by request_aborted
                continue
            self.emit(
                RequestFinished(
                    time=end,
                    request_id=d.request_id,
                    step=step,
                    finish_reason=out.finish_reason,
                    reason=d.reason,
                    num_prompt_tokens=len(out.prompt_token_ids),
                    num_output_tokens=len(out.token_ids),
                    num_preemptions=out.metrics.num_preemptions,
                )
            )


def step_event(result: StepResult, block_size: int) -> StepEvent:
    """The StepEvent of one engine step."""
    plan = result.plan
    return StepEvent(
        index=plan.step,
        batching=plan.batching,
        wall_start=result.wall_start,
        wall_end=result.wall_end,
        schedule_s=result.schedule_s,
        forward_s=result.forward_s,
        sample_s=result.sample_s,
        block_size=block_size,
        scheduled=[
            RowInfo(
                request_id=r.request_id,
                phase=r.phase,
                num_tokens=len(r.token_ids),
                start_position=r.start_position,
                context_len=r.context_len,
                num_blocks=len(r.block_table),
            )
            for r in plan.scheduled
        ],
        admitted=_decisions(plan.admitted),
        preempted=_decisions(plan.preempted),
        swapped_out=_decisions(plan.swapped_out),
        swapped_in=_decisions(plan.swapped_in),
        finished=_decisions(plan.finished),
        notes=list(plan.notes),
        budget_used=plan.budget_used,
        budget_limit=plan.budget_limit,
        slots_used=plan.slots_used,
        slots_limit=plan.slots_limit,
        kv_used=plan.kv_used,
        kv_free=plan.kv_free,
        kv_total=plan.kv_total,
        kv_swapped=plan.kv_swapped,
        num_waiting=plan.num_waiting,
        num_swapped=plan.num_swapped,
    )


def _decisions(decisions: list[Decision]) -> list[DecisionInfo]:
    return [DecisionInfo(d.request_id, d.reason, d.mode) for d in decisions]


def _kinds(kinds: Iterable[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    chosen = frozenset(kinds)
    unknown = sorted(chosen - EVENT_KINDS)
    if unknown:
        raise ValueError(
            f"unknown event kind(s) {unknown}; known: {', '.join(sorted(EVENT_KINDS))}"
        )
    return chosen


def attach(engine: Any, bus: EventBus | None = None) -> EventBus:
    """Make ``bus`` (a new one if None) an observer of ``engine``; returns it.

    Reuses a bus already attached to this engine, so helpers can call it freely.
    """
    for obs in getattr(engine, "observers", []):
        if isinstance(obs, EventBus) and (bus is None or obs is bus):
            return obs
    bus = bus or EventBus(block_size=engine.config.block_size)
    engine.add_observer(bus)
    return bus
