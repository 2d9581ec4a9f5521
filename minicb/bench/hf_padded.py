"""transformers' padded ``generate``, in batches: the classic static-batching baseline.

Requests are taken in arrival order, ``batch_size`` at a time. Each batch is left-padded
to its longest prompt and generates ``max(max_tokens)`` tokens for every row (no EOS, so
lengths are forced); each request is credited only with the tokens it asked for, the rest
of its row is padding. A stopping criterion that never stops stamps the time of every
step, so token times, TTFT and inter-token gaps are real; a request's end is when its
``generate`` call returned, since that is when a caller gets the result.

The run is rebuilt as minicb events (one StepEvent per step, with padding rows, and each
request's arrival, tokens and finish) and measured by minicb's MetricsCollector. KV
figures use one-token blocks: each row holds the padded length of its batch.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from minicb.bench.records import RunRecord, failed_run, measure_events
from minicb.bench.workloads import Workload
from minicb.telemetry.events import (
    Event,
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    RequestToken,
    RowInfo,
    StepEvent,
)

PAD_ID = 0


def generation_config(model: Any, max_new_tokens: int, temperature: float) -> Any:
    """The model's generation config with EOS off and plain temperature sampling or greedy."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None  # lengths are forced: nothing may stop a row early
    gc.max_new_tokens = max_new_tokens
    gc.min_new_tokens = None
    gc.pad_token_id = PAD_ID
    gc.do_sample = temperature > 0
    gc.temperature = temperature if temperature > 0 else None
    gc.top_k = 0 if temperature > 0 else None  # no top-k: minicb samples the whole vocab
    gc.top_p = None
    return gc


class _StepClock:
    """A stopping criterion that never stops: it records when each token step ended."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.times.append(time.time())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate_times(
    model: Any, prompts: list[list[int]], steps: int, temperature: float
) -> list[float]:
    """One padded batch; returns the end time of each of its ``steps`` token steps."""
    import torch
    from transformers import StoppingCriteriaList

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding: every row's last token is real
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    clock = _StepClock()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=generation_config(model, steps, temperature),
            stopping_criteria=StoppingCriteriaList([clock]),
        )
    if out.shape[1] != width + steps:
        raise RuntimeError(f"generate made {out.shape[1] - width} tokens, not {steps}")
    return clock.times


def time_hf_decode(
    model: Any, batch: int, prompt_len: int, warm: int, steps: int
) -> dict[str, float]:
    """Median seconds per decode step of padded ``generate`` with ``batch`` equal rows
    (the same prompts as ``roofline.time_decode`` gives minicb)."""
    import statistics

    prompts = [[3 + (7 * i + j) % 200 for j in range(prompt_len)] for i in range(batch)]
    times = generate_times(model, prompts, 1 + warm + steps, temperature=0.0)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)][warm:]  # decode steps
    return {"step_s": statistics.median(gaps)}


def _batch_events(
    ids: list[int], workload: Workload, t0: float, start: float, times: list[float], end: float
) -> list[Event]:
    """minicb events for one padded batch that started at ``start`` and returned at ``end``."""
    reqs = [workload.requests[i] for i in ids]
    width = max(len(r.prompt) for r in reqs)
    events: list[Event] = []
    for k, t in enumerate(times):
        rows = []
        for i, r in zip(ids, reqs, strict=True):
            live = min(len(r.prompt) + k + 1, len(r.prompt) + r.max_tokens)
            held = width + k + 1  # the padded KV row, in one-token blocks
            if k == 0:
                rows.append(RowInfo(i, "prefill", len(r.prompt), 0, live, held))
                if width > len(r.prompt):
                    rows.append(RowInfo(i, "padding", width - len(r.prompt), 0, 0, 0))
            else:
                phase = "decode" if k < r.max_tokens else "padding"
                rows.append(RowInfo(i, phase, 1, width + k - 1, live, held))
        prev = start if k == 0 else times[k - 1]
        events.append(
            StepEvent(
                index=k + 1, batching="padded-generate", wall_start=prev, wall_end=t,
                schedule_s=0.0, forward_s=t - prev, sample_s=0.0, block_size=1,
                scheduled=rows, slots_used=len(ids), slots_limit=len(ids),
            )
        )  # fmt: skip
    for i, r in zip(ids, reqs, strict=True):
        events += request_events(i, r.prompt, r.max_tokens, t0, start, times[: r.max_tokens], end)
    return events


def request_events(
    rid: int,
    prompt: list[int],
    max_tokens: int,
    arrival: float,
    admitted: float,
    token_times: list[float],
    end: float,
) -> list[Event]:
    """One request's life as minicb events, from times measured outside minicb."""
    events: list[Event] = [
        RequestArrived(
            time=arrival, request_id=rid, prompt=None, num_prompt_tokens=len(prompt),
            max_tokens=max_tokens, priority=0, params={},
        ),
        RequestAdmitted(time=admitted, request_id=rid, step=0, reason="started"),
    ]  # fmt: skip
    events += [
        RequestToken(time=t, request_id=rid, step=0, token_id=0, index=j, text="")
        for j, t in enumerate(token_times)
    ]
    events.append(
        RequestFinished(
            time=end, request_id=rid, step=0, finish_reason="length", reason="returned",
            num_prompt_tokens=len(prompt), num_output_tokens=len(token_times), num_preemptions=0,
        )
    )  # fmt: skip
    return events


def run_hf_padded(
    model: Any,
    workload: Workload,
    batch_size: int,
    ttft_slo: float | None = None,
    tpot_slo: float | None = None,
) -> RunRecord:
    """The workload in padded batches of ``batch_size``, all requests arriving at once."""
    system = "hf-padded"
    if not workload.all_at_once:
        return failed_run(system, workload.name, "padded generate is run offline only")
    t0 = time.time()
    events: list[Event] = []
    for b in range(0, len(workload.requests), batch_size):
        ids = list(range(b, min(b + batch_size, len(workload.requests))))
        reqs = [workload.requests[i] for i in ids]
        start = time.time()
        times = generate_times(
            model, [r.prompt for r in reqs], max(r.max_tokens for r in reqs), workload.temperature
        )
        end = time.time()
        events += _batch_events(ids, workload, t0, start, times, end)
    summary, steps = measure_events(events, t0, ttft_slo, tpot_slo)
    return RunRecord(system, workload.name, summary, time.time() - t0, steps)
