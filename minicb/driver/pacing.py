"""Pacer: simulated engines held to the wall clock, times a speed factor, for watching.

An engine on a simulated GPU (minicb/sim/simulated_runner.py) reads a ``VirtualClock`` that
moves only by its steps' predicted times. Left alone, the engine loop would run it as fast
as Python can, and a second of H100 time would flash by in a blink (or crawl, at scale).
The pacer keeps a target time instead: each round it moves on by the wall time since the
last round times ``speed`` (at most ``MAX_TICK_S`` of wall time a round, so a pause or a
slow round is no burst of catching up), and

- a busy engine steps only while its clock is behind the target;
- an idle engine's clock is brought up to the target, as a real GPU idles in real time,
  so that a request arriving after a quiet spell is stamped when it arrived;
- the workload feeder reads the target (``now``) as its clock, so arrivals come at
  ``rate`` per simulated second.

If Python cannot keep up (hundreds of rows, two CPU cores), the target waits for the
slowest busy engine (it runs at most one tick ahead of it), so simulated time runs slower
than ``speed`` x wall time for everyone alike: the feeder does not flood engines that lag,
and static and continuous batching stay side by side in simulated time. Every time the
page shows is the simulated one. Engines on the wall clock are never held.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from minicb.core.runner import VirtualClock

if TYPE_CHECKING:
    from minicb.core.engine_like import SteppedEngine

MAX_TICK_S = 0.25  # wall seconds a round may add to the target


class Pacer:
    def __init__(self, speed: float = 1.0, wall: Callable[[], float] = time.monotonic) -> None:
        """``speed``: simulated seconds per wall second; ``wall``: the wall clock."""
        if not isinstance(speed, int | float) or not 0.0 < speed <= 1000.0:
            raise ValueError(f"speed must be in (0, 1000] simulated seconds a second, got {speed}")
        self.speed = float(speed)
        self.wall = wall
        self._last = wall()
        self.target: float | None = None  # simulated seconds; set from the clocks at first

    def now(self) -> float:
        """The simulated time the engines are held to (the feeder's clock)."""
        return self.target or 0.0

    def advance(self, engines: dict[str, SteppedEngine]) -> None:
        """Move the target on by this round's wall time, at most one tick past the slowest
        busy engine; bring idle engines up to it."""
        paced = {n: e for n, e in engines.items() if isinstance(e.clock, VirtualClock)}
        now = self.wall()
        if self.target is None:
            self.target = max((e.clock.now for e in paced.values()), default=0.0)
        step = min(now - self._last, MAX_TICK_S) * self.speed
        self._last = now
        busy = [e.clock.now for e in paced.values() if e.has_unfinished()]
        ceiling = min(busy) + MAX_TICK_S * self.speed if busy else float("inf")
        self.target = max(self.target, min(self.target + step, ceiling))  # never backwards
        for engine in paced.values():
            if not engine.has_unfinished():
                engine.clock.advance(max(0.0, self.target - engine.clock.now))

    def due(self, busy: list[tuple[str, SteppedEngine]]) -> list[tuple[str, SteppedEngine]]:
        """The busy engines that may step now: those behind the target, or on wall time."""
        target = self.now()
        return [
            (name, e)
            for name, e in busy
            if not isinstance(e.clock, VirtualClock) or e.clock.now < target
        ]

    def wait_s(self, busy: list[tuple[str, SteppedEngine]]) -> float:
        """Wall seconds until the first held engine is due (0 when none is held)."""
        ahead = [e.clock.now - self.now() for _, e in busy if isinstance(e.clock, VirtualClock)]
        return max(0.0, min(ahead, default=0.0)) / self.speed
