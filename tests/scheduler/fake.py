"""A fake runner for scheduler tests: no model, no torch; every sampled token is 7.

``drive`` plays the engine's part (schedule, update, finish, retire) so that tests can
check the scheduler's promises over thousands of random iterations in seconds.
"""

from __future__ import annotations

from minicb.config import EngineConfig
from minicb.request import Request, RequestStatus
from minicb.config import SamplingParams
from minicb.scheduler import make_scheduler
from minicb.scheduler.plan import StepPlan


def make_request(
    rid: int, prompt_len: int, max_tokens: int, priority: int = 0, arrival: float | None = None
):
    return Request(
        request_id=rid,
        prompt_token_ids=[5] * prompt_len,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        arrival_time=float(rid if arrival is None else arrival),
        priority=priority,
    )


def fake_step(scheduler) -> StepPlan:
    """One iteration with the fake runner; finishes requests that reach max_tokens."""
    plan = scheduler.schedule()
    sampled = {r.request_id: 7 for r in plan.scheduled if r.samples}
    for req in scheduler.update(plan, sampled):
        if len(req.output_token_ids) >= req.params.max_tokens:
            scheduler.finish(req, RequestStatus.FINISHED_LENGTH)
    scheduler.retire(plan)
    return plan


def new_scheduler(num_blocks: int = 64, max_model_len: int = 1024, **options):
    return make_scheduler(EngineConfig(**options), num_blocks, max_model_len)
