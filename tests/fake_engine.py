"""A torch-free engine for event and metrics tests: the real scheduler, a fake runner.

Each step takes a scripted number of seconds on a fake clock, and every sampled token
is token 7, so every timestamp in the events is known in advance and metrics can be
worked out by hand. It reports to observers exactly as LLMEngine does.
"""

from __future__ import annotations

import time
from typing import Any

from minicb.config import EngineConfig
from minicb.request import RequestOutput, StepResult, TokenDelta
from minicb.request import Request
from minicb.config import SamplingParams
from minicb.scheduler import RequestRejected, make_scheduler
from minicb.request import check_stop

TOKEN = 7


class FakeEngine:
    def __init__(
        self,
        config: EngineConfig,
        step_times: list[float] | None = None,
        num_kv_blocks: int = 64,
        max_model_len: int = 256,
        start: float = 1000.0,
        step_cost: float = 0.0,
    ) -> None:
        self.config = config
        self.scheduler = make_scheduler(config, num_kv_blocks, max_model_len)
        self.max_model_len = max_model_len
        self.observers: list[Any] = []
        self.now = start
        self.step_times = list(step_times or [])
        self.step_cost = step_cost  # real seconds to burn per step (for overhead tests)
        self._next_id = 0

    def add_observer(self, observer: Any) -> None:
        self.observers.append(observer)

    def _notify(self, event: str, *args: Any) -> None:
        for obs in self.observers:
            handler = getattr(obs, event, None)
            if handler is not None:
                handler(*args)

    def add_request(
        self, prompt: list[int], max_tokens: int, arrival: float | None = None, priority: int = 0
    ) -> int:
        try:
            req = Request(
                request_id=self._next_id,
                prompt_token_ids=list(prompt),
                params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                arrival_time=self.now if arrival is None else arrival,
                priority=priority,
            )
            self.scheduler.add(req)
        except RequestRejected as err:
            self._notify("request_rejected", prompt, str(err))
            raise
        self._next_id += 1
        self._notify("request_arrived", req)
        return req.request_id

    def abort_request(self, request_id: int) -> bool:
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        req.metrics.finished_time = self.now
        self._notify("request_aborted", req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepResult:
        wall_start = self.now
        plan = self.scheduler.schedule()
        duration = self.step_times.pop(0) if self.step_times else 0.0
        if self.step_cost:
            _spin(self.step_cost)
        self.now += duration
        result = StepResult(plan=plan, wall_start=wall_start, forward_s=duration)
        sampled = {r.request_id: TOKEN for r in plan.scheduled if r.samples}
        for req in self.scheduler.update(plan, sampled):
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = self.now
            status = check_stop(req, [], self.max_model_len)
            if status is not None:
                self.scheduler.finish(req, status)
            index = len(req.output_token_ids) - 1
            result.new_tokens.append(TokenDelta(req.request_id, TOKEN, f"<{index}>", index))
        for req in self.scheduler.retire(plan):
            req.metrics.finished_time = self.now
            result.finished.append(
                RequestOutput(
                    request_id=req.request_id,
                    prompt=None,
                    prompt_token_ids=req.prompt_token_ids,
                    text="",
                    token_ids=list(req.output_token_ids),
                    finish_reason=req.finish_reason,
                    metrics=req.metrics,
                )
            )
        result.wall_end = self.now
        self._notify("step_done", result)
        return result

    def run(self) -> None:
        while self.has_unfinished():
            self.step()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
