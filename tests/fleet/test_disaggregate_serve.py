"""``minicb serve --disaggregate 1:1`` on the tiny model: the tokens through the OpenAI API
(plain and streamed) equal one engine's, each request's stream moving from the prefill
engine to the decode engine with its first token; the page's loop holds both engines; and
the combinations that do not work are refused with words naming them, before any process
starts. One served fleet for the module (two process starts)."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from minicb import LLM, SamplingParams
from minicb.cli import build_parser
from minicb.server.serve_command import build_serve, parse_disaggregate
from tests.api.live import live_server

PROMPTS = [[5, 6, 7, 8], [9, 10], [11] * 40, [5, 6, 7, 8, 1, 2]]
MAX_TOKENS = 6
OPTIONS = dict(dtype="float32", num_kv_blocks=64)


def parse(tiny_llama_dir: str, *extra: str) -> argparse.Namespace:
    argv = ["serve", "--model", tiny_llama_dir, "--dtype", "float32", "--num-kv-blocks", "64"]
    return build_parser().parse_args(argv + ["--no-measure-utilisation", *extra])


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, **OPTIONS)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    app, loop, fleet, name = build_serve(parse(tiny_llama_dir, "--disaggregate", "1:1"))
    loop.start()
    try:
        with live_server(app) as url:
            yield url, loop, fleet, name
    finally:
        fleet.close()


def body(model: str, prompt: list[int], **extra) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}  # fmt: skip


@pytest.mark.slow  # a disaggregated server of real engines (its module fixture)
def test_tokens_through_the_api_equal_one_engines(served, expected):
    url, loop, fleet, model = served
    transfers: list = []
    fleet.bus.subscribe(transfers.extend, kinds=["kv_transfer"])
    replies = [httpx.post(url + "/v1/completions", json=body(model, p), timeout=60)
               for p in PROMPTS]  # fmt: skip
    assert [r.status_code for r in replies] == [200] * len(PROMPTS)
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == expected
    assert [t.status for t in transfers].count("done") == len(PROMPTS)
    assert set(loop.engines) == {"prefill0", "decode0"}  # the page draws both


@pytest.mark.slow  # a disaggregated server of real engines (its module fixture)
def test_a_streamed_reply_carries_every_token_from_both_engines(served, expected):
    url, loop, fleet, model = served
    text = []
    with httpx.stream("POST", url + "/v1/completions",
                      json=body(model, PROMPTS[2], stream=True), timeout=60) as reply:  # fmt: skip
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:]))
    ids = [t for chunk in text for c in chunk["choices"] for t in c.get("token_ids") or []]
    assert ids == expected[2]
    assert sum(fleet.kv_used().values()) == 0


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--replicas", "2"], "--replicas 2"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2"),
        (["--batching", "static"], "--batching static"),
    ],
)
def test_combinations_that_do_not_work_are_refused_by_name(tiny_llama_dir, extra, named):
    args = parse(tiny_llama_dir, "--disaggregate", "1:1", *extra)
    with pytest.raises(ValueError, match=named):
        build_serve(args)


@pytest.mark.parametrize("text", ["1", "0:1", "1:x", "1:1:1"])
def test_a_malformed_split_is_refused(text):
    with pytest.raises(ValueError, match="P:D"):
        parse_disaggregate(text)
