"""Completions with token-id prompts on the tiny model (no tokenizer), through the official
openai client: the tokens equal the offline engine's, streaming and not, and the small
routes (/v1/models, /health, /metrics) answer."""

from __future__ import annotations

import httpx
import openai
import pytest

from minicb import LLM, SamplingParams
from tests.api.live import metric

PROMPTS = [[5, 6, 7, 8], [9, 10], [11] * 12]


@pytest.fixture(scope="module")
def offline(tiny_llama_dir):
    return LLM(tiny_llama_dir, dtype="float32", num_kv_blocks=64)


@pytest.fixture(scope="module")
def expected(offline):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in offline.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def client(tiny_api):
    return openai.OpenAI(base_url=tiny_api.url + "/v1", api_key="unused", max_retries=0)


def _ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_non_streaming_tokens_equal_the_offline_engine(client, expected):
    for prompt, want in zip(PROMPTS, expected, strict=True):
        out = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        choice = out.choices[0]
        assert _ids(choice) == want
        assert choice.finish_reason == "length"
        assert out.object == "text_completion" and out.model == "tiny"
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt), 6)
        assert out.usage.total_tokens == len(prompt) + 6


def test_streaming_tokens_equal_the_offline_engine_and_usage_comes_last(client, expected):
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    chunks = list(stream)
    ids = [t for c in chunks if c.choices for t in _ids(c.choices[0])]
    assert ids == expected[0]
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("max_tokens, reason", [(3, "length"), (40, "stop")])
def test_batch_form_with_one_prompt_stops_where_the_offline_engine_does(
    client, offline, max_tokens, reason
):
    """eos honoured: this prompt's greedy tokens reach eos after 39 tokens on the tiny model,
    so 3 ends on "length" and 40 on "stop", as offline."""
    want = offline.generate([PROMPTS[1]], SamplingParams(max_tokens=max_tokens, temperature=0))
    assert want[0].finish_reason == reason
    out = client.completions.create(
        model="tiny",
        prompt=[PROMPTS[1]],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert out.choices[0].finish_reason == want[0].finish_reason
    assert _ids(out.choices[0]) == want[0].token_ids
    assert out.usage.completion_tokens == len(want[0].token_ids)


def test_models_health_and_metrics(tiny_api, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    assert httpx.get(tiny_api.url + "/health").json()["status"] == "ok"
    page = httpx.get(tiny_api.url + "/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    assert metric(page.text, "minicb:generation_tokens_total") > 0
    assert metric(page.text, "minicb:kv_cache_usage_perc") == 0.0
    assert metric(page.text, "minicb:num_requests_running") == 0


def test_usage_reports_the_prompt_tokens_found_in_the_prefix_cache(client):
    """Prefix caching is on by default: a second request with the same 40-token prompt finds
    its first two full 16-token blocks cached (the last token is always computed)."""
    prompt = list(range(100, 140))
    cached = []
    for _ in range(2):
        out = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=2,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
    assert cached == [0, 32]
