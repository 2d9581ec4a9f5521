"""Many clients at once: 64 concurrent streams all complete and share iterations; an
abort storm (streams cut mid-way, impatient non-streaming clients) leaves no KV block in
use once idle, as /metrics shows, and the server goes on answering."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from minicb.core.events import StepEvent
from tests.api.conftest import tiny_engine
from tests.api.live import api_server, metric
from tests.helpers import wait_for

N_CLIENTS = 64


@pytest.fixture(scope="module")
def live(tiny_llama_dir):
    engine = tiny_engine(tiny_llama_dir, max_num_seqs=64, num_kv_blocks=512)
    with api_server(engine, "tiny") as server:
        yield server


def test_64_concurrent_streams_complete_and_share_iterations(live):
    steps: list[StepEvent] = []
    live.bus.subscribe(steps.extend, kinds=["step"])

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str]:
        stream = await client.completions.create(
            model="tiny",
            prompt=[3 + i % 50, 4, 5 + i % 7],
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        n, last = 0, None
        async for chunk in stream:
            n += 1
            last = chunk.choices[0].finish_reason or last
        return n, last

    async def main():
        client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(N_CLIENTS)))

    results = asyncio.run(main())
    live.bus.unsubscribe(steps.extend)
    # 12 token chunks plus the closing chunk, for every client.
    assert results == [(13, "length")] * N_CLIENTS
    decoding = [sum(r.phase == "decode" for r in s.plan.scheduled) for s in steps]
    print(f"most decodes in one step: {max(decoding)} of {N_CLIENTS}; steps: {len(steps)}")
    assert max(decoding) >= N_CLIENTS // 2, f"at most {max(decoding)} decodes shared a step"
    assert live.used_blocks() == 0


async def _cut_stream(client: httpx.AsyncClient, url: str, keep: int) -> int:
    body = {"model": "tiny", "prompt": [7, 8, 9], "max_tokens": 400, "stream": True}
    got = 0
    async with client.stream("POST", url, json={**body, "ignore_eos": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            got += line.startswith("data: ")
            if got >= keep:
                break  # leaving the block closes the connection mid-stream
    return got


IMPATIENT_TOKENS = 450  # far more than can run before the client gives up


async def _impatient(client: httpx.AsyncClient, url: str, all_arrived: threading.Event) -> None:
    """A non-streaming client that hangs up once every impatient request is in the engine
    (seen on its bus), long before any could finish: no clock decides."""
    body = {"model": "tiny", "prompt": [7, 8], "max_tokens": IMPATIENT_TOKENS}
    task = asyncio.create_task(client.post(url, json={**body, "ignore_eos": True}))
    assert await asyncio.to_thread(all_arrived.wait, 30), "the requests never arrived"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_abort_storm_frees_every_block_and_the_server_keeps_answering(live):
    url = live.url + "/v1/completions"
    arrived, all_arrived = [], threading.Event()

    def watch(events) -> None:  # in the engine thread
        arrived.extend(e.max_tokens == IMPATIENT_TOKENS for e in events)
        if sum(arrived) == 8:
            all_arrived.set()

    live.bus.subscribe(watch, kinds=["arrived"])

    async def storm():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            cut = [_cut_stream(client, url, keep=1 + i % 5) for i in range(40)]
            impatient = [_impatient(client, url, all_arrived) for _ in range(8)]
            await asyncio.gather(*cut, *impatient)

    asyncio.run(storm())
    live.bus.unsubscribe(watch)

    def idle() -> bool:  # every request of the storm has left the engine
        text = httpx.get(live.url + "/metrics").text
        return all(metric(text, f"minicb:num_requests_{s}") == 0 for s in ("running", "waiting"))

    wait_for(idle)
    page = httpx.get(live.url + "/metrics").text
    assert metric(page, "minicb:kv_cache_usage_perc") == 0.0
    assert live.used_blocks() == 0
    aborted = 'minicb:request_success_total{finished_reason="abort",model_name="tiny"}'
    assert metric(page, aborted) == 48
    body = {"model": "tiny", "prompt": [5], "max_tokens": 3, "ignore_eos": True}
    after = httpx.post(url, json=body).json()
    assert after["usage"]["completion_tokens"] == 3
    assert after["choices"][0]["finish_reason"] == "length"
