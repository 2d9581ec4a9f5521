"""Overlap scheduling: the next iteration is planned while the runner computes this one.

Without it, the device waits while the host schedules, prepares and processes outputs, and
the host waits while the device computes. With ``overlap_scheduling`` (settings.py) the
engine keeps one plan in flight on a worker thread (torch releases the GIL in its ops; on
CUDA its kernels are asynchronous anyway), the idea of SGLang's zero-overhead scheduler
and of vLLM's async scheduling. ``OverlapStep`` is a step strategy (seam 5,
minicb/core/step_strategy.py): its own whole loop, in place of ``LLMEngine.step``'s plain
one. One ``step()`` does, in this order:

    plan N+1 = scheduler.schedule()      # N is still running: N's rows count as run
    out N = wait for N                   # the device's result
    fill N's tokens into N+1, launch N+1 # the device starts again at once
    settle N                             # tokens, stops, retirements: while N+1 runs
    advance N+1                          # its rows count as run; stopped ones discarded

and publishes iteration N (its event is N's own: its rows, decisions and timings). With
speculative decoding, a plan N that verifies drafts is waited for before N+1 is planned
(its rows yield 1 to 1 + d tokens: where its requests' next rows start is known only
then), and N+1 is launched as soon as it is made. The bookkeeping (placeholders, settling,
discarding) is minicb/overlap/bookkeeping.py; this file holds the plan in flight, the
thread and the loop, which settles and publishes through the engine's collaborators (its
``OutputProcessor``, its ``StepClock``, ``publish``) as the plain loop does. The package
registers it by name (minicb/overlap/__init__.py); this file is imported only where
overlap scheduling is on. Pure Python: no torch.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minicb.overlap import bookkeeping

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine
    from minicb.core.output_processor import StepResult
    from minicb.core.runner import RunnerOutput
    from minicb.core.scheduler.plan import StepPlan
    from minicb.core.step_clock import StepLap


@dataclass
class Launched:
    """One plan handed to the runner: what the loop needs to publish it when it is done."""

    plan: StepPlan
    lap: StepLap  # its moments: scheduled here, executed on the worker
    future: Future | None = field(default=None, repr=False)
    discarded: set[int] = field(default_factory=set)  # rows whose requests had stopped

    @property
    def verifies_drafts(self) -> bool:
        """Whether the next plan must wait for this one (its rows' token counts)."""
        return bookkeeping.verifies_drafts(self.plan)


class OverlapStep:
    """One engine's overlapped loop: at most one plan in flight on one worker thread, so
    plans run strictly in order: a block freed while a plan runs can be given to the next
    plan, never to this one."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler
        self.runner = engine.runner
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minicb-runner")
        self.in_flight: Launched | None = None

    def step(self, call_start: float | None = None) -> StepResult:
        """One ``engine.step()``: plan N+1, wait for N, launch N+1 with N's tokens in place,
        settle N while N+1 runs, and publish N. When nothing was in flight (the first step,
        or after an idle spell), the plan just launched is published by stepping again.
        When N verifies speculative drafts, N+1 is planned only once N is settled (how many
        drafts N accepts decides where its requests' next rows start), then launched.
        ``busy_s`` counts the seconds of this call (from ``call_start``), not the time
        between calls that a plan spent in flight (a paused demo is not busy)."""
        engine = self.engine
        call_start = engine.clock() if call_start is None else call_start
        wait_first = self.in_flight is not None and self.in_flight.verifies_drafts
        launch = None
        if not wait_first and (self.scheduler.has_unfinished() or self.in_flight is None):
            launch = self._plan_next()
        done = self.exchange(launch)  # a runner's error: both plans undone, raised
        if done is not None:
            prev, out = done
            prev.lap.processing()
            settled = engine.outputs.settling(prev.plan, prev.lap.start)
            bookkeeping.settle(
                self.scheduler, prev.plan, out.sampled, prev.discarded, settled.on_token
            )
            settled.retire(self.scheduler.retire(prev.plan))
        if wait_first and self.scheduler.has_unfinished():
            self.exchange(self._plan_next())  # nothing in flight: it starts at once
        self.advance()  # after the settling: rows of who stopped there are discarded
        if done is None:
            return self.step(call_start)
        event = engine.step_clock.step_event(prev.plan, out, prev.lap, counted_from=call_start)
        return engine.publish(settled.result(event))

    def _plan_next(self) -> Launched:
        """The next plan, made now, to launch."""
        lap = self.engine.step_clock.lap()
        plan = self.scheduler.schedule()
        lap.scheduled()
        return Launched(plan, lap)

    def exchange(self, launch: Launched | None) -> tuple[Launched, RunnerOutput] | None:
        """Wait for the plan in flight (if any), put its tokens in place of ``launch``'s
        placeholders and start ``launch`` (if any). Returns the finished plan and its output,
        or None when nothing was in flight. The runner's error is raised here, after both
        plans are undone (stepping again is then safe)."""
        done, self.in_flight = self.in_flight, None
        try:
            out = done.future.result() if done is not None else None
        except BaseException:  # an interrupt in a notebook too
            self._undo(launch.plan if launch is not None else None, done)
            raise
        if launch is not None:
            if out is not None:
                _fill_placeholders(launch.plan, out)
            launch.future = self.worker.submit(self._execute, launch)
            self.in_flight = launch
        return None if done is None else (done, out)

    def _execute(self, launch: Launched) -> RunnerOutput:
        """On the worker thread: the runner takes the plan up now."""
        launch.lap.executing()
        out = self.runner.execute(launch.plan)
        launch.lap.executed()
        return out

    def advance(self) -> None:
        """Count the plan in flight as run, so the next one can be planned now."""
        if self.in_flight is not None:
            self.in_flight.discarded = bookkeeping.advance(self.scheduler, self.in_flight.plan)

    def _undo(self, unlaunched: StepPlan | None, failed: Launched) -> None:
        """The plan in flight failed (``failed``) and ``unlaunched`` was made after it: both
        are undone, placeholders first: every request they touched waits again, its tokens
        kept, as the engine's undo does without overlap."""
        bookkeeping.forget(self.scheduler, failed.plan, failed.discarded)
        if unlaunched is not None:
            self.scheduler.undo(unlaunched)
        self.scheduler.undo(failed.plan)  # last: its requests wait first, in its order

    def close(self) -> None:
        """Wait for the plan in flight and drop it (the engine is being replaced)."""
        done, self.in_flight = self.in_flight, None
        if done is not None:
            done.future.exception()  # waits; its error, if any, no longer matters
        self.worker.shutdown(wait=False)


def _fill_placeholders(plan: StepPlan, out: RunnerOutput) -> None:
    """The previous iteration's tokens, where its placeholders stand in ``plan``'s rows."""
    for row in plan.scheduled:
        # Only a row that reaches its request's last token can hold one: it is that token,
        # the last before the row's drafts, if any (drafted on a guess of it).
        last = len(row.token_ids) - 1 - row.num_draft_tokens
        if last >= 0 and row.token_ids[last] == bookkeeping.PLACEHOLDER:
            new = out.sampled[row.request_id]
            row.token_ids[last] = new[0] if isinstance(new, list) else new
