"""``hf-padded``: transformers' padded ``generate`` in batches, the classic static baseline.

Each batch is left-padded to its longest prompt and generates ``max(max_tokens)`` tokens
for every row (EOS off: nothing may stop a row early); a stopping criterion that is never
true stamps the end time of every token step. Each request is credited only with the tokens
it asked for, and ends when its ``generate`` call returned. The batch is rebuilt as minicb
events (step events with padding rows, and each request's life), so it is measured by the
same ``measure_events`` as minicb.

Also here, shared with ``hf_continuous``: the model's generation config with EOS off,
``request_events`` (a request's life from times measured outside minicb), and the check
that a transformers system runs offline only.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from minicb.bench import RunRecord
from minicb.bench.driver import SLOs, run_record
from minicb.scheduler.plan import ScheduledRequest, StepPlan
from minicb.telemetry.events import (
    Event,
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    StepEvent,
    StepTokens,
)
from minicb.workload import RequestSpec, Workload

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
    ids: list[int], workload: Workload, t0: float, start: float, times: list[float], end: float
) -> list[Event]:
    """minicb events for one padded batch that started at ``start`` and returned at ``end``.
    KV is counted in one-token blocks: each row holds the padded length of its batch."""
    reqs = [workload.requests[i] for i in ids]
    width = max(len(r.prompt) for r in reqs)
    events: list[Event] = []
    for k, (prev, t) in enumerate(zip([start, *times], times, strict=False)):
        rows = []
        for i, r in zip(ids, reqs, strict=True):
            live = min(len(r.prompt) + k + 1, len(r.prompt) + r.max_tokens)
            held = list(range(width + k + 1))  # the row's padded KV, one block per token
            pad = width - len(r.prompt)
            if k == 0:
                n, chunk = len(held), width - pad
                rows.append(ScheduledRequest(i, "prefill", chunk, 0, live, held, n, True, True))
                if pad:
                    rows.append(ScheduledRequest(i, "padding", pad, 0, 0, [], 0, False, False))
            else:
                decode = k < r.max_tokens
                phase = "decode" if decode else "padding"
                n, start = len(held), width + k - 1
                rows.append(ScheduledRequest(i, phase, 1, start, live, held, n, True, decode))
        plan = StepPlan(step=k + 1, batching="padded-generate", block_size=1, scheduled=rows,
                        slots_used=len(ids), slots_limit=len(ids))  # fmt: skip
        events.append(StepEvent(plan, prev, t, schedule_s=0.0, forward_s=t - prev, sample_s=0.0))
    for i, r in zip(ids, reqs, strict=True):
        events += request_events(i, r, t0, start, times[: r.max_tokens], end)
    return events


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
