"""The engine's controls: what outsiders do to an engine besides adding requests and
stepping it.

A client aborts a request (its KV blocks are free at once, and the pool's changes are
published then, not at the next step); the demo and the scenarios rebuild an engine with
new settings on the same weights and bus; the server turns a conversation into token ids
with the model's chat template. ``LLMEngine`` (minicb/core/engine.py) inherits these, as it
inherits its views (engine_views.py); a request's way through the engine never crosses
this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from minicb.core import events, request_events
from minicb.core.scheduler import RequestRejected, make_scheduler

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.core.bus import EventBus
    from minicb.core.config import EngineConfig
    from minicb.core.output_processor import OutputProcessor
    from minicb.core.runner import Runner
    from minicb.core.scheduler import SchedulerBase
    from minicb.core.step_strategy import StepStrategy


class EngineControls:
    """Aborts, rebuilding and the chat template of ``LLMEngine``."""

    # What the controls use, set by LLMEngine.__init__.
    config: EngineConfig
    runner: Runner
    scheduler: SchedulerBase
    clock: Callable[[], float]
    bus: EventBus
    tokenizer: object
    strategy: StepStrategy | None
    outputs: OutputProcessor
    step_count: int  # EngineViews'

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

    def publish_kv_changes(self) -> None:
        """Publish the changes made to the KV pool since the last step (an abort, a role's
        release of KV it has sent) as one ``kv_changes`` event, so that a map drawn from
        the events is current between steps. Nothing while a step is in flight (a step
        strategy such as overlap): its changes were taken when it was planned, so these go
        with the next step's, in order; nor when nobody listens for them (the next step
        event carries them)."""
        in_flight = self.strategy is not None and self.strategy.in_flight is not None
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
