"""The host's time per step beside the device's: the idle gaps, and what overlap recovers.

The step-time model (step_time.py) predicts the device's seconds of a step. The host's
work around it (scheduling, preparing inputs, processing outputs) is modelled here, per
step and per row:

    host_s(rows) = per_step_s + per_row_s x rows

Without overlap a step takes host + device, and the device idles host / (host + device) of
the time; with overlap scheduling (minicb/overlap/pipeline.py) the host plans step N+1 while the
device runs N, so a step takes max(host, device) and the device idles only where the host
is the longer. ``replay`` applies both to the device times of a simulated run (the real
scheduler on a simulated GPU; ``idle_gaps.py`` does it at a GPU's scale): a prediction,
never a measurement. ``step_lanes`` does the same one step at a time, for SimulatedRunner
(its ``host``), so that a simulated engine's step events carry the host's lane and the
device's idle gaps on the virtual clock: the simulated demo draws them live (``minicb demo
--simulate GPU:MODEL``, with ``--overlap-scheduling`` to see what overlap recovers).

Two calibrations:

- ``measure_engine_host_time``: this engine's own host work, measured on this machine:
  the real scheduler, block manager, token bookkeeping and step events over ``FakeRunner``
  (no model: its forward costs nothing), at batches of decodes, ``schedule_s + process_s``
  per step (the step event's lanes), a least-squares line through the medians.
- ``published_host_time``: vLLM v0.5.3 serving Llama 3 8B on one H100, as its v0.6.0
  post profiled it (blog.vllm.ai, 2024-09-05): the HTTP API server 33 % of the time,
  scheduling and input preparation 29 %, the GPU 38 %. Everything but the GPU ran on the
  same process in turn, so host = 62/38 of the device's time; charged per row (gathering
  results, detokenizing, streaming and preparing each request is what grows with the
  batch), at the batch of the run it is applied to. An assumption, said as one.

Pure Python: no torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VLLM_V053_SHARES = {"api_server": 0.33, "scheduling": 0.29, "gpu": 0.38}  # the post's split


@dataclass(frozen=True)
class HostTime:
    """Seconds of host work of a step of ``rows`` rows: ``per_step_s + per_row_s x rows``."""

    name: str
    per_step_s: float
    per_row_s: float
    source: str  # where the numbers come from, in words
    schedule_share: float = 0.5  # of the host's seconds, scheduling (the rest: outputs)

    def seconds(self, rows: int) -> float:
        return self.per_step_s + self.per_row_s * rows


def step_lanes(
    host: HostTime, rows: int, device_s: float, overlap: bool
) -> tuple[float, tuple[float, float, float]]:
    """One step of ``rows`` rows and ``device_s`` device seconds: its seconds on the clock
    and its lanes (schedule_s, device_wait_s, process_s). Without overlap the device waits
    while the host schedules and starts after it; the host processes the outputs after the
    device. With overlap the host schedules the next step and processes the previous one
    while the device computes this one (the lanes draw them in this step's span), and the
    step lasts the longer of the two."""
    h = host.seconds(rows)
    schedule_s, process_s = h * host.schedule_share, h * (1 - host.schedule_share)
    if overlap:
        return max(h, device_s), (schedule_s, 0.0, process_s)
    return h + device_s, (schedule_s, schedule_s, process_s)


def measure_engine_host_time(batches: Iterable[int] = (8, 64, 256), steps: int = 20) -> HostTime:
    """This engine's host work per step on this machine (the module docstring)."""
    from minicb.core.config import EngineConfig, SamplingParams
    from minicb.core.engine import LLMEngine
    from minicb.core.runner.fake import FakeRunner
    from minicb.telemetry.metrics import MetricsCollector

    points, shares = [], []
    for batch in batches:
        config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, batch))
        runner = FakeRunner(num_kv_blocks=batch * 8, max_model_len=512)
        engine = LLMEngine(config=config, runner=runner)
        engine.bus.subscribe(MetricsCollector())  # a listener: the events are built
        for i in range(batch):
            engine.add_request([5 + i % 50] * 8, SamplingParams(max_tokens=steps + 4))
        engine.step()  # the prefills
        seconds, scheduling = [], []
        for _ in range(steps):
            e = engine.step().event
            seconds.append(e.schedule_s + (e.process_s or 0.0))
            scheduling.append(e.schedule_s)
        points.append((batch, statistics.median(seconds)))
        shares.append(statistics.median(scheduling) / max(points[-1][1], 1e-12))
    per_row, per_step = _line(points)
    return HostTime(
        "minicb on this machine",
        max(0.0, per_step),
        per_row,
        "measured: schedule_s + process_s of decode steps over FakeRunner, batches "
        + ", ".join(str(b) for b, _ in points)
        + f" ({time.strftime('%Y-%m-%d')})",
        min(1.0, statistics.median(shares)),
    )


def published_host_time(device_s: float, rows: float) -> HostTime:
    """vLLM v0.5.3's host share (the module docstring), for steps of ``device_s`` device
    seconds at ``rows`` rows: host = (api_server + scheduling) / gpu x device, per row."""
    s = VLLM_V053_SHARES
    host = (s["api_server"] + s["scheduling"]) / s["gpu"] * device_s
    return HostTime(
        "vLLM v0.5.3, Llama 3 8B on one H100 (its v0.6.0 post)",
        0.0,
        host / max(rows, 1.0),
        "published split: API server 33 %, scheduling 29 %, GPU 38 %; per row at the "
        f"run's mean batch of {rows:.0f} rows",
    )


def replay(steps: list[tuple[float, int]], host: HostTime) -> dict[str, Any]:
    """A run's (device seconds, rows) per step, without and with overlap scheduling: the
    seconds, the device's idle share, and the speed-up overlap gives. With overlap the
    first step's host work has nothing to hide behind."""
    device = sum(d for d, _ in steps)
    hosts = [host.seconds(rows) for _, rows in steps]
    serial = device + sum(hosts)
    overlapped = sum(max(h, d) for h, (d, _) in zip(hosts, steps, strict=True))
    overlapped += hosts[0] if hosts else 0.0
    return {
        "host": host.name,
        "steps": len(steps),
        "device_s": device,
        "host_s": sum(hosts),
        "serial_s": serial,
        "overlapped_s": overlapped,
        "idle_serial": 1 - device / serial if serial else 0.0,
        "idle_overlapped": 1 - device / overlapped if overlapped else 0.0,
        "speedup": serial / overlapped if overlapped else 1.0,
    }


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares: (slope, intercept) of y = slope x + intercept."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return slope, my - slope * mx
