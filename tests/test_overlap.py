"""Overlap scheduling (minicb/overlap/pipeline.py) gives the same tokens as the plain step loop.

Breadth on FakeRunner (every batching mode, chunked prefill on and off, prefix caching,
both preemption modes, aborts, a failed step), with tokens that vary by request and
index and stops at scripted places, so that a placeholder left in an output, a token
settled twice or an extra row's token that leaked would show; the real model on the tiny
Llama and, for one case, the default model (fp32 greedy against the plain loop). The
property test of the mechanism is tests/scheduler/test_overlap_machine.py.
"""

from __future__ import annotations

import time

import pytest

from minicb import LLM, EngineConfig, SamplingParams
from minicb.overlap.bookkeeping import PLACEHOLDER
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX, fake_engine, greedy_tokens
from tests.test_same_tokens_everywhere import record_plans

FAKE_CONFIGS = {
    "continuous": dict(),
    "chunk-5": dict(max_num_batched_tokens=5),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=64),
    "static": dict(batching="static", max_num_seqs=3),
    "prefix-caching": dict(enable_prefix_caching=True, max_num_batched_tokens=12),
    "recompute": dict(preemption_mode="recompute", num_kv_blocks=10),
    "swap": dict(preemption_mode="swap", num_kv_blocks=10, num_swap_blocks=40),
    "priority": dict(policy="priority", aging_steps=2, max_num_seqs=2),
}
SHARED_PREFIX = [9, 8, 7, 6, 5, 4, 3, 9]


def assert_preempted_as(plans: list, mode: str) -> None:
    """Preemption happened in ``mode`` (recompute never swaps). Not every request swapped
    out comes back: one may have stopped in the step its preempting plan overlapped."""
    modes = {d.mode for p in plans for d in p.preempted}
    assert mode in modes and (mode == "swap" or modes == {"recompute"})


def _fake_run(overlap: bool, abort_after: dict[int, int] | None = None, **options):
    """Eight requests sharing a prefix, of varied lengths, three stopped by a stop token:
    their outputs (tokens, finish reason), every token streamed per request, the plans."""
    options = dict(num_kv_blocks=64, block_size=4, max_num_seqs=4) | options
    engine = fake_engine(max_model_len=64, overlap_scheduling=overlap, **options)
    engine.runner.token_fn = lambda rid, i: 10 + (rid * 7 + i * 3) % 50
    for i in range(8):
        prompt = SHARED_PREFIX + [20 + i] * (1 + 3 * i % 11)
        rid = engine.add_request(prompt, SamplingParams(max_tokens=3 + i, temperature=0))
        if i % 3 == 1:
            engine.runner.output_lengths[rid] = 2 + i // 2  # stops before max_tokens
    outputs, streamed, plans = {}, {}, []
    abort_after = abort_after or {}
    while engine.has_unfinished():
        result = engine.step()
        plans.append(result.plan)
        for delta in result.new_tokens:
            streamed.setdefault(delta.request_id, []).append(delta.token_id)
            if len(streamed[delta.request_id]) == abort_after.get(delta.request_id):
                engine.abort_request(delta.request_id)
        outputs |= {o.request_id: (o.token_ids, o.finish_reason) for o in result.finished}
    engine.scheduler.blocks.check()
    assert engine.kv_snapshot().num_used == 0 and engine.kv_snapshot().num_swapped == 0
    assert [p.step for p in plans] == list(range(1, len(plans) + 1))  # each step reported once
    return outputs, streamed, plans


@pytest.mark.parametrize("name", FAKE_CONFIGS)
def test_same_tokens_with_overlap_on_fake_runner(name):
    options = FAKE_CONFIGS[name]
    plain = _fake_run(False, **options)
    outputs, streamed, plans = _fake_run(True, **options)
    assert outputs == plain[0]
    assert streamed == plain[1]  # no extra token ever streamed, none missing
    assert all(PLACEHOLDER not in tokens for tokens, _ in outputs.values())
    assert {reason for _, reason in outputs.values()} == {"stop", "length"}
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])
    if name == "prefix-caching":
        assert sum(p.prefix_hit_tokens for p in plans) > 0


def test_a_stopped_request_runs_one_discarded_row():
    """The cost overlap pays: a request that stops in N still has its row in N+1, computed
    and discarded (the plan says so); its output is unchanged."""
    outputs, _, plans = _fake_run(True)
    notes = [n for p in plans for n in p.notes if "discarded" in n]
    assert notes
    assert len(plans) > len(_fake_run(False)[2])  # the last stop is learnt one step late
    assert outputs == _fake_run(False)[0]


def test_aborts_with_overlap():
    """An abort between steps, while the next plan is in flight: the request streams
    nothing after it, its blocks come back, everyone else's tokens are unchanged."""
    aborts = {0: 1, 3: 2, 5: 4}
    plain = _fake_run(False, abort_after=aborts)
    outputs, streamed, _ = _fake_run(True, abort_after=aborts)
    assert outputs == plain[0] and set(outputs).isdisjoint(aborts)
    assert streamed == plain[1]
    assert all(len(streamed[rid]) == n for rid, n in aborts.items())


def test_a_failed_step_with_overlap_is_undone_and_retried():
    """The runner fails while the next plan is already made: both plans are undone (the
    placeholders taken back), and stepping again gives the same tokens as without failure."""
    engine = fake_engine(num_kv_blocks=32, block_size=4, overlap_scheduling=True)
    engine.runner.token_fn = lambda rid, i: 10 + rid + i
    real_execute, calls = engine.runner.execute, []

    def execute(plan):
        calls.append(plan.step)
        if len(calls) == 4:
            raise RuntimeError("injected")
        return real_execute(plan)

    engine.runner.execute = execute
    for n in (3, 6, 9):
        engine.add_request([5] * n, SamplingParams(max_tokens=6, temperature=0))
    outputs, failed = {}, False
    while engine.has_unfinished():
        try:
            result = engine.step()
        except RuntimeError:
            failed = True
            assert engine.strategy.in_flight is None
            assert all(PLACEHOLDER not in r.output_token_ids for r in engine.scheduler.waiting)
            continue
        outputs |= {o.request_id: o.token_ids for o in result.finished}
    assert failed
    assert outputs == {rid: [10 + rid + i for i in range(6)] for rid in range(3)}
    assert engine.kv_snapshot().num_used == 0


def test_step_events_carry_the_lanes():
    _, _, plans = _fake_run(True)
    engine = fake_engine(overlap_scheduling=True, step_time=0.5)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    events = [engine.step().event for _ in range(3)]
    for e in events:
        assert e.device_s == 0.5 and e.host_s >= e.schedule_s >= 0
        assert e.process_s is not None and e.prepare_s is not None and e.device_start is not None
    # The virtual clock moves only with the device: each step's device time starts where
    # the one before it ended (the host's work is hidden inside it).
    assert [e.device_start for e in events] == [0.0, 0.5, 1.0]


# ---- the real model ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        dict(max_num_batched_tokens=16),
        dict(batching="static", max_num_seqs=6),
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=32),
        dict(num_kv_blocks=5, preemption_mode="recompute", max_num_batched_tokens=32),
    ],
    ids=["chunk-16", "static", "swap", "recompute"],
)
def test_same_tokens_with_overlap_on_tiny_model(options, tiny_llama_dir, mixed_reference):
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        overlap_scheduling=True,
        **({"num_kv_blocks": 256, "block_size": 16} | options),
    )
    plans = record_plans(llm)
    assert greedy_tokens(llm, MIXED, MIXED_MAX) == mixed_reference
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])
    assert llm.engine.kv_snapshot().num_used == 0


def test_same_tokens_with_overlap_and_prefix_caching(tiny_llama_dir, shared_reference):
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        overlap_scheduling=True,
        enable_prefix_caching=True,
        num_kv_blocks=256,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    plans = record_plans(llm)
    assert greedy_tokens(llm, SHARED, SHARED_MAX) == shared_reference
    assert sum(p.prefix_hit_tokens for p in plans) > 0


@pytest.mark.slow
def test_same_tokens_with_overlap_on_default_model(default_llm):
    prompts = ["The capital of France is", "def add(a, b):", "1, 2, 3,"]
    expected = greedy_tokens(default_llm, prompts, 12)
    llm = LLM(dtype="float32", num_kv_blocks=64, block_size=16, overlap_scheduling=True,
              max_num_batched_tokens=8)  # fmt: skip
    assert greedy_tokens(llm, prompts, 12) == expected


def _sleeping(execute, seconds: float):
    """``execute`` that takes ``seconds`` of wall time, as a device would."""

    def run(plan):
        time.sleep(seconds)
        return execute(plan)

    return run


def test_the_perfetto_export_draws_the_host_and_device_lanes():
    """Both lanes, slices nested or in sequence on every track, overlapped steps or not."""
    from minicb.core.engine import LLMEngine
    from minicb.core.runner.fake import FakeRunner
    from minicb.telemetry.perfetto import BATCH, DEVICE_TRACK, HOST_TRACK, to_chrome_trace

    for overlap in (False, True):
        runner = FakeRunner(step_time=0.002)  # no virtual clock: the engine reads the wall
        runner.execute = _sleeping(runner.execute, 0.002)
        config = EngineConfig.from_kwargs(overlap_scheduling=overlap)
        engine = LLMEngine(config=config, runner=runner)
        events = []
        engine.bus.subscribe(events.extend, kinds=["step"])
        for n in (3, 5, 8):
            engine.add_request([4] * n, SamplingParams(max_tokens=4, temperature=0))
        engine.run_until_done()
        doc = to_chrome_trace(events)["traceEvents"]
        names = {e.get("tid"): e["args"]["name"] for e in doc if e["name"] == "thread_name"}
        assert names[HOST_TRACK].startswith("host") and names[DEVICE_TRACK].startswith("device")
        tracks: dict[int, list] = {}
        for e in doc:
            if e["ph"] == "X" and e["pid"] == BATCH:
                tracks.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        assert {s[2].split()[0] for s in tracks[DEVICE_TRACK]} >= {"forward"}
        assert {s[2].split()[0] for s in tracks[HOST_TRACK]} >= {"schedule", "process"}
        for spans in tracks.values():
            open_ends: list[int] = []
            for start, end, _ in sorted(spans, key=lambda s: (s[0], -s[1])):
                while open_ends and open_ends[-1] <= start:
                    open_ends.pop()
                assert not open_ends or end <= open_ends[-1], "slices overlap without nesting"
                open_ends.append(end)


def test_busy_s_counts_the_engines_own_calls_not_the_pauses_between_them():
    """A plan in flight while nobody steps (a paused demo) does not make the engine busy:
    busy_s, the page's own clock, leaves the pauses out, and never counts a second twice."""
    engine = fake_engine(overlap_scheduling=True, step_time=0.5)
    for n in (3, 6):
        engine.add_request([5] * n, SamplingParams(max_tokens=4, temperature=0))
    pauses = 0.0
    while engine.has_unfinished():
        event = engine.step().event
        engine.clock.advance(10.0)  # a pause between two steps
        pauses += 10.0
        assert event.busy_s <= event.wall_end - (pauses - 10.0)
    assert 0 < engine.busy_s <= engine.clock.now - pauses


def test_a_rebuilt_engine_waits_for_the_plan_in_flight_first():
    """The demo rebuilds its engines on the same runner: the old engine's plan in flight is
    finished before the new engine can run a plan of its own on the same KV cache."""
    engine = fake_engine(overlap_scheduling=True)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=8, temperature=0))
    engine.step()
    assert engine.strategy.in_flight is not None
    new = engine.rebuilt(engine.config.with_(max_num_seqs=2))
    assert engine.strategy.in_flight is None and not engine.has_unfinished()
    new.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    assert [o.token_ids for o in new.run_until_done()] == [[7, 7, 7]]
