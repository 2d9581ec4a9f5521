"""``minicb serve --disaggregate 1:1`` through the command line on the default model
(SmolLM2-135M-Instruct, fp32), ten requests at once, half streamed: each gets exactly its
``max_tokens`` tokens, equal to one engine's greedy tokens (issue 54, the review's H1:
the held-out check saw 10 of 12 concurrent answers differ from one engine's). The
in-process tests on the tiny model, every mode and router, are in
test_serving_concurrency.py. Slow: the default model, two engine processes.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from minicb import SamplingParams
from tests.helpers import serve_process

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "List three primary colors:",
    "Explain what a KV cache is in one sentence.",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "Translate 'good morning' into Spanish:",
    "A recipe for pancakes starts with",
    "The largest planet in the solar system is",
]
MAX_TOKENS = [16, 12, 16, 9, 16, 14, 16, 11, 16, 7]


async def one(client: httpx.AsyncClient, url: str, i: int) -> list[int]:
    body = {"model": "SmolLM2-135M-Instruct", "prompt": PROMPTS[i], "temperature": 0,
            "max_tokens": MAX_TOKENS[i], "ignore_eos": True, "return_token_ids": True,
            "stream": i % 2 == 0}  # fmt: skip
    if not body["stream"]:
        reply = await client.post(url + "/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]
    ids: list[int] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
    return ids


async def all_at_once(url: str) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(one(client, url, i) for i in range(len(PROMPTS))))


def test_concurrent_requests_through_the_cli_get_one_engines_tokens(default_llm, tmp_path):
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    want = [out.token_ids for out in default_llm.generate(PROMPTS, params)]
    args = ["--disaggregate", "1:1", "--dtype", "float32", "--no-measure-utilisation",
            "--log-level", "warning"]  # fmt: skip
    with serve_process(args, tmp_path / "serve.log", timeout=300) as (_, url):
        got = asyncio.run(all_at_once(url))
    assert [len(ids) for ids in got] == MAX_TOKENS
    assert got == want
