"""The free demo, like a lesson, waits for its first page (``minicb demo``): the engines run
not one iteration before a page joins, so the class sees the opening from its first
iteration; any page starts a free demo (a lesson waits for its teacher's, the controlling
page: tests/scenarios/test_lesson_server.py); ``--no-wait-for-page`` starts at once, for a
server with no page; ``--paused`` stays paused until resumed. Simulated GPUs: no model."""

from __future__ import annotations

import argparse
import time

import pytest
from fastapi.testclient import TestClient

from minicb.server import demo_command
from tests.helpers import wait_for
from tests.server.conftest import message

SIMULATED = ["--simulate", "H100:llama-3.1-8b", "--no-host-time"]


def demo_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *SIMULATED, *extra])


def steps(loop) -> list[int]:
    return [e.step_count for e in loop.engines.values()]


@pytest.fixture
def started():
    """build_demo's loop and app with these options, its thread running until the test ends."""
    loops = []

    def start(*extra: str):
        loop, app = demo_command.build_demo(demo_args(*extra))
        loops.append(loop.start())
        return loop, app

    yield start
    for loop in loops:
        loop.stop()


def test_the_demo_waits_for_its_first_page_and_the_page_sees_it_from_iteration_one(started):
    loop, app = started()
    time.sleep(0.5)  # the thread runs; a demo playing alone would have stepped by now
    assert loop.paused and steps(loop) == [0, 0] and loop.feeder.sent == 0
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        hello = message(ws)
        assert hello["paused"] is False  # started by this page, before its hello
        assert [e["step"] for e in hello["engines"]] == [0, 0]  # nothing ran unseen
        wait_for(lambda: min(steps(loop)) > 0)
    assert app.state.hub.awaited == ()


def test_a_viewers_page_starts_a_free_demo_too(started):
    """A room's read-only pages are its audience: the opening plays for them."""
    loop, app = started("--api-key", "teacher", "--viewer-key", "room")
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws?key=room") as ws:
        hello = message(ws)
        assert hello["role"] == "viewer" and hello["paused"] is False
        wait_for(lambda: min(steps(loop)) > 0)


def test_no_wait_for_page_starts_at_once_as_before(started):
    loop, app = started("--no-wait-for-page")
    assert not app.state.hub.awaited
    wait_for(lambda: min(steps(loop)) > 0)  # no page: it runs anyway
    assert loop.feeder.sent > 0


def test_paused_stays_paused_when_the_first_page_opens(started):
    loop, app = started("--paused")
    with TestClient(app).websocket_connect("ws://127.0.0.1/ws") as ws:
        assert message(ws)["paused"] is True
        time.sleep(0.3)
        assert loop.paused and steps(loop) == [0, 0]


def test_the_flag_is_in_the_demos_help(capsys):
    with pytest.raises(SystemExit):
        demo_args("--help")
    assert "--no-wait-for-page" in capsys.readouterr().out
