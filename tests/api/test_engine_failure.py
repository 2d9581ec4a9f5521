"""A failing engine step ends the requests it held with a server_error, streaming or not
(nothing hangs), and the next requests are served; a bug behind a route answers 500 in the
OpenAI error shape."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.server.engine_loop import EngineLoop
from minicb.server.openai_api import install_openai_routes
from tests.api.conftest import tiny_engine
from tests.api.live import LOCAL, api_server

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
