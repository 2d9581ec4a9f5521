"""transformers' two systems in the suite, run on the same weights under minicb's bounds and
rebuilt as minicb events, so that one ``measure_events`` measures every system.

- ``hf-padded``: transformers' padded ``generate`` in batches, the classic static baseline.
  Each batch is left-padded to its longest prompt and generates ``max(max_tokens)`` tokens
  for every row (EOS off: nothing may stop a row early); a stopping criterion that is never
  true stamps the end time of every token step. Each request is credited only with the
  tokens it asked for, and ends when its ``generate`` call returned. The batch is rebuilt
  as minicb events (step events with padding rows, and each request's life);
- ``hf-continuous``: transformers' own continuous batching (the engine behind
  ``generate_batch``), through its manager's per-request ``add_request``, with EOS off
  (``NO_EOS``: an id that ends nothing) and minicb's limits (page size, KV blocks, token
  budget, slots), so both systems do the same work under the same bounds. The manager is
  set up and warmed up before the clock starts. Its iterations are not visible from
  outside, so its batch and KV figures stay empty; its per-token timestamps are moved to
  the wall clock and rebuilt as minicb request events.

``request_events`` rebuilds a request's life from times measured outside minicb. The
systems by name, minicb's among them, are systems.py's.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from minicb.bench import RunRecord, SLOs, run_record
from minicb.core.events import Event, StepEvent
from minicb.core.request_events import (
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    StepTokens,
)
from minicb.core.scheduler.plan import ScheduledRequest, StepPlan
from minicb.workload import RequestSpec, Workload

# ---- hf-padded: transformers' padded generate, in batches --------------------------------
PAD_ID = 0


def generation_config(
    model: Any, max_new_tokens: int, temperature: float, eos: int | None = None
) -> Any:
    """The model's generation config with EOS off (``eos``: an id that ends nothing, where
    None is not taken) and plain temperature sampling or greedy."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = eos  # lengths are forced: nothing may stop a row early
    gc.max_new_tokens = max_new_tokens
    gc.min_new_tokens = None
    gc.pad_token_id = PAD_ID
    gc.do_sample = temperature > 0
    gc.temperature = temperature if temperature > 0 else None
    gc.top_k = 0 if temperature > 0 else None  # no top-k: minicb samples the whole vocab
    gc.top_p = None
    return gc


def generate_times(
    model: Any, prompts: list[list[int]], steps: int, temperature: float
) -> list[float]:
    """One left-padded batch; returns the end time of each of its ``steps`` token steps."""
    import torch
    from transformers import StoppingCriteriaList

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding: every row's last token is real
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    times: list[float] = []

    def stamp(input_ids: Any, scores: Any, **kwargs: Any) -> Any:  # a criterion, never true
        times.append(time.time())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=generation_config(model, steps, temperature),
            stopping_criteria=StoppingCriteriaList([stamp]),
        )
    if out.shape[1] != width + steps:
        raise RuntimeError(f"generate made {out.shape[1] - width} tokens, not {steps}")
    return times


def _batch_events(
    ids: list[int], workload: Workload, t0: float, began: float, times: list[float], end: float
) -> list[Event]:
    """minicb events for one padded batch that began at ``began`` and returned at ``end``.
    KV is counted in one-token blocks: each row holds the padded length of its batch.
    Each step's rows are built by ``_padded_step_rows``, a function of its own: the batch's
    times cannot be overwritten by a name of a step's (a position once reused ``start``, the
    batch's start, and hf-padded's runs seemed to last 1.8e9 s: issue 52)."""
    reqs = [workload.requests[i] for i in ids]
    events: list[Event] = []
    for k, (prev, t) in enumerate(zip([began, *times], times, strict=False)):
        plan = StepPlan(step=k + 1, batching="padded-generate", block_size=1,
                        scheduled=_padded_step_rows(ids, reqs, k), slots_used=len(ids),
                        slots_limit=len(ids))  # fmt: skip
        events.append(StepEvent(plan, prev, t, schedule_s=0.0, forward_s=t - prev, sample_s=0.0))
    for i, r in zip(ids, reqs, strict=True):
        events += request_events(i, r, t0, began, times[: r.max_tokens], end)
    return events


def _padded_step_rows(ids: list[int], reqs: list[RequestSpec], k: int) -> list[ScheduledRequest]:
    """The rows of step ``k`` (0: the prefill) of a left-padded batch: every row runs every
    step; a row past its ``max_tokens`` is a padding row, computed and thrown away."""
    width = max(len(r.prompt) for r in reqs)
    rows = []
    for i, r in zip(ids, reqs, strict=True):
        live = min(len(r.prompt) + k + 1, len(r.prompt) + r.max_tokens)
        held = list(range(width + k + 1))  # the row's padded KV, one block per token
        kv = dict(context_len=live, block_table=held, num_blocks=len(held), store_kv=True)
        pad = width - len(r.prompt)
        if k == 0:
            rows.append(ScheduledRequest(i, "prefill", width - pad, 0, **kv, samples=True))
            if pad:
                rows.append(ScheduledRequest(i, "padding", pad, 0, 0, [], 0, False, False))
        else:
            decode = k < r.max_tokens
            position = width + k - 1  # the token this step feeds: the previous step's output
            phase = "decode" if decode else "padding"
            rows.append(ScheduledRequest(i, phase, 1, position, **kv, samples=decode))
    return rows


def offline_only(system: str, workload: Workload) -> None:
    """transformers' systems take every request at once: refuse a workload with arrivals."""
    if not workload.all_at_once:
        raise ValueError(f"{system} is run offline only (all requests at once)")


def request_events(
    rid: int, spec: RequestSpec, arrival: float, admitted: float, times: list[float], end: float
) -> list[Event]:
    """One request's life as minicb events, from times measured outside minicb."""
    n = len(spec.prompt)
    return [
        RequestArrived(
            time=arrival, request_id=rid, prompt=None, num_prompt_tokens=n,
            max_tokens=spec.max_tokens, priority=0, params={},
        ),
        RequestAdmitted(time=admitted, request_id=rid, step=0, reason="started"),
        *(StepTokens(time=t, step=0, request_ids=[rid], token_ids=[0], indexes=[j], texts=[""])
          for j, t in enumerate(times)),
        RequestFinished(
            time=end, request_id=rid, step=0, finish_reason="length", reason="returned",
            num_prompt_tokens=n, num_output_tokens=len(times), num_preemptions=0,
        ),
    ]  # fmt: skip


def run_hf_padded(
    model: Any, workload: Workload, batch_size: int, slo: SLOs = (None, None)
) -> RunRecord:
    """The workload in padded batches of ``batch_size``, in order, all arriving at once."""
    offline_only("hf-padded", workload)
    t0, n = time.time(), len(workload.requests)
    events: list[Event] = []
    for b in range(0, n, batch_size):
        ids = list(range(b, min(b + batch_size, n)))
        reqs = [workload.requests[i] for i in ids]
        start = time.time()
        steps = max(r.max_tokens for r in reqs)
        times = generate_times(model, [r.prompt for r in reqs], steps, workload.temperature)
        events += _batch_events(ids, workload, t0, start, times, time.time())
    return run_record("hf-padded", workload, events, t0, time.time(), slo)


# ---- hf-continuous: transformers' continuous batching ------------------------------------
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
