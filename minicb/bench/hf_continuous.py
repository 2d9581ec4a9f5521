"""transformers' own continuous batching, the engine behind ``model.generate_batch``.

``generate_batch(inputs, max_new_tokens=...)`` takes one ``max_new_tokens`` for every
prompt, so it cannot force per-request lengths. It is a thin wrapper over
``continuous_batching_context_manager`` (itself over ``init_continuous_batching``), whose
manager's ``add_request`` takes ``max_new_tokens`` and ``eos_token_id`` per request: we
use that, with EOS off (-1), and the same limits as minicb (requests per batch, tokens
per batch, page size). The manager's set-up and warm-up happen before the clock starts.

Timestamps come from the manager (``record_timestamps``: one per token, plus when each
request was created, scheduled and finished, on ``time.perf_counter``); they are moved to
the wall clock and rebuilt as minicb request events, so the figures are computed exactly
as minicb's are. Its iterations are not visible from outside, so batch and KV figures are
left empty.
"""

from __future__ import annotations

import time
from typing import Any

from minicb.bench.hf_padded import generation_config, request_events
from minicb.bench.records import RunRecord, failed_run, measure_events
from minicb.bench.workloads import Workload
from minicb.telemetry.events import Event

NO_EOS = -1
RUN_DEADLINE_S = 1800.0  # give up on a run that stalls


def run_hf_continuous(
    model: Any,
    workload: Workload,
    max_num_seqs: int,
    max_batch_tokens: int,
    page_size: int,
    num_blocks: int,
    ttft_slo: float | None = None,
    tpot_slo: float | None = None,
) -> RunRecord:
    system = "hf-continuous"
    if not workload.all_at_once:
        return failed_run(
            system, workload.name, "transformers' continuous batching is run offline only"
        )
    from transformers import ContinuousBatchingConfig

    gen = generation_config(model, max(workload.output_lens), workload.temperature)
    gen.eos_token_id = NO_EOS
    cb = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_num_seqs,
    )
    try:
        with model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cb
        ) as manager:
            t0 = time.time()
            results = _submit_and_collect(manager, workload)
    except Exception as err:  # report why, and let the rest of the suite go on
        return failed_run(system, workload.name, f"{type(err).__name__}: {err}")
    offset = time.time() - time.perf_counter()  # perf_counter stamps -> wall clock
    events: list[Event] = []
    end = t0
    for i, spec in enumerate(workload.requests):
        r = results[f"r{i}"]
        if len(r.generated_tokens) != spec.max_tokens:
            return failed_run(
                system,
                workload.name,
                f"request {i} got {len(r.generated_tokens)} tokens, asked {spec.max_tokens}",
            )
        finished = r.lifespan[1] + offset if r.lifespan[1] > 0 else r.timestamps[-1] + offset
        end = max(end, finished)
        stamps = [t + offset for t in r.timestamps]
        admitted = r.lifespan[0] + offset if r.lifespan[0] > 0 else stamps[0]
        events += request_events(
            i, spec.prompt, spec.max_tokens, r.created_time + offset, admitted, stamps, finished
        )
    summary, _ = measure_events(events, t0, ttft_slo, tpot_slo)
    return RunRecord(system, workload.name, summary, end - t0)


def _submit_and_collect(manager: Any, workload: Workload) -> dict[str, Any]:
    for i, spec in enumerate(workload.requests):
        manager.add_request(
            list(spec.prompt),
            request_id=f"r{i}",
            max_new_tokens=spec.max_tokens,
            record_timestamps=True,
            eos_token_id=NO_EOS,
        )
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
