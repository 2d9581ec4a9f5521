"""The event schema: round trips through JSON, clear errors, a step event generated from
the StepPlan itself, and events that tell the same story as the engine's own outputs.
(That events, bus and metrics never import torch is checked in tests/test_pure_python.py.)"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    STEP_OPTIONAL_FIELDS,
    STEP_PARALLEL_FIELDS,
    STEP_TIMING_FIELDS,
    EngineReset,
    KVChanges,
    KVSnapshotEvent,
    StepEvent,
)
from minicb.core.request_events import (
    KVTransfer,
    RequestAborted,
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    RequestFirstToken,
    RequestPreempted,
    RequestRejected,
    RequestRouted,
    RequestSwappedIn,
    RequestSwappedOut,
    StepTokens,
)
from minicb.core.scheduler.plan import Decision, ScheduledRequest, StepPlan
from minicb.telemetry.event_json import from_dict, to_dict
from tests.helpers import add, fake_engine

ONE_OF_EACH = [
    KVSnapshotEvent(
        time=1.0, step=2, block_tables={4: [3], 5: [1, 2]}, swap_tables={6: [0]}, cached_blocks=[7]
    ),
    StepEvent(
        plan=StepPlan(
            step=3,
            batching="continuous",
            block_size=16,
            scheduled=[
                ScheduledRequest(4, "prefill", 12, 0, 12, [3], 1, True, True),
                ScheduledRequest(5, "decode", 1, 30, 31, [1, 2], 2, True, True),
            ],
            admitted=[Decision(4, "admitted: 12-token prompt fits")],
            preempted=[Decision(6, "preempted by swap: no blocks", "swap")],
            swapped_out=[Decision(6, "swapped out: 2 blocks")],
            swapped_in=[],
            finished=[Decision(2, "finished (stop)")],
            notes=["1 waiting: all 2 slots are taken"],
            swap_out_map=[(0, 0), (4, 1)],
            budget_used=13,
            budget_limit=512,
            slots_used=2,
            slots_limit=2,
            kv_used=3,
            kv_free=5,
            kv_total=8,
            kv_swapped=2,
            num_waiting=1,
            num_swapped=1,
            kv_ops=[["append", 4, [3]], ["swap_out", 6, [0, 1]], ["cache", None, [7]]],
        ),
        wall_start=1.5,
        wall_end=1.75,
        schedule_s=0.001,
        forward_s=0.2,
        sample_s=0.01,
    ),
    RequestArrived(
        time=1.0,
        request_id=4,
        prompt="Héllo ✓",
        num_prompt_tokens=12,
        max_tokens=8,
        priority=0,
        params={"max_tokens": 8, "stop": ["\n"]},
    ),
    RequestAdmitted(time=1.5, request_id=4, step=3, reason="admitted"),
    RequestFirstToken(time=1.75, request_id=4, step=3),
    StepTokens(
        time=1.75,
        step=3,
        request_ids=[4, 5, 5],
        token_ids=[99, 7, 8],
        indexes=[0, 3, 4],
        texts=[" wor", "", "✓"],
    ),
    RequestPreempted(time=1.5, request_id=6, step=3, mode="swap", reason="no blocks"),
    RequestSwappedOut(time=1.5, request_id=6, step=3, reason="2 blocks to CPU"),
    RequestSwappedIn(time=2.5, request_id=6, step=5, reason="2 blocks free"),
    RequestFinished(
        time=1.75,
        request_id=2,
        step=3,
        finish_reason="stop",
        reason="finished (stop)",
        num_prompt_tokens=3,
        num_output_tokens=5,
        num_preemptions=1,
    ),
    RequestAborted(time=3.0, request_id=7, num_output_tokens=2),
    RequestRejected(time=3.5, prompt=None, num_prompt_tokens=9000, error="prompt too long"),
    RequestRouted(
        time=0.5,
        request_id=4,
        replica=1,
        policy="prefix-aware",
        reason="replica 1: 96 of 128 prompt tokens cached there",
        cached_tokens=96,
    ),
    KVTransfer(
        time=0.75,
        request_id=3,
        from_engine="prefill0",
        to_engine="decode1",
        blocks=4,
        bytes=368640,
        seconds=0.012,
        status="done",
        reason="64 prompt tokens in 4 blocks",
    ),
    EngineReset(time=4.0, info={"batching": "static", "config": {"block_size": 16}, "step": 0}),
    KVChanges(
        time=4.5,
        step=9,
        kv_ops=[["free", 3, None], ["cache", None, [4, 5]]],
        kv_used=2,
        kv_free=30,
        kv_cached=2,
    ),
]


def test_every_event_type_is_covered_and_round_trips_through_json():
    assert {e.kind for e in ONE_OF_EACH} == set(EVENT_TYPES)
    for event in ONE_OF_EACH:
        data = to_dict(event)
        assert data["type"] == event.kind
        text = json.dumps(data, allow_nan=False)  # JSON-safe: no objects, no NaN
        assert from_dict(json.loads(text)) == event


def test_to_dict_does_not_share_mutable_state():
    arrived = ONE_OF_EACH[2]
    data = to_dict(arrived)
    data["params"]["max_tokens"] = 1
    assert arrived.params["max_tokens"] == 8
    step = ONE_OF_EACH[1]
    data = to_dict(step)
    data["kv_ops"][0][2].append(9)
    data["admitted"][0]["reason"] = "changed"
    assert step.plan.kv_ops[0] == ["append", 4, [3]]
    assert step.plan.admitted[0].reason == "admitted: 12-token prompt fits"
    reset = ONE_OF_EACH[-2]
    to_dict(reset)["info"]["config"]["block_size"] = 1
    assert reset.info["config"]["block_size"] == 16
    changes = ONE_OF_EACH[-1]
    to_dict(changes)["kv_ops"][1][2].append(9)
    assert changes.kv_ops[1] == ["cache", None, [4, 5]]


def test_a_step_event_is_flat_with_its_kv_changes_not_the_whole_map():
    data = to_dict(ONE_OF_EACH[1])
    assert data["type"] == "step" and data["step"] == 3 and "index" not in data
    assert "plan" not in data and data["wall_end"] == 1.75 and data["kv_used"] == 3
    assert [r["num_blocks"] for r in data["scheduled"]] == [1, 2]
    assert all("block_table" not in r for r in data["scheduled"])  # the runner's, not the event's
    assert "block_tables" not in data and "swap_tables" not in data
    assert data["kv_ops"] == [["append", 4, [3]], ["swap_out", 6, [0, 1]], ["cache", None, [7]]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "teleported", "time": 1.0}, "unknown event type 'teleported'"),
        ({"time": 1.0}, "unknown event type None"),
        ({"type": "aborted", "time": 1.0, "request_id": 1}, "lacks field(s): num_output_tokens"),
        (
            {"type": "aborted", "time": 1.0, "request_id": 1, "num_output_tokens": 0, "mood": "x"},
            "unknown field(s): mood",
        ),
        (
            {**to_dict(ONE_OF_EACH[1]), "scheduled": [{"request_id": 1}]},
            "scheduled row event lacks",
        ),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_malformed_events_are_refused_with_a_clear_message(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(data)


def test_schema_version_is_the_documented_one():
    """Bumping the version is a change of the documented schema: docs/events.md says which."""
    assert SCHEMA_VERSION == 4
    docs = (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text("utf-8")
    assert f"`minicb.core.events.SCHEMA_VERSION` is **{SCHEMA_VERSION}**" in docs


# ---- the step event is the plan ----------------------------------------------------------
RUNNER_ONLY = {"token_ids", "params", "num_output_tokens", "block_table"}  # forward inputs


@pytest.fixture(scope="module")
def real_steps(tiny_llama_dir):
    """Step events of a tiny real model run with chunked prefill and preemption by swap."""
    config = EngineConfig(
        num_kv_blocks=6,
        block_size=4,
        max_num_batched_tokens=8,
        preemption_mode="swap",
        num_swap_blocks=12,
    )
    engine = LLMEngine(tiny_llama_dir, config)
    steps = []
    engine.bus.subscribe(steps.extend, kinds=["step"])
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for prompt in (list(range(3, 14)), [20, 21, 22, 23, 24], list(range(30, 39))):
        engine.add_request(prompt, params)
    engine.run_until_done()
    return steps


def without_runner_only(event: StepEvent) -> StepEvent:
    """The event as its dict keeps it: runner-only fields at their defaults (they take part
    in dataclass equality, so a real run's event differs from its round trip by them)."""
    rows = [
        replace(r, token_ids=[], params=None, num_output_tokens=0) for r in event.plan.scheduled
    ]
    return replace(event, plan=replace(event.plan, scheduled=rows))


def test_the_step_dict_is_generated_from_the_plan(real_steps):
    plans = [e.plan for e in real_steps]
    assert any(r.phase == "prefill" and not r.samples for p in plans for r in p.scheduled)
    assert any(p.swap_out_map for p in plans) and any(p.swap_in_map for p in plans)
    marked = {f.name for f in fields(ScheduledRequest) if f.metadata.get("runner_only")}
    assert marked == RUNNER_ONLY
    step_keys = {f.name for f in fields(StepPlan)} | set(STEP_TIMING_FIELDS) | {"type"}
    step_keys |= set(STEP_OPTIONAL_FIELDS)
    row_keys = {f.name for f in fields(ScheduledRequest)} - RUNNER_ONLY
    for event in real_steps:
        data = to_dict(event)
        assert set(data) == step_keys
        for row, row_data in zip(event.plan.scheduled, data["scheduled"], strict=True):
            assert set(row_data) == row_keys
            assert row.token_ids and row.params is not None  # in the plan, not in the event
        back = from_dict(json.loads(json.dumps(data, allow_nan=False)))
        assert back == without_runner_only(event)
        assert to_dict(back) == data


def run_with_events(prompts: list[int], num_kv_blocks=64, max_tokens=4, **config):
    engine = fake_engine(num_kv_blocks, step_time=0.1, start=1000.0, **config)
    events = []
    engine.bus.subscribe(events.extend)
    for n in prompts:
        engine.add_request(list(range(1, n + 1)), SamplingParams(max_tokens, temperature=0.0))
    engine.run_until_done()
    return events


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_request_events_follow_the_plans(mode):
    config = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=4, preemption_mode=mode)
    events = run_with_events([8, 8, 8], num_kv_blocks=6, max_tokens=8, **config)
    steps = [e for e in events if e.kind == "step"]
    by_kind = lambda kind: [e for e in events if e.kind == kind]  # noqa: E731
    assert len(by_kind("arrived")) == len(by_kind("finished")) == 3
    # every decision in a step has a matching request event, stamped with that step
    for kind in ("admitted", "preempted", "swapped_out", "swapped_in"):
        planned = [(s.plan.step, d.request_id) for s in steps for d in getattr(s.plan, kind)]
        assert [(e.step, e.request_id) for e in by_kind(kind)] == planned
    assert by_kind("preempted"), "the scenario was meant to preempt"
    assert all(e.mode == mode for e in by_kind("preempted"))
    if mode == "swap":
        assert by_kind("swapped_out") and by_kind("swapped_in")
    # tokens: 8 per request, indices 0..7 in order, a first-token event with index 0; one
    # tokens event per step that gave any, with one entry per token
    assert len(by_kind("tokens")) == len({e.step for e in by_kind("tokens")})
    for rid in range(3):
        tokens = [
            (e.time, i)
            for e in by_kind("tokens")
            for r, i in zip(e.request_ids, e.indexes, strict=True)
            if r == rid
        ]
        assert [i for _, i in tokens] == list(range(8))
        first = [e for e in by_kind("first_token") if e.request_id == rid]
        assert len(first) == 1 and first[0].time == tokens[0][0]
    # request events of a step come right after its StepEvent, decisions at its start
    current = None
    for e in events:
        if e.kind == "step":
            current = e
        elif e.kind in ("admitted", "preempted", "swapped_out", "swapped_in"):
            assert e.step == current.plan.step and e.time == current.wall_start
        elif e.kind in ("tokens", "first_token", "finished"):
            assert e.step == current.plan.step and e.time == current.wall_end


def test_rows_report_phase_tokens_context_and_blocks():
    events = run_with_events([6], block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    steps = [e.plan for e in events if e.kind == "step"]
    rows = [
        (r.phase, r.num_tokens, r.start_position, r.context_len, r.block_table)
        for s in steps
        for r in s.scheduled
    ]
    assert rows == [
        ("prefill", 6, 0, 6, [0, 1]),
        ("decode", 1, 6, 7, [0, 1]),
        ("decode", 1, 7, 8, [0, 1]),
        ("decode", 1, 8, 9, [0, 1, 2]),
    ]
    assert [r.num_blocks for s in steps for r in s.scheduled] == [2, 2, 2, 3]
    assert steps[0].budget_used == 6 and steps[0].budget_limit == 8
    assert steps[0].slots_used == 1 and steps[0].slots_limit == 2
    assert steps[0].kv_used == 2 and steps[0].kv_total == 64 and steps[-1].kv_used == 0
    assert steps[0].kv_ops == [["append", 0, [0, 1]]] and ["free", 0, None] in steps[-1].kv_ops


class CharTokenizer:
    """One token per character: enough for a prompt given as text."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 256 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


def test_arrival_carries_prompt_text_and_params():
    engine = fake_engine(tokenizer=CharTokenizer())
    seen = []
    engine.bus.subscribe(seen.extend)
    params = SamplingParams(max_tokens=9, stop=["!"])
    engine.add_request("Hi there", params, priority=2, arrival_time=12.5)
    (arrived,) = seen
    assert (arrived.prompt, arrived.num_prompt_tokens, arrived.priority, arrived.time) == (
        "Hi there",
        8,
        2,
        12.5,
    )
    assert arrived.params["max_tokens"] == 9 and arrived.params["stop"] == ["!"]
    json.dumps(to_dict(arrived))


def test_rejected_and_aborted_requests():
    engine = fake_engine(num_kv_blocks=8, max_model_len=64, block_size=4)
    seen = []
    engine.bus.subscribe(seen.extend)
    with pytest.raises(ValueError):
        add(engine, 100, 4, token=1)
    rid = add(engine, 4, 4, token=1)
    engine.step()
    engine.abort_request(rid)
    engine.step()
    rejected = [e for e in seen if e.kind == "rejected"]
    assert (
        len(rejected) == 1
        and "context" in rejected[0].error
        and rejected[0].num_prompt_tokens == 100
    )
    aborted = [e for e in seen if e.kind == "aborted"]
    assert len(aborted) == 1 and aborted[0].request_id == rid and aborted[0].num_output_tokens == 1
    # the scheduler's record of the abort is in the next step; no "finished" event repeats it
    assert "aborted" in seen[-1].plan.finished[0].reason
    assert not [e for e in seen if e.kind == "finished"]


def test_a_step_event_without_the_parallel_fields_reads_as_one_rank(real_steps):
    data = to_dict(real_steps[0])
    assert data["tensor_parallel_size"] == 1 and data["collective_s"] == 0.0
    for name in STEP_PARALLEL_FIELDS:  # a trace written before they existed
        del data[name]
    event = from_dict(data)
    assert event.tensor_parallel_size == 1 and event.collective_s == 0.0


def test_a_runner_that_does_not_know_its_utilisation_says_none(real_steps):
    data = to_dict(real_steps[0])  # the model runner does not measure it (only a simulated GPU)
    assert data["bandwidth_util"] is None and data["flop_util"] is None
    assert from_dict(data).bandwidth_util is None
