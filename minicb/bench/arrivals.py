"""When a workload's requests arrive, as in vLLM's ``bench serve``.

All at once, or gaps drawn from a gamma of shape ``burstiness`` and scale
``1 / (rate * burstiness)``, so their mean is ``1 / rate`` whatever the burstiness and
their squared coefficient of variation is ``1 / burstiness``. Burstiness 1 is a Poisson
process; below 1 requests come in bursts, above 1 more evenly. The first request arrives
at time 0. ``Workload.with_arrivals`` gives a workload these times. Pure Python.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate


def arrival_times(
    n: int, rate: float | None = None, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """``n`` arrival times in seconds from the start; ``rate`` None or inf: all at 0."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if rate is None or math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"rate must be positive (requests per second), got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rng = random.Random(seed)
    gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n - 1)]
    return list(accumulate(gaps, initial=0.0))[:n]


def describe_arrivals(rate: float | None, burstiness: float = 1.0, seed: int = 0) -> str:
    if rate is None or math.isinf(rate):
        return "all at once"
    if burstiness == 1.0:
        return f"Poisson at {rate:g} req/s (seed {seed})"
    return f"gamma at {rate:g} req/s, burstiness {burstiness:g} (seed {seed})"
