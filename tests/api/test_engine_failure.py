"""A failing engine step ends the requests it held with a server_error, streaming or not
(nothing hangs), and the next requests are served; a bug behind a route answers 500 in the
OpenAI error shape. An event listener that always raises (a trace on a full disk) is
dropped, not fatal; an engine thread that dies anyway fails every waiting and later
request at once (503); /health is not ok while steps fail, and /metrics counts them."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.driver.engine_loop import EngineLoop
from minicb.server.openai_api import install_openai_routes
from tests.api.conftest import tiny_engine
from tests.api.live import LOCAL, api_server, metric

BODY = {"model": "tiny", "prompt": [5, 6], "max_tokens": 4, "ignore_eos": True}


@pytest.fixture
def live(tiny_llama_dir):
    with api_server(tiny_engine(tiny_llama_dir), "tiny") as server:
        yield server


def _fail_next_step(engine) -> None:
    real = engine.runner.execute

    def once(plan):
        engine.runner.execute = real
        raise RuntimeError("simulated kernel failure")

    engine.runner.execute = once


def test_a_failed_step_answers_500_then_serves_again(live):
    url = live.url + "/v1/completions"
    _fail_next_step(live.engine)
    broken = httpx.post(url, json=BODY, timeout=10)
    assert broken.status_code == 500
    error = broken.json()["error"]
    assert error["type"] == "server_error" and "simulated kernel failure" in error["message"]
    assert httpx.post(url, json=BODY, timeout=10).json()["usage"]["completion_tokens"] == 4


def test_a_failed_step_ends_a_stream_with_an_error_event(live):
    url = live.url + "/v1/completions"
    _fail_next_step(live.engine)
    text = httpx.post(url, json={**BODY, "stream": True}, timeout=10).text
    events = [e for e in text.split("\n\n") if e]
    assert "simulated kernel failure" in events[-2] and '"server_error"' in events[-2]
    assert events[-1] == "data: [DONE]"
    assert live.used_blocks() == 0


def test_a_bug_behind_a_route_answers_500_in_the_openai_shape(monkeypatch):
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=16), runner=FakeRunner(num_kv_blocks=16))
    app = FastAPI()
    routes = install_openai_routes(app, EngineLoop({"api": engine}), "api", "fake")

    async def bug(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(routes, "_read", bug)
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as client:
        r = client.post("/v1/completions", json={"model": "fake", "prompt": [5]})
    assert r.status_code == 500
    error = {"message": "internal error: RuntimeError", "type": "server_error"}
    assert r.json() == {"error": {**error, "param": None, "code": None}}


def fake_api_engine() -> LLMEngine:
    return LLMEngine(config=EngineConfig(num_kv_blocks=16), runner=FakeRunner(num_kv_blocks=16))


FAKE_BODY = {"model": "fake", "prompt": [5, 6], "max_tokens": 4, "ignore_eos": True}


def test_a_listener_that_always_raises_is_dropped_and_the_server_answers():
    engine = fake_api_engine()

    def full_disk(events):
        raise OSError(28, "No space left on device")

    engine.bus.subscribe(full_disk)
    with api_server(engine, "fake") as live:
        for _ in range(3):  # before: a 500, then the engine thread died and every call hung
            reply = httpx.post(live.url + "/v1/completions", json=FAKE_BODY, timeout=5)
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(live.url + "/health", timeout=5).status_code == 200


class ThreadKiller(BaseException):
    """Escapes every ``except Exception``: what a bug past every guard looks like."""


def test_a_dead_engine_thread_fails_waiting_and_new_requests_at_once():
    engine = fake_api_engine()

    def die(plan):
        raise ThreadKiller("the engine thread is gone")

    engine.runner.execute = die
    with api_server(engine, "fake") as live:
        url = live.url + "/v1/completions"
        ended = httpx.post(url, json={**FAKE_BODY, "stream": True}, timeout=5).text
        assert "the engine thread died" in ended and ended.endswith("data: [DONE]\n\n")
        assert not live.loop.alive
        for _ in range(3):  # no wait for a thread that is gone
            refused = httpx.post(url, json=FAKE_BODY, timeout=5)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "engine_stopped"
        assert httpx.get(live.url + "/health", timeout=5).status_code == 503
        assert httpx.get(live.url + "/metrics", timeout=5).status_code == 200


def test_health_is_not_ok_while_steps_fail_and_metrics_count_them():
    engine = fake_api_engine()
    real = engine.runner.execute

    def broken(plan):
        raise RuntimeError("tensor-parallel worker rank 1 exited with code 1")

    engine.runner.execute = broken
    with api_server(engine, "fake") as live:
        url = live.url + "/v1/completions"
        assert httpx.get(live.url + "/health").status_code == 200  # nothing failed yet
        for _ in range(2):
            assert httpx.post(url, json=FAKE_BODY, timeout=5).status_code == 500
        health = httpx.get(live.url + "/health")
        assert health.status_code == 503 and health.json()["failed_steps"] == 2
        text = httpx.get(live.url + "/metrics").text
        assert metric(text, "minicb:engine_failed_steps_total") == 2
        assert 'error="internal error: RuntimeError: tensor-parallel worker rank 1' in text
        engine.runner.execute = real  # the fault is gone: the next step succeeds
        assert httpx.post(url, json=FAKE_BODY, timeout=5).status_code == 200
        assert httpx.get(live.url + "/health").status_code == 200
