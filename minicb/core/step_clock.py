"""The engine's own clock and the two lanes of each step: when the host and the device worked.

A step event says when the step began and ended on the engine's clock, and how its time
splits between the host (schedule, prepare the runner's inputs, process the outputs) and
the device (forward and sample): docs/events.md draws them as two lanes. The step loop only
marks the moments on a ``StepLap`` as it passes them; ``StepClock`` turns a finished lap
into the step's event and keeps the engine's own clock, ``busy_s``: the seconds spent in
this engine's steps, which leaves out whatever one thread did between them (the other
engines of a scenario, a paused demo). Each loop (the plain one in engine.py, a step
strategy such as overlap scheduling) marks its own lap, so the event's fields are defined
once, here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from minicb.core import events

if TYPE_CHECKING:
    from minicb.core.runner import RunnerOutput
    from minicb.core.scheduler.plan import StepPlan


class StepLap:
    """The moments of one step, marked as the loop passes them. The host's lanes are
    measured on ``time.perf_counter`` (microseconds of Python), the step's bounds and the
    device's start on the engine's clock (a virtual one under a fake or simulated GPU)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.start = clock()  # engine clock when scheduling began
        self._t0 = time.perf_counter()
        self.schedule_s = 0.0
        self.device_start = self.start
        self._device_t0 = self._t0
        self.execute_s = 0.0  # the runner's execute: prepare inputs, forward, sample
        self._process_t0 = self._t0

    def scheduled(self) -> None:
        """The plan is made; the device may take it up now."""
        self._device_t0 = time.perf_counter()
        self.schedule_s = self._device_t0 - self._t0
        self.device_start = self.clock()

    def executing(self) -> None:
        """The runner takes the plan up later than it was made (overlap: on its thread,
        once the plan before it has run)."""
        self.device_start = self.clock()
        self._device_t0 = time.perf_counter()

    def executed(self) -> None:
        """The runner has answered; the host may process its outputs now."""
        self._process_t0 = time.perf_counter()
        self.execute_s = self._process_t0 - self._device_t0

    def processing(self) -> None:
        """The host takes the outputs up later than the runner gave them (overlap: after
        it has planned and launched the next step)."""
        self._process_t0 = time.perf_counter()

    def process_s(self) -> float:
        """Seconds since the host took the outputs up."""
        return time.perf_counter() - self._process_t0


class StepClock:
    """The engine's own clock (``busy_s``) and the step events built from finished laps."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.busy_s = 0.0  # seconds spent in this engine's own steps

    def lap(self) -> StepLap:
        """A new step begins now."""
        return StepLap(self.clock)

    def step_event(
        self,
        plan: StepPlan,
        out: RunnerOutput,
        lap: StepLap,
        counted_from: float | None = None,
    ) -> events.StepEvent:
        """The step's event, ending now. ``busy_s`` grows by the seconds since
        ``counted_from`` (default: the lap's start; with overlap, each ``step()`` call
        counts its own seconds once, not the time a plan waited in flight between calls).
        A simulated host's lanes (``out.host_lanes``, on the virtual clock) replace the
        measured ones, which are microseconds of Python off that clock."""
        end = self.clock()
        self.busy_s += end - (lap.start if counted_from is None else counted_from)
        schedule_s, device_start, process_s = lap.schedule_s, lap.device_start, lap.process_s()
        prepare_s = max(0.0, lap.execute_s - out.forward_s - out.sample_s)
        if out.host_lanes is not None:
            schedule_s, wait_s, process_s = out.host_lanes
            device_start, prepare_s = device_start + wait_s, 0.0
        return events.StepEvent(
            plan,
            lap.start,
            end,
            schedule_s,
            out.forward_s,
            out.sample_s,
            tensor_parallel_size=out.tensor_parallel_size,
            collective_s=out.collective_s,
            bandwidth_util=out.bandwidth_util,
            flop_util=out.flop_util,
            busy_s=self.busy_s,
            device_start=device_start,
            prepare_s=prepare_s,
            process_s=process_s,
        )
