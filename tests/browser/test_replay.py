"""Replay in Chromium: a demo recorded with --trace, opened with ``minicb replay --serve``
(no model loaded), draws the same rows the trace describes, and the slider scrubs it."""

from collections import Counter

import pytest

from minicb.telemetry.trace_files import trace_paths
from minicb.telemetry.trace_reader import read_trace
from tests.browser.conftest import js, next_frame, server, shot, wait_for
from tests.server.conftest import receive, ws_connect

PANELS = "window.minicb.panels"


@pytest.fixture(scope="module")
def recorded(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "demo.jsonl"
    args = ["demo", "--model", tiny_llama_dir, "--max-num-seqs", "4", "--num-kv-blocks", "48"]
    args += ["--burst", "6", "--rate", "2", "--short", "3", "6", "--long", "10", "16"]
    with server(*args, "--delay", "0.02", "--trace", str(path)) as url:
        # Watch its events until each engine has finished six requests; then stopping the
        # server closes the trace files.
        finished: Counter = Counter()
        with ws_connect("ws" + url.removeprefix("http") + "ws") as ws:
            while min(finished["static"], finished["continuous"]) < 6:
                msg = receive(ws, timeout=120)
                if msg["type"] == "frame":
                    finished[msg["engine"]] += sum(e["type"] == "finished" for e in msg["events"])
    return path


def expected_rows(trace):
    """(id, first iteration it could run in, last iteration in the batch) per request."""
    rows, last_step = {}, 0
    for e in trace.events:
        if e.kind == "step":
            last_step = e.plan.step
        elif e.kind == "arrived":
            rows[e.request_id] = [e.request_id, last_step + 1, None]
        elif e.kind == "finished":
            rows[e.request_id][2] = e.step
    return sorted(rows.values())


def test_replay_draws_the_recorded_rows_and_scrubs(tab, recorded):
    page = tab
    traces = {name: read_trace(p) for name, p in trace_paths(str(recorded)).items()}
    with server("replay", str(recorded), "--serve") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2 && window.minicb.replay !== null")
        assert js(page, "document.body.className") == "replay"
        for i, name in enumerate(["static", "continuous"]):
            drawn = js(page, f"{PANELS}[{i}].model.order.map(r => [r.id, r.startStep, r.endStep])")
            want = expected_rows(traces[name])
            assert len(want) >= 6 and sorted(drawn) == want
            last = max(e.plan.step for e in traces[name].events if e.kind == "step")
            wait_for(page, f"Number({PANELS}[{i}].el.dataset.step) === {last}")
        next_frame(page)
        shot(page, "replay-end")
        end_rows = js(page, f"{PANELS}.map(p => p.timeline.rows.length)")
        page.eval_on_selector(
            "#scrub", "el => { el.value = 300; el.dispatchEvent(new Event('input')); }"
        )
        lasts = [max(e.plan.step for e in t.events if e.kind == "step") for t in traces.values()]
        wait_for(page, f"{PANELS}.every(p => Number(p.el.dataset.step) < {max(lasts)})")
        next_frame(page)
        steps = js(page, f"{PANELS}.map(p => Number(p.el.dataset.step))")
        for i, name in enumerate(["static", "continuous"]):
            last = max(e.plan.step for e in traces[name].events if e.kind == "step")
            assert 0 < steps[i] < last
        # only requests that had arrived by then are drawn
        assert js(
            page,
            f"{PANELS}.every(p => p.timeline.rows.every("
            "r => r.startStep <= Number(p.el.dataset.step)))",
        )
        assert sum(js(page, f"{PANELS}.map(p => p.timeline.rows.length)")) <= sum(end_rows)
        shot(page, "replay-scrubbed")
        assert not page.errors
