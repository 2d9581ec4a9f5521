"""A load that ramps up and down, and when a run was over its targets (SIMULATED runs).

An autoscaler is judged on a load that changes: ``ramp_times`` draws one that climbs to a
peak and falls back, so a scaler must both add engines in time and give them back after.
A run's averages hide the minutes it spent over its targets while engines were starting;
``over_target`` bins the requests by when they arrived and says which bins' p90 TTFT or
TPOT was over the target, and for how long. The planner reproduction
(fleet_reproductions.py) and notebook 15 use both. Pure Python: no torch.
"""

from __future__ import annotations

import random
from typing import Any

from minicb.core.latency import percentile, tpot, ttft


def ramp_times(low: float, peak: float, duration: float, seed: int) -> list[float]:
    """Arrival times of a Poisson load whose rate climbs from ``low`` to ``peak`` req/s
    over the first half of ``duration`` and falls back over the second (drawn at the peak
    rate and each kept with probability rate(t) / peak: thinning)."""
    rng, t, times = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return times
        rate = low + (peak - low) * (1 - abs(2 * t / duration - 1))
        if rng.random() < rate / peak:
            times.append(t)


def over_target(
    journeys: list[tuple[float, list[float]]], bin_s: float, ttft_s: float, tpot_s: float
) -> dict[str, Any]:
    """Per ``bin_s`` of arrival time, the p90 TTFT and TPOT of the requests that arrived
    then (``journeys``: each request's arrival and its tokens' times), the bins whose p90
    was over each target (``ttft_s``, ``tpot_s``), and the share of requests that met each
    target."""
    bins: dict[int, list[tuple[float, float]]] = {}
    for arrival, times in journeys:
        late = tpot(times[0], times[-1], len(times)) if len(times) > 1 else 0.0
        bins.setdefault(int(arrival // bin_s), []).append((ttft(arrival, times[0]), late))
    series = {"t": [], "ttft_p90_s": [], "tpot_p90_s": []}
    for b in sorted(bins):
        series["t"].append(b * bin_s)
        for i, key in enumerate(("ttft_p90_s", "tpot_p90_s")):
            series[key].append(percentile(sorted(x[i] for x in bins[b]), 90))
    every = [x for rows in bins.values() for x in rows]
    out: dict[str, Any] = {"series": series}
    for i, (key, target) in enumerate((("ttft", ttft_s), ("tpot", tpot_s))):
        over = [t for t, v in zip(series["t"], series[f"{key}_p90_s"], strict=True) if v > target]
        out[f"{key}_over_s"] = len(over) * bin_s
        out[f"{key}_over_at"] = over
        out[f"{key}_met"] = sum(x[i] <= target for x in every) / len(every)
    return out
