"""Schedulers: decide, every iteration, which requests run and how many tokens each.

Pure Python: no torch, so they can be read, tested and driven by a fake runner anywhere.
"""

from minicb.core.config import EngineConfig
from minicb.core.scheduler.base import RequestRejected, SchedulerBase
from minicb.core.scheduler.continuous import ContinuousScheduler
from minicb.core.scheduler.plan import (
    DECODE,
    PADDING,
    PREFILL,
    Decision,
    ScheduledRequest,
    StepPlan,
)
from minicb.core.scheduler.static import StaticScheduler


def make_scheduler(
    config: EngineConfig,
    num_kv_blocks: int,
    max_model_len: int,
    num_swap_blocks: int | None = None,
) -> SchedulerBase:
    cls = ContinuousScheduler if config.batching == "continuous" else StaticScheduler
    return cls(config, num_kv_blocks, max_model_len, num_swap_blocks)


__all__ = [
    "DECODE",
    "PADDING",
    "PREFILL",
    "ContinuousScheduler",
    "Decision",
    "RequestRejected",
    "ScheduledRequest",
    "SchedulerBase",
    "StaticScheduler",
    "StepPlan",
    "make_scheduler",
]
