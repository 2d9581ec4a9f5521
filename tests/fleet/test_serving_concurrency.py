"""Every serving mode answers every concurrent request with exactly one engine's tokens
(issue 54, the review's H1): N = 2, 10 and 32 requests at once, half streamed, half not,
through ``serve --disaggregate 1:1``, ``--disaggregate 2:1`` and ``--replicas 2`` under
every router, in-process on the tiny model (fp32, greedy). Each request must get exactly
its ``max_tokens`` tokens, equal to one engine's greedy tokens for its prompt.

Before the fix, ``--disaggregate`` cut concurrent requests to their prefill engine's one
token (its "finished (length)" reached the stream before the stream moved to the decode
engine) or never answered them (the first token came back before the stream was opened).

One served fleet per mode (its processes' start is the cost): slow.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from minicb import LLM, SamplingParams
from minicb.cli import build_parser
from minicb.fleet.router import POLICIES
from minicb.server.serve_command import build_serve
from tests.api.live import live_server
from tests.helpers import mixed_prompts

pytestmark = pytest.mark.slow

COUNTS = (2, 10, 32)
PROMPTS = mixed_prompts(32, vocab=256, seed=54, min_len=1, max_len=40)
MAX_TOKENS = [1 + (5 * i) % 9 for i in range(32)]  # 1..9: one-token requests never move
MODES = {
    "disaggregate-1:1": ["--disaggregate", "1:1"],
    "disaggregate-2:1": ["--disaggregate", "2:1"],
    "replicas-2": ["--replicas", "2"],
}
REPLY_TIMEOUT_S = 60.0  # a request that never ends fails here, not by hanging the run


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, dtype="float32", num_kv_blocks=128)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    return [out.token_ids for out in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module", params=list(MODES))
def served(request, tiny_llama_dir):
    argv = ["serve", "--model", tiny_llama_dir, "--dtype", "float32", "--num-kv-blocks", "128",
            "--no-measure-utilisation", *MODES[request.param]]  # fmt: skip
    app, loop, fleet, name = build_serve(build_parser().parse_args(argv))
    loop.start()
    try:
        with live_server(app) as url:
            yield request.param, url, loop, fleet, name
    finally:
        fleet.close()


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, stream: bool) -> list:
    body = {"model": model, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i],
            "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "stream": stream}  # fmt: skip
    if not stream:
        reply = await client.post(url + "/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "length", choice
        return choice["token_ids"]
    ids, reasons = [], []
    async with client.stream("POST", url + "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    ids += choice.get("token_ids") or []
                    reasons.append(choice.get("finish_reason"))
    assert [r for r in reasons if r] == ["length"], reasons
    return ids


async def all_at_once(url: str, model: str, n: int) -> list:
    async with httpx.AsyncClient(timeout=REPLY_TIMEOUT_S) as client:
        return await asyncio.gather(*(one(client, url, model, i, i % 2 == 0) for i in range(n)))


@pytest.mark.parametrize("n", COUNTS)
def test_concurrent_requests_get_one_engines_tokens(served, expected, n):
    mode, url, loop, fleet, model = served
    policies = POLICIES if mode.startswith("replicas") else (None,)
    for policy in policies:
        if policy is not None:
            loop.call(lambda p=policy: fleet.set_policy(p)).result(10)
        got = asyncio.run(all_at_once(url, model, n))
        assert [len(ids) for ids in got] == MAX_TOKENS[:n], (mode, policy)
        assert got == expected[:n], (mode, policy)
