"""A page that joins late draws what an early one drew (server/frames.py's view, with the
requests server/request_history.py keeps).

A class opens the page at different moments; one who opens it between two bursts must see
the last burst, not an empty timeline. So a view carries the latest requests that ended,
as well as those still held, each with its ``history``: the step at which what its row
showed changed, and the page's phase code from there (1 prefill, 2 decode, 3 padding; not
in the batch: 0 queued, 4 preempted to recompute, 5 swapped out). Here the folder is fed
every event of an engine over FakeRunner, and each request's history is compared with
what the engine's own step events say it did, step by step. No model, no browser.
"""

from __future__ import annotations

from minicb import SamplingParams
from minicb.server import request_history
from minicb.server.frames import StepFolder
from minicb.telemetry.kv_state import KVState
from tests.helpers import fake_engine

PHASES = {"prefill": 1, "decode": 2, "padding": 3}


def folded(engine, feed):
    """A folder that hears every event of ``engine`` while ``feed(engine)`` runs it, and the
    engine's step events; made as the server makes it when a first browser joins."""
    info = {"name": "continuous", **engine.describe(), "requests": engine.live_requests()}
    folder = StepFolder(info, KVState())
    heard: list = []
    engine.bus.subscribe(heard.extend)
    feed(engine)
    folder.fold(heard, tokens=True)
    return folder, [e for e in heard if e.kind == "step"]


def truth(steps) -> dict[int, dict[int, int]]:
    """Request id -> step -> what its row showed, from the plans alone: its row's phase, or,
    out of the batch after a preemption or a swap, 4 or 5 until it was let in again."""
    waits: dict[int, int] = {}
    shown: dict[int, dict[int, int]] = {}
    for e in steps:
        plan, k = e.plan, e.plan.step
        for d in plan.preempted:
            waits[d.request_id] = 5 if d.mode == "swap" else 4
        for d in plan.swapped_out:
            waits[d.request_id] = 5
        for d in (*plan.admitted, *plan.swapped_in):
            waits.pop(d.request_id, None)
        rows = {row.request_id: PHASES[row.phase] for row in plan.scheduled}
        for rid in set(rows) | set(waits):
            shown.setdefault(rid, {})[k] = rows.get(rid) or waits[rid]
    return shown


def expand(history: list[list[int]], last: int) -> dict[int, int]:
    """A history as one code per step, from its first change to ``last``, queued steps left out."""
    cells = {}
    for i, (k, code) in enumerate(history):
        until = history[i + 1][0] - 1 if i + 1 < len(history) else last
        cells.update({s: code for s in range(k, until + 1) if code != 0})
    return cells


def test_a_view_carries_the_ended_requests_with_every_phase_their_rows_showed():
    engine = fake_engine(
        num_kv_blocks=6, block_size=4, max_num_seqs=3, preemption_mode="swap", num_swap_blocks=16
    )

    def feed(engine):
        for n in range(6):
            engine.add_request(list(range(1, 6 + n)), SamplingParams(max_tokens=4 + 2 * n))
        engine.run_until_done()

    folder, steps = folded(engine, feed)
    view = folder.view()
    ended = {r["request_id"]: r for r in view["requests"]}
    assert sorted(ended) == list(range(6)) and view["ended_total"] == 6
    assert any(e.plan.swapped_out or e.plan.preempted for e in steps), "no preemption to draw"
    finished_at = {d.request_id: e.plan.step for e in steps for d in e.plan.finished}
    shown = truth(steps)
    for rid, r in ended.items():
        assert r["end_step"] == finished_at[rid] and r["finish_reason"] == "length"
        assert r["row"] is None and r["first_token_step"] <= r["end_step"]
        assert expand(r["history"], r["end_step"]) == shown[rid], rid


def test_a_view_of_a_running_engine_draws_its_held_requests_as_far_back_as_its_steps():
    engine = fake_engine(num_kv_blocks=64, block_size=4, max_num_seqs=2)

    def feed(engine):
        for n in range(4):
            engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=3 + 4 * n))
        for _ in range(6):
            engine.step()

    folder, steps = folded(engine, feed)
    view = folder.view()
    shown, last = truth(steps), steps[-1].plan.step
    held = [r for r in view["requests"] if r.get("end_step") is None]
    assert [r["row"] for r in held] == [2, 2, None]  # two decoding, one still queued
    for r in view["requests"]:
        end = r.get("end_step") or last
        assert expand(r["history"], end) == shown.get(r["request_id"], {})


def test_a_view_keeps_the_latest_ended_and_counts_them_all(monkeypatch):
    monkeypatch.setattr(request_history, "VIEW_ENDED", 3)
    engine = fake_engine(num_kv_blocks=64, block_size=4, max_num_seqs=4)

    def feed(engine):
        for _ in range(5):
            engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
        engine.run_until_done()
        rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
        engine.step()
        engine.abort_request(rid)

    folder, steps = folded(engine, feed)
    view = folder.view()
    assert view["ended_total"] == 6
    assert [(r["request_id"], r["finish_reason"]) for r in view["requests"]] == [
        (3, "length"), (4, "length"), (5, "abort")
    ]  # fmt: skip
    assert view["requests"][-1]["end_step"] == steps[-1].plan.step


def test_a_folder_started_mid_run_gives_its_requests_their_first_step():
    """The folder starts when a first browser joins, after steps it never saw: a request
    that arrives before its first fold still starts at the engine's next step, not at the
    step a later page happens to join in."""
    engine = fake_engine(num_kv_blocks=64, block_size=4, max_num_seqs=2)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=5))
    engine.add_request([7, 8], SamplingParams(max_tokens=2))  # ends before the folder starts
    for _ in range(3):
        engine.step()

    def feed(engine):
        engine.add_request([4, 5, 6], SamplingParams(max_tokens=2))
        engine.run_until_done()

    folder, steps = folded(engine, feed)
    view = folder.view()
    late = {r["request_id"]: r for r in view["requests"]}
    assert late[2]["start_step"] == 4 and late[2]["history"][0] == [4, 1]  # prefill at 4
    assert late[0]["start_step"] == 1  # held when the folder started: the engine's own
    assert expand(late[2]["history"], late[2]["end_step"]) == truth(steps)[2]
    # request 1 ended before anyone watched: counted as finished, with no row to draw
    assert sorted(late) == [0, 2] and view["ended_total"] == 3
