"""The recorded fallbacks of the 15-minute demo show what docs/teaching.md says they show.

docs/demo-traces/ holds one recorded run per part of the demo (docs/teaching.md, *If the
live demo fails*), to open with ``minicb replay FILE --serve`` when the model or the
machine lets the room down. Each test reads a trace pair back with the current reader and
checks the lesson in it from its events alone, so a schema change that breaks the files,
or a recording that does not show its lesson, fails here and not in front of a class.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minicb.telemetry.metrics import compute_metrics
from minicb.telemetry.trace_reader import read_trace

TRACES = Path(__file__).resolve().parent.parent / "docs" / "demo-traces"


def _metrics(name: str) -> dict:
    return compute_metrics(read_trace(TRACES / f"{name}.jsonl").events)


def _pair(name: str) -> tuple[dict, dict]:
    """(continuous, static) metrics of a ``minicb demo --trace`` recording."""
    return _metrics(name), _metrics(f"{name}.static")


def test_opening_static_pads_and_keeps_its_queue_waiting():
    cont, static = _pair("opening")
    assert static["batch"]["padding_waste"] > 0.1 and cont["batch"]["padding_waste"] == 0
    assert static["latency"]["ttft_s"]["p50"] > 5 * cont["latency"]["ttft_s"]["p50"]


def test_full_queue_takes_fewer_iterations_continuously():
    cont, static = _pair("full-queue")
    assert cont["requests"]["finished"] == static["requests"]["finished"] == 24
    assert static["batch"]["steps"] > 1.5 * cont["batch"]["steps"]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_small_pool_preempts_in_the_recorded_mode(mode):
    cont, static = _pair(f"memory-{mode}")
    assert cont["preemptions"][mode] > 0 and static["preemptions"]["total"] == 0
    assert cont["kv"]["peak_pool_usage"] == 1.0
    if mode == "swap":
        assert cont["preemptions"]["swapped_in"] == cont["preemptions"]["swapped_out"] > 0


def _worst_decode_gap(name: str) -> float:
    events = read_trace(TRACES / f"{name}.jsonl").events
    times = [e.time for e in events if e.kind == "tokens" for rid in e.request_ids if rid == 0]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def test_long_prompt_stalls_the_decoders_only_without_chunking():
    steps = [
        e for e in read_trace(TRACES / "long-prompt-unchunked.jsonl").events if e.kind == "step"
    ]
    whole = [e for e in steps if e.plan.budget_used >= 480]
    assert len(whole) == 1 and all(r.phase == "prefill" for r in whole[0].plan.scheduled)
    assert _worst_decode_gap("long-prompt-unchunked") > 3 * _worst_decode_gap("long-prompt-chunked")
