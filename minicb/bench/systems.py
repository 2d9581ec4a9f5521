"""The five systems under test, built once in one process on one copy of the weights, and
how each one is run: one module for the systems the suite compares, so the baselines sit
beside what they are the baselines of.

- ``minicb-continuous``, ``minicb-static`` and ``minicb-static-sorted`` (static batches drawn
  from the queue sorted by max_tokens: static given its best chance): three
  LLMEngines whose runners share one model (same weights, dtype, device, kernels, KV pool
  size and limits), so their ratios measure scheduling and nothing else; each is run by
  the minicb driver (``run_minicb``, in ``__init__.py``);
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

transformers' runs are rebuilt as minicb events from their timestamps (``request_events``:
a request's life from times measured outside minicb), so every system is measured by the
same ``measure_events``. Here: the ``Systems`` of one suite (which runs any of the five by
name), minicb's siblings of one engine (the prefix-caching comparison among them), the KV
pool every system gets, then the two transformers systems. Threads are pinned before
anything is built.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

from minicb.bench import RunRecord, SLOs, performance_lab, run_minicb, run_record
from minicb.bench.sanity import ImplausibleFigure
from minicb.bench.workloads import MINICB, MINICB_CONFIGS, BenchPlan
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.events import Event, StepEvent
from minicb.core.request_events import (
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    StepTokens,
)
from minicb.core.runner.loader import resolve_model_path
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.plan import ScheduledRequest, StepPlan
from minicb.workload import RequestSpec, Workload


@dataclass
class Systems:
    plan: BenchPlan
    continuous: LLMEngine
    siblings: dict[str, LLMEngine]  # the other minicb systems, by name
    num_kv_blocks: int
    hf_model: Any = None
    hf_error: str | None = None

    def run(self, name: str, workload: Workload, trace_path: str | None = None) -> RunRecord:
        p, slo = self.plan, (self.plan.ttft_slo, self.plan.tpot_slo)
        if name in MINICB:
            # A fresh engine on the same weights for every run: an empty KV pool and prefix
            # cache, as each transformers run starts with. A reused engine would keep the
            # prefix cache of the warm-up and earlier repeats and skip their prompts' prefill.
            engine = sibling(self.siblings.get(name, self.continuous))
            return run_minicb(engine, workload, name, slo, trace_path)
        if self.hf_model is None:
            error = f"transformers unavailable: {self.hf_error}"
            return RunRecord(name, workload.name, error=error)
        try:
            if name == "hf-padded":
                return run_hf_padded(self.hf_model, workload, p.max_num_seqs, slo)
            return run_hf_continuous(
                self.hf_model, workload, slo, page_size=p.block_size,
                num_blocks=self.num_kv_blocks, max_batch_tokens=p.max_num_batched_tokens,
                max_requests_per_batch=p.max_num_seqs,
            )  # fmt: skip
        except ImplausibleFigure:  # a bug in the bench, not in transformers: stop the suite
            raise
        except Exception as err:  # report why, and let the rest of the suite go on
            return RunRecord(name, workload.name, error=f"{type(err).__name__}: {err}")


def sibling(engine: LLMEngine, **changes: Any) -> LLMEngine:
    """A separate engine (own KV pool, own bus) with ``changes`` to the config, whose runner
    shares ``engine``'s weights."""
    config = engine.config.with_(**changes)
    return LLMEngine(config=config, runner=engine.runner.with_config(config))


def minicb_siblings(continuous: LLMEngine) -> dict[str, LLMEngine]:
    """The other minicb systems, each a sibling of the continuous engine."""
    return {n: sibling(continuous, **c) for n, c in MINICB_CONFIGS.items() if c}


def compare_prefix_caching(
    engine: LLMEngine, workload: Workload, slo: SLOs = (None, None),
    order: tuple[str, ...] = ("off", "on"), traces: dict[str, str | None] | None = None,
    **changes: Any,
) -> dict[str, RunRecord]:  # fmt: skip
    """The workload with prefix caching off, then on (or in ``order``), on siblings of
    ``engine`` (the same weights, a fresh KV pool each, ``changes`` to the config):
    {"off": record, "on": record}, in one run; ``traces``: a trace path for either."""
    return {
        name: run_minicb(
            sibling(engine, enable_prefix_caching=name == "on", **changes),
            workload,
            f"minicb-cache-{name}",
            slo,
            (traces or {}).get(name),
        )
        for name in order
    }


def kv_blocks_for(workloads: list[Workload], slots: int, block_size: int) -> int:
    """A pool where every slot can hold the longest request of any workload: no preemption
    is forced by the pool size, so the comparison is about batching alone."""
    longest = max(max(w.prompt_lens) + max(w.output_lens) for w in workloads)
    return slots * blocks_needed(longest, block_size) + 1


def build_systems(
    model: str | None, plan: BenchPlan, workloads: list[Workload], **options: str
) -> Systems:
    """The suite's systems; ``options``: the engine's dtype and device, which every minicb
    system shares (its siblings share the runner), and ``compile="on"``: every minicb
    system on the performance lab's compiled runner (perflab.compiled), one compiled step
    shared by all, graphs included."""
    compiled = options.pop("compile", "off") == "on"
    blocks = kv_blocks_for(workloads, plan.max_num_seqs, plan.block_size)
    config = EngineConfig(
        batching="continuous", max_num_seqs=plan.max_num_seqs, **options,
        max_num_batched_tokens=plan.max_num_batched_tokens, block_size=plan.block_size,
        num_kv_blocks=blocks, num_swap_blocks=0, seed=plan.seed,  # recompute: no swap space
    )  # fmt: skip
    if compiled:
        lab = performance_lab("compiled")
        if lab is None:
            raise ValueError(
                "--compile on is the performance lab's (perflab/, beside the package in a "
                "source checkout): run minicb bench from the repository root"
            )
        continuous = lab.compiled_engine(model, config)
    else:
        continuous = LLMEngine(model, config)
    systems = Systems(plan, continuous, minicb_siblings(continuous), blocks)
    if any(s.startswith("hf-") for s in plan.systems):
        try:  # transformers' model from the same folder, in the engine's dtype and device
            from transformers import AutoModelForCausalLM

            runner = continuous.runner
            hf = AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=runner.dtype)
            systems.hf_model = hf.to(runner.device).eval()
        except Exception as err:  # the minicb half of the suite still runs
            systems.hf_error = f"{type(err).__name__}: {err}"
    return systems


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
