"""The numbers behind minicb's Prometheus metrics: a gauge, a counter and a histogram.

Why not prometheus_client's Counter and Histogram: each ``inc`` and ``observe`` takes a
lock (a histogram's observe two), and minicb's listener (telemetry/prometheus.py) counts
every token and observes every inter-token gap in the engine thread: at 16 running that
was most of its cost per step (docs/performance.md, host costs). Here only the engine
thread writes, and a scrape reads each number whole under the GIL, as prometheus_client's
own collection reads each of its values one at a time.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Sequence
from functools import reduce
from itertools import repeat
from operator import add

from prometheus_client.utils import floatToGoString


class Gauge:
    """A value that goes up and down; ``set`` from any thread (one float, stored whole)."""

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


class Counter:
    """A count that only grows, per label value (``""`` when it has no label), with the
    time each label value was first seen (the ``_created`` series)."""

    def __init__(self, labelled: bool = False) -> None:
        self.values: dict[str, float] = {}
        self.created: dict[str, float] = {}
        if not labelled:  # shown from the start, at 0, as prometheus_client shows it
            self.inc(0)

    def inc(self, amount: float = 1, label: str = "") -> None:
        if label not in self.values:
            self.created[label] = time.time()
            self.values[label] = 0.0
        self.values[label] += amount


class Histogram:
    """Bucket counts and the sum of observations; ``bounds`` are the finite upper edges."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every edge (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # The first edge >= value, as prometheus_client's ``value <= bound`` walk finds it.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_all(self, values: list[float]) -> None:
        """``observe`` each of ``values`` in turn, in C: the same counts and the same sum
        (added in the same order, so to the same last bit). A step's gaps are mostly one
        value (the time since the previous step), so each distinct value finds its bucket
        once."""
        for value, count in Tally(values).items():
            self.counts[bisect_left(self.bounds, value)] += count
        self.sum = reduce(add, values, self.sum)

    def observe_repeated(self, value: float, count: int) -> None:
        """``observe(value)`` ``count`` times: the same counts, the same sum to the bit."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum = reduce(add, repeat(value, count), self.sum)

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, observations <= le) for each edge and +Inf, as the text format wants."""
        counts, total, out = list(self.counts), 0, []  # one copy: a scrape reads a snapshot
        for edge, count in zip((*self.bounds, float("inf")), counts, strict=True):
            total += count
            out.append((floatToGoString(edge), float(total)))
        return out
