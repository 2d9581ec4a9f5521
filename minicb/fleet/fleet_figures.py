"""What a simulated fleet's figures are made of (SIMULATED): its engines' metrics merged
into one collector, and the catalogue's illustrative price of a GPU-hour and start-up time
of a replica.

A fleet's summary is the one ``MetricsCollector`` summary (the one definition of goodput),
taken over every engine's requests at once: ``merge_metrics`` keys each request by its
engine too (the engines number their requests alike) and adds up their steps. Its cost is
GPU-hours at ``gpu_price``, and an added engine serves only after ``replica_startup_s``
(weights read at the catalogue's rate). The colocated fleet (simulated.py) and the
disaggregated cluster (disaggregated.py, disagg_figures.py) share all three. Pure Python:
no torch.
"""

from __future__ import annotations

from dataclasses import fields

from minicb.cost_model.catalogue import read_catalogue
from minicb.cost_model.step_time import StepTimeModel
from minicb.telemetry.metrics import MetricsCollector


def replica_startup_s(profile: StepTimeModel) -> float:
    """Seconds from adding a replica to its first request: the catalogue's fixed start-up
    plus the weights read at its rate (illustrative: catalogue.json's ``fleet``)."""
    fleet = read_catalogue()["fleet"]
    return fleet["startup_fixed_s"] + profile.weight_bytes / (fleet["weights_gb_s"] * 1e9)


def gpu_price(profile: StepTimeModel) -> float:
    """US dollars per GPU-hour of the profile's GPU (illustrative: catalogue.json)."""
    return read_catalogue()["gpus"][profile.gpu.name]["usd_per_gpu_hour"]


def merge_metrics(collectors: list[MetricsCollector]) -> MetricsCollector:
    """One collector holding every replica's requests (keyed by replica, then by their own
    key: the engines number requests alike) and the sums of their steps."""
    merged = MetricsCollector()
    for i, c in enumerate(collectors):
        merged.requests.update({(i, *key): r for key, r in c.requests.items()})  # type: ignore[misc]
        merged.rejected += c.rejected
        for bound, pick in (("t_min", min), ("t_max", max)):
            mine, theirs = getattr(merged, bound), getattr(c, bound)
            if theirs is not None:
                setattr(merged, bound, theirs if mine is None else pick(mine, theirs))
        s, t = merged.steps, c.steps
        for f in fields(s):
            a, b = getattr(s, f.name), getattr(t, f.name)
            if isinstance(a, dict):
                setattr(s, f.name, {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}})
            elif f.name == "kv_usage_peak":
                s.kv_usage_peak = max(a, b)
            else:
                setattr(s, f.name, a + b)
    return merged
