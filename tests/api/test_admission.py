"""The door: a full waiting queue gives 429 with Retry-After, a missing or wrong API key
gives 401 on /v1/* and /metrics (not /health), and a body over the size bound gives 413,
checked both on the declared length and while reading a chunked upload."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from minicb.server.guard import Guard
from tests.api.conftest import tiny_engine
from tests.api.live import api_server
from tests.helpers import wait_for

KEY = "sk-test-minicb"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": "tiny", "prompt": [5, 6], "max_tokens": 3}


@pytest.fixture(scope="module")
def live(tiny_llama_dir):
    options = dict(max_waiting=2, max_body_bytes=4096, guard=Guard(api_key=KEY))
    with api_server(tiny_engine(tiny_llama_dir), "tiny", **options) as server:
        yield server


def test_a_full_queue_answers_429_with_retry_after(live):
    gate = live.app.state.openai.gate
    url = live.url + "/v1/completions"

    async def main():
        live.loop.pause()  # nothing is admitted: the first two requests stay waiting
        async with httpx.AsyncClient(headers=AUTH, timeout=20) as client:
            held = [asyncio.create_task(client.post(url, json=BODY)) for _ in range(2)]
            await asyncio.to_thread(wait_for, lambda: gate.waiting == 2)
            refused = await client.post(url, json=BODY)
            sdk = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError, match="queue is full"):
                await sdk.completions.create(**BODY)
            live.loop.resume()
            return refused, await asyncio.gather(*held)

    try:
        refused, held = asyncio.run(main())
    finally:
        live.loop.resume()
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "2 requests waiting" in error["message"]
    assert [r.status_code for r in held] == [200, 200]
    after = httpx.post(url, json=BODY, headers=AUTH)  # the queue drained: welcome again
    assert after.status_code == 200


def test_the_api_key_guards_v1_and_metrics_not_health(live):
    url = live.url + "/v1/completions"
    assert httpx.post(url, json=BODY).status_code == 401
    wrong = httpx.post(url, json=BODY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(live.url + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live.url + "/v1", api_key="nope", max_retries=0).models.list()
    good = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(**BODY).usage.prompt_tokens == 2
    assert httpx.get(live.url + "/health").status_code == 200
    assert httpx.get(live.url + "/metrics").status_code == 401  # scrapers: --metrics-public
    assert httpx.get(live.url + "/metrics", headers=AUTH).status_code == 200


def test_a_body_over_the_bound_gets_413(live):
    url = live.url + "/v1/completions"
    big = {**BODY, "user": "x" * 5000}
    declared = httpx.post(url, json=big, headers=AUTH)
    assert declared.status_code == 413 and "4096 bytes" in declared.json()["error"]["message"]

    def chunks():  # no Content-Length: the bound is found while reading
        yield b'{"model": "tiny", "user": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    chunked = httpx.post(
        url, content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    assert chunked.status_code == 413
    assert httpx.post(url, json=BODY, headers=AUTH).status_code == 200
