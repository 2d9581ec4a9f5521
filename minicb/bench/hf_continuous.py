"""``hf-continuous``: transformers' own continuous batching (the engine behind
``generate_batch``), through its manager's per-request ``add_request``.

EOS is off (``NO_EOS``: an id that ends nothing) and the limits are minicb's (page size,
KV blocks, token budget, slots), so both systems do the same work under the same bounds.
The manager is set up and warmed up before the clock starts. Its iterations are not
visible from outside, so its batch and KV figures stay empty; its per-token timestamps are
moved to the wall clock and rebuilt as minicb request events, measured like minicb's.
"""

from __future__ import annotations

import time
from typing import Any

from minicb.bench import RunRecord
from minicb.bench.driver import SLOs, run_record
from minicb.bench.hf_padded import generation_config, offline_only, request_events
from minicb.telemetry.events import Event
from minicb.workload import Workload

NO_EOS = -1  # transformers' continuous batching: no token ends a request
RUN_DEADLINE_S = 1800.0  # give up on a transformers run that stalls


def run_hf_continuous(
    model: Any, workload: Workload, slo: SLOs = (None, None), **limits: int
) -> RunRecord:
    """The workload through transformers' continuous batching manager (set up and warmed up
    before the clock starts) under ``limits`` (``ContinuousBatchingConfig``'s page_size,
    num_blocks, max_batch_tokens, max_requests_per_batch); its ``record_timestamps``
    (``time.perf_counter``: one per token, and when each request was created, scheduled and
    finished) are moved to the wall clock and rebuilt as minicb request events."""
    from transformers import ContinuousBatchingConfig

    offline_only("hf-continuous", workload)
    gen = generation_config(model, max(workload.output_lens), workload.temperature, NO_EOS)
    cb = ContinuousBatchingConfig(**limits)
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb
    ) as manager:
        t0 = time.time()
        results = _submit_and_collect(manager, workload)
    offset = time.time() - time.perf_counter()  # perf_counter stamps -> wall clock
    events: list[Event] = []
    end = t0
    for i, spec in enumerate(workload.requests):
        r = results[f"r{i}"]
        if len(r.generated_tokens) != spec.max_tokens:
            raise RuntimeError(
                f"request {i} got {len(r.generated_tokens)} tokens, asked {spec.max_tokens}"
            )
        stamps = [t + offset for t in r.timestamps]
        finished = r.lifespan[1] + offset if r.lifespan[1] > 0 else stamps[-1]
        admitted = r.lifespan[0] + offset if r.lifespan[0] > 0 else stamps[0]
        end = max(end, finished)
        events += request_events(i, spec, r.created_time + offset, admitted, stamps, finished)
    return run_record("hf-continuous", workload, events, t0, end, slo)


def _submit_and_collect(manager: Any, workload: Workload) -> dict[str, Any]:
    for i, spec in enumerate(workload.requests):
        manager.add_request(
            list(spec.prompt), request_id=f"r{i}", max_new_tokens=spec.max_tokens,
            record_timestamps=True, eos_token_id=NO_EOS,
        )  # fmt: skip
    results: dict[str, Any] = {}
    deadline = time.time() + RUN_DEADLINE_S
    while len(results) < len(workload.requests):
        result = manager.get_result(timeout=1.0)
        if result is not None and result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            results[result.request_id] = result
        elif result is None and (not manager.is_running() or time.time() > deadline):
            raise RuntimeError(f"the manager stopped with {len(results)} results")
    return results
