"""``minicb demo --scenario NAME`` without a browser: its engines, hello's scenario part,
the loop pausing at each narration point with the point sent to the page, the menu's
control checked like the others. Simulated scenarios only: no model, no torch."""

from __future__ import annotations

import argparse
import time

import pytest
from fastapi.testclient import TestClient

from minicb.server import demo_command
from minicb.server.lesson import PANELS
from tests.helpers import wait_for
from tests.server.conftest import control, message

NAME = "04b-recompute-vs-swap"  # simulated, and its first point fires within a few rounds


def demo_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *extra])


@pytest.fixture
def lesson_demo():
    loop, app = demo_command.build_demo(demo_args("--scenario", NAME, "--paused"))
    loop.delay_s = 0.0
    loop.start()
    try:
        yield loop, app
    finally:
        loop.stop()


def next_message(ws, kind: str, limit: int = 5000) -> dict:
    for _ in range(limit):
        msg = message(ws)
        if msg["type"] == kind:
            return msg
    raise AssertionError(f"no {kind} message came")


def test_a_lesson_waits_for_its_first_page_unless_paused():
    """Without --paused a lesson starts when the first controlling page joins, so the class
    watches it from its first iteration, not from wherever it got to meanwhile."""
    loop, app = demo_command.build_demo(demo_args("--scenario", NAME))
    loop.delay_s = 0.0
    loop.start()
    try:
        time.sleep(0.5)  # the loop's thread runs; a lesson playing alone would step now
        assert loop.paused and all(e.step_count == 0 for e in loop.engines.values())
        with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
            message(ws)  # hello: from here the page sees every iteration
            wait_for(lambda: any(e.step_count > 0 for e in loop.engines.values()))
            assert next_message(ws, "narration")["index"] == 0  # it plays to its first point
    finally:
        loop.stop()


def test_the_engines_are_the_scenarios_sides_under_the_panel_names(lesson_demo):
    loop, _ = lesson_demo
    assert tuple(loop.engines) == PANELS
    modes = [e.config.preemption_mode for e in loop.engines.values()]
    assert modes == ["recompute", "swap"]
    assert all(e.describe()["simulated"] for e in loop.engines.values())


def test_hello_describes_the_scenario_and_the_loop_pauses_at_its_first_point(lesson_demo):
    loop, app = lesson_demo
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        hello = message(ws)
        scenario = hello["scenario"]
        assert scenario["name"] == NAME and scenario["points"] == 2
        assert scenario["panels"]["left"]["side"] == "recompute"
        assert scenario["title"]["zh"] and NAME in scenario["choices"]
        assert hello["controls"]["workload"] is False  # the scenario sets the workload
        assert hello["paused"] and scenario["fired"] == []
        ws.send_json({"type": "resume"})
        point = next_message(ws, "narration")
        assert point["index"] == 0 and point["text"]["en"].startswith("The pool is full")
        assert set(point["highlight"]["panels"]) == {"left"}
        assert len(point["highlight"]["panels"]["left"]) == 12  # the group "all"
        assert point["highlight"]["blocks"] == "requests"
        assert loop.paused
        ws.send_json({"type": "resume"})
        assert next_message(ws, "narration")["index"] == 1
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:  # a page that joins later
        fired = message(ws)["scenario"]["fired"]
        assert [p["index"] for p in fired] == [0, 1]


def test_a_lesson_fixes_its_runner_no_gpu_picker_and_no_simulate(lesson_demo):
    loop, app = lesson_demo
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        assert message(ws)["simulation"] is None  # the page hides its picker
        _, reply = control(ws, type="simulate", gpu="L4", model="llama-3.1-8b")
        assert reply["type"] == "error" and f"lesson {NAME} fixes its runner" in reply["message"]
    assert all(e.describe()["runner"]["gpu"] == "A100-80GB" for e in loop.engines.values())


def test_the_menu_switches_to_another_scenario_and_refuses_unknown_ones(lesson_demo):
    loop, app = lesson_demo
    old = app.state.hub.lesson.feeder.records  # the first lesson's, by side
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        _, reply = control(ws, type="scenario", name="../../etc/passwd")
        assert reply["type"] == "error" and "name must be one of 01-" in reply["message"]
        _, reply = control(ws, type="scenario", name="02-decode-is-memory-bound")
        assert reply["type"] == "ack", reply
        assert reply["scenario"]["panels"]["right"]["side"] == "batch-64"
    limits = [loop.engines[p].config.max_num_seqs for p in PANELS]
    assert limits == [1, 64]
    seen = [len(r.steps) for r in old.values()]
    loop.call(lambda: [e.step() for e in loop.engines.values()]).result(5)
    assert [len(r.steps) for r in old.values()] == seen  # the old lesson listens no more


def test_a_free_demo_refuses_the_scenario_control():
    from minicb.driver.engine_loop import EngineLoop
    from minicb.server.app import create_app
    from tests.server.conftest import fake_engine

    loop = EngineLoop({"continuous": fake_engine()})
    app = create_app(loop, mode="demo")
    loop.start()
    try:
        with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
            assert message(ws)["scenario"] is None
            _, reply = control(ws, type="scenario", name=NAME)
            assert reply["type"] == "error" and "--scenario NAME" in reply["message"]
    finally:
        loop.stop()


def test_trace_with_a_scenario_points_to_the_export():
    with pytest.raises(ValueError, match="minicb scenario export"):
        demo_command.build_demo(demo_args("--scenario", NAME, "--trace", "x.jsonl"))


def test_an_exported_scenario_replays_with_its_narration(tmp_path, capsys):
    from minicb import cli

    trace = tmp_path / "lesson.jsonl"
    assert cli.main(["scenario", "export", NAME, "--trace", str(trace)]) == 0
    assert "replay it: minicb replay" in capsys.readouterr().out
    traces = cli.replay_traces(str(trace))
    assert set(traces) == set(PANELS)
    from minicb.server.app import create_app

    app = create_app(None, mode="replay", replay=traces)
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        scenario = message(ws)["scenario"]
    assert scenario["name"] == NAME
    assert [p["index"] for p in scenario["fired"]] == [0, 1]
    assert scenario["fired"][0]["highlight"]["panels"]["left"]


def test_check_reports_each_point_and_claim(capsys):
    from minicb import cli

    assert cli.main(["scenario", "check", NAME]) == 0
    out = capsys.readouterr().out
    assert "[0] fired after round" in out and "ok   recompute.preemptions >= 1" in out
    assert out.strip().endswith("0 problem(s)")


def test_check_names_a_broken_file(tmp_path, capsys):
    from minicb import cli

    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "bad"}', encoding="utf-8")
    assert cli.main(["scenario", "check", str(bad)]) == 2
    assert "bad.json: scenario: missing field(s)" in capsys.readouterr().err


APART = "12b-disaggregated-prefill-decode"


def test_the_menu_switches_to_a_disaggregated_lesson_with_its_roles(lesson_demo):
    """Into lesson 12b from another: a prefill engine and a decode engine, each with its
    role's scheduler, so the lesson's requests and a typed prompt cross from left to
    right; engine settings, which would rebuild plain engines, are refused with a reason."""
    loop, app = lesson_demo
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        _, reply = control(ws, type="scenario", name=APART)
        assert reply["type"] == "ack", reply
        assert reply["scenario"]["panels"]["left"]["side"] == "prefill0"
        assert reply["scenario"]["settings"] is False  # the page hides its settings form
        _, reply = control(ws, type="settings", max_num_seqs=4)
        assert reply["type"] == "error"
        assert f"lesson {APART} runs a prefill engine and a decode engine" in reply["message"]
        _, reply = control(ws, type="prompt", text="move my KV", max_tokens=5)
        assert reply["type"] == "ack" and list(reply["ids"]) == ["left"], reply
        typed, moved = None, False  # its id on the decode side; whether its KV arrived there
        for _ in range(5000):
            msg = message(ws)
            if msg["type"] == "narration":  # the lesson pauses at its points: go on
                ws.send_json({"type": "resume"})
                continue
            if msg["type"] != "frame" or msg["engine"] != "right":
                continue  # the resume's ack, the left engine's frames
            for e in msg["events"]:
                if e["type"] == "arrived" and e["max_tokens"] == 4:  # 5 less the first token
                    typed = e["request_id"]
                moved |= (
                    e["type"] == "kv_transfer"
                    and e["status"] == "done"
                    and (e["request_id"] == typed and e["from_engine"] == "prefill0")
                )
            if moved:
                break
        assert moved, "the typed prompt's KV never reached the decode engine"
        # A page that joins now still lists the transfers between the panels: the decode
        # engine's view carries its latest ones (a late joiner saw no strip before).
        with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as late:
            views = {e["name"]: e for e in message(late)["engines"]}
        arrived = views["right"]["transfers"]
        assert arrived and all(e["type"] == "kv_transfer" for e in arrived)
        assert any(e["status"] == "done" and e["request_id"] == typed for e in arrived)
        assert views["left"]["transfers"] == []  # the prefill engine receives none
    left, right = (loop.engines[p] for p in PANELS)
    assert loop.call(lambda: left.describe()["config"]["max_num_seqs"]).result(5) == 16
    assert right.describe()["runner"]["gpu"] == "H100-SXM"
