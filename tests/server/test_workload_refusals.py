"""Bad settings get an answer, once (issue 52): a KV pool or a token budget too small for the
demo's workload is refused before any engine is rebuilt, naming the limit, and a workload
too large for the engines before it is sent; should an engine refuse the workload's
requests anyway, the feeder says so in one log line and stops re-sending its burst (it used
to count every refused burst as done and send it again at once: thousands of lines)."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from tests.api.live import LOCAL
from tests.server.conftest import control, fake_engine, message

OPENING = WorkloadSpec(preset="burst", count=8, repeat=True, lengths="mixed")


@pytest.fixture
def demo():
    engines = {"static": fake_engine("static"), "continuous": fake_engine()}
    loop = EngineLoop(engines, feeder=WorkloadFeeder(OPENING, short=(4, 12), long=(24, 48)))
    app = create_app(loop, mode="demo", model_name="fake")
    loop.start()
    with (
        TestClient(app, base_url=LOCAL) as client,
        client.websocket_connect("ws://127.0.0.1/ws") as ws,
    ):
        message(ws)  # hello
        yield ws, loop
    loop.stop()


def test_a_pool_of_two_blocks_is_refused_before_the_rebuild_naming_the_limit(demo):
    ws, loop = demo
    before = dict(loop.engines)
    events, reply = control(ws, type="settings", num_kv_blocks=2)
    assert reply["type"] == "error", reply
    text = reply["message"]
    assert "the whole pool holds 32 (2 blocks of 16)" in text and "nothing was rebuilt" in text
    assert "the workload's largest request" in text
    assert loop.engines == before  # the same engines, never rebuilt
    assert all(e.config.num_kv_blocks == 32 for e in loop.engines.values())
    assert not any(e["type"] == "reset" for _, e in events)


def test_a_budget_too_small_without_chunked_prefill_is_refused_too(demo):
    ws, loop = demo
    _, reply = control(ws, type="settings", enable_chunked_prefill=False, max_num_batched_tokens=16)
    assert reply["type"] == "error" and "max_num_batched_tokens=16" in reply["message"]
    assert all(e.config.enable_chunked_prefill for e in loop.engines.values())


def test_a_workload_too_long_for_the_pool_is_refused_and_the_old_one_kept(demo):
    ws, loop = demo
    _, reply = control(ws, type="workload", preset="burst", lengths="short", count=8)
    assert reply["type"] == "ack", reply
    _, reply = control(ws, type="settings", num_kv_blocks=4)  # 64 tokens: short ones fit
    assert reply["type"] == "ack", reply
    _, reply = control(ws, type="workload", preset="burst", lengths="long", count=8)
    assert reply["type"] == "error" and "the workload was not changed" in reply["message"]
    assert "the whole pool holds 64" in reply["message"]
    assert loop.feeder.spec.lengths == "short"


def test_requests_refused_anyway_are_said_once_and_the_burst_is_not_resent(caplog):
    """Engines built too small for the workload, past every check: the feeder's own guard."""
    engines = {"static": fake_engine("static", num_kv_blocks=1), "continuous": fake_engine()}
    feeder = WorkloadFeeder(OPENING, short=(4, 12), long=(24, 48))
    with caplog.at_level(logging.WARNING, logger="minicb.server.demo_feeder"):
        for _ in range(200):  # rounds: the old feeder re-sent the refused burst every one
            feeder(engines)
            for engine in engines.values():
                if engine.has_unfinished():
                    engine.step()
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1, len(lines)
    assert "static" in lines[0].getMessage() and "the whole pool holds 16" in lines[0].getMessage()
    assert feeder.sent == OPENING.count  # the burst once, not again and again
    assert feeder.describe()["refused"].startswith("static: ")
    feeder.configure(OPENING)  # a new workload (or a rebuild) tries again
    assert feeder.refused is None
