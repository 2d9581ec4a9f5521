"""The engine's controls: requests that leave between steps, because a client said so.

A client aborts a request (its KV blocks are free at once, and the pool's changes are
published then, not at the next step); a role that has sent a request's KV elsewhere
publishes the blocks it let go the same way. ``LLMEngine`` (minicb/core/engine.py) holds
one ``EngineControls`` and answers ``abort_request``, ``abort_all`` and
``publish_kv_changes`` with it; a request's way through the engine never crosses this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core import events, request_events

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.core.bus import EventBus
    from minicb.core.output_processor import OutputProcessor
    from minicb.core.scheduler import SchedulerBase


class EngineControls:
    """Aborts of one engine's requests, and the KV changes published between its steps."""

    def __init__(
        self,
        scheduler: SchedulerBase,
        outputs: OutputProcessor,
        bus: EventBus,
        clock: Callable[[], float],
        step_in_flight: Callable[[], bool],
    ) -> None:
        """``step_in_flight``: whether a step strategy holds a step not published yet."""
        self.scheduler = scheduler
        self.outputs = outputs
        self.bus = bus
        self.clock = clock
        self.step_in_flight = step_in_flight

    def abort_request(self, request_id: int) -> bool:
        """Stop a request wherever it is and free its KV blocks now. False if unknown."""
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        req.metrics.finished_time = self.clock()
        self.outputs.drop(request_id)
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

    def abort_all(self) -> list[int]:
        """Abort every request the engine holds; returns their ids."""
        ids = list(self.scheduler.requests)
        for rid in ids:
            self.abort_request(rid)
        return ids

    def publish_kv_changes(self) -> None:
        """Publish the changes made to the KV pool since the last step (an abort, a role's
        release of KV it has sent) as one ``kv_changes`` event, so that a map drawn from
        the events is current between steps. Nothing while a step is in flight (a step
        strategy such as overlap): its changes were taken when it was planned, so these go
        with the next step's, in order; nor when nobody listens for them (the next step
        event carries them)."""
        if self.step_in_flight() or not self.bus.wants("kv_changes"):
            return
        blocks = self.scheduler.blocks
        ops = blocks.take_changes()
        if ops:
            self.bus.emit(
                events.KVChanges(
                    time=self.clock(),
                    step=self.scheduler.step_count,
                    kv_ops=[list(op) for op in ops],
                    kv_used=blocks.num_used_blocks,
                    kv_free=blocks.num_free_blocks,
                    kv_cached=blocks.num_cached_blocks,
                )
            )
