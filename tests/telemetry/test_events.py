"""The event schema: round trips through JSON, clear errors, no torch, and events that
tell the same story as the engine's own outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minicb.config import EngineConfig
from minicb.telemetry.bus import attach
from minicb.telemetry.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    DecisionInfo,
    RequestAborted,
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    RequestFirstToken,
    RequestPreempted,
    RequestRejected,
    RequestSwappedIn,
    RequestSwappedOut,
    RequestToken,
    RowInfo,
    StepEvent,
    from_dict,
    to_dict,
)
from minicb.request import Request
from minicb.config import SamplingParams
from tests.fake_engine import FakeEngine

ONE_OF_EACH = [
    StepEvent(
        index=3,
        batching="continuous",
        wall_start=1.5,
        wall_end=1.75,
        schedule_s=0.001,
        forward_s=0.2,
        sample_s=0.01,
        block_size=16,
        scheduled=[RowInfo(4, "prefill", 12, 0, 12, 1), RowInfo(5, "decode", 1, 30, 31, 2)],
        admitted=[DecisionInfo(4, "admitted: 12-token prompt fits")],
        preempted=[DecisionInfo(6, "preempted by swap: no blocks", "swap")],
        swapped_out=[DecisionInfo(6, "swapped out: 2 blocks")],
        swapped_in=[],
        finished=[DecisionInfo(2, "finished (stop)")],
        notes=["1 waiting: all 2 slots are taken"],
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
    RequestToken(time=1.75, request_id=4, step=3, token_id=99, index=0, text=" wor"),
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
]


def test_every_event_type_is_covered_and_round_trips_through_json():
    assert {e.kind for e in ONE_OF_EACH} == set(EVENT_TYPES)
    for event in ONE_OF_EACH:
        data = to_dict(event)
        assert data["type"] == event.kind
        text = json.dumps(data, allow_nan=False)  # JSON-safe: no objects, no NaN
        assert from_dict(json.loads(text)) == event


def test_to_dict_does_not_share_mutable_state():
    arrived = ONE_OF_EACH[1]
    data = to_dict(arrived)
    data["params"]["max_tokens"] = 1
    assert arrived.params["max_tokens"] == 8


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
            {**to_dict(ONE_OF_EACH[0]), "scheduled": [{"request_id": 1}]},
            "scheduled row event lacks",
        ),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_malformed_events_are_refused_with_a_clear_message(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(data)


def test_schema_version_is_an_integer():
    assert isinstance(SCHEMA_VERSION, int) and SCHEMA_VERSION >= 1


def test_events_metrics_and_traces_never_import_torch():
    # A fresh interpreter: minicb/__init__ loads its public names lazily, so importing these
    # modules must not pull torch in (the test process itself has torch from conftest).
    modules = "minicb.telemetry.events, minicb.telemetry.metrics, minicb.telemetry.bus, minicb.telemetry.bus, "
    modules += "minicb.telemetry.trace, minicb.telemetry.trace, minicb.telemetry.metrics, minicb.telemetry.metrics"
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def run_with_events(config: EngineConfig, prompts: list[int], num_kv_blocks=64, max_tokens=4):
    engine = FakeEngine(config, [0.1] * 500, num_kv_blocks=num_kv_blocks)
    events = []
    attach(engine).subscribe(events.append)
    for n in prompts:
        engine.add_request(list(range(1, n + 1)), max_tokens=max_tokens)
    engine.run()
    return events


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_request_events_follow_the_plans(mode):
    config = EngineConfig(
        block_size=4, max_num_batched_tokens=16, max_num_seqs=4, preemption_mode=mode
    )
    events = run_with_events(config, [8, 8, 8], num_kv_blocks=6, max_tokens=8)
    steps = [e for e in events if e.kind == "step"]
    by_kind = lambda kind: [e for e in events if e.kind == kind]  # noqa: E731
    assert len(by_kind("arrived")) == len(by_kind("finished")) == 3
    # every decision in a step has a matching request event, stamped with that step
    for kind in ("admitted", "preempted", "swapped_out", "swapped_in"):
        planned = [(s.index, d.request_id) for s in steps for d in getattr(s, kind)]
        assert [(e.step, e.request_id) for e in by_kind(kind)] == planned
    assert by_kind("preempted"), "the scenario was meant to preempt"
    assert all(e.mode == mode for e in by_kind("preempted"))
    if mode == "swap":
        assert by_kind("swapped_out") and by_kind("swapped_in")
    # tokens: 8 per request, indices 0..7 in order, a first-token event with index 0
    for rid in range(3):
        tokens = [e for e in by_kind("token") if e.request_id == rid]
        assert [t.index for t in tokens] == list(range(8))
        first = [e for e in by_kind("first_token") if e.request_id == rid]
        assert len(first) == 1 and first[0].time == tokens[0].time
    # request events of a step come right after its StepEvent, decisions at its start
    current = None
    for e in events:
        if e.kind == "step":
            current = e
        elif e.kind in ("admitted", "preempted", "swapped_out", "swapped_in"):
            assert e.step == current.index and e.time == current.wall_start
        elif e.kind in ("token", "first_token", "finished"):
            assert e.step == current.index and e.time == current.wall_end


def test_rows_report_phase_tokens_context_and_blocks():
    config = EngineConfig(block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    events = run_with_events(config, [6])
    steps = [e for e in events if e.kind == "step"]
    rows = [
        (r.phase, r.num_tokens, r.start_position, r.context_len, r.num_blocks)
        for s in steps
        for r in s.scheduled
    ]
    assert rows == [
        ("prefill", 6, 0, 6, 2),
        ("decode", 1, 6, 7, 2),
        ("decode", 1, 7, 8, 2),
        ("decode", 1, 8, 9, 3),
    ]
    assert steps[0].budget_used == 6 and steps[0].budget_limit == 8
    assert steps[0].slots_used == 1 and steps[0].slots_limit == 2
    assert steps[0].kv_used == 2 and steps[0].kv_total == 64 and steps[-1].kv_used == 0


def test_arrival_carries_prompt_text_and_params():
    engine = FakeEngine(EngineConfig())
    bus = attach(engine)
    seen = []
    bus.subscribe(seen.append)
    req = Request(
        5, [1, 2, 3], SamplingParams(max_tokens=9, stop=["!"]), 12.5, priority=2, prompt="Hi there"
    )
    bus.request_arrived(req)
    (arrived,) = seen
    assert (arrived.prompt, arrived.num_prompt_tokens, arrived.priority, arrived.time) == (
        "Hi there",
        3,
        2,
        12.5,
    )
    assert arrived.params["max_tokens"] == 9 and arrived.params["stop"] == ["!"]
    json.dumps(to_dict(arrived))


def test_rejected_and_aborted_requests():
    engine = FakeEngine(EngineConfig(block_size=4), num_kv_blocks=8, max_model_len=64)
    seen = []
    attach(engine).subscribe(seen.append)
    with pytest.raises(ValueError):
        engine.add_request([1] * 100, max_tokens=4)
    rid = engine.add_request([1] * 4, max_tokens=4)
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
    assert "aborted" in seen[-1].finished[0].reason
    assert not [e for e in seen if e.kind == "finished"]
