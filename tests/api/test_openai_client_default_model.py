"""The official openai client against a live server on the default model (SmolLM2-135M-
Instruct, which has a chat template): chat and completions, streaming and not, give the
text that LLM.chat / LLM.generate give for the same request."""

from __future__ import annotations

import openai
import pytest

from minicb import LLMEngine, SamplingParams
from tests.api.live import api_server

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The three primary colors are"
MAX = 16


@pytest.fixture(scope="module")
def live(default_llm):
    # A second engine on the same weights and settings: the offline LLM stays free for
    # computing the expected answers while the server's engine thread owns its own.
    config = default_llm.engine.config
    engine = LLMEngine(config=config, runner=default_llm.engine.runner.with_config(config))
    with api_server(engine, engine.model_name) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(live):
    return live.engine.model_name


def greedy(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, temperature=0.0, **kw)


def test_chat_non_streaming_equals_llm_chat(default_llm, client, model):
    want = default_llm.chat(CHAT, greedy())
    out = client.chat.completions.create(
        model=model, messages=CHAT, max_completion_tokens=MAX, temperature=0
    )
    assert want.text and out.choices[0].message.content == want.text
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == want.finish_reason
    assert out.usage.prompt_tokens == len(default_llm.apply_chat_template(CHAT))
    assert out.usage.completion_tokens == len(want.token_ids)


def test_chat_streaming_equals_llm_chat(default_llm, client, model):
    want = default_llm.chat(CHAT, greedy())
    stream = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=MAX,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == want.finish_reason and not any(finals[:-1])
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_completion_both_ways_equals_llm_generate(default_llm, client, model):
    want = default_llm.generate(PROMPT, greedy())[0]
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX, temperature=0)
    assert want.text and out.choices[0].text == want.text
    assert out.choices[0].finish_reason == want.finish_reason
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == want.text


def test_a_stop_string_spanning_tokens_never_leaks_into_the_stream(default_llm, client, model):
    full = default_llm.generate(PROMPT, greedy())[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 6]  # mid-text, likely across a token edge
    want = default_llm.generate(PROMPT, greedy(stop=[stop]))[0]
    assert want.finish_reason == "stop" and stop not in want.text
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX, temperature=0, stop=stop, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_through_the_api(default_llm, client, model):
    params = SamplingParams(max_tokens=MAX, temperature=0.8, top_p=0.9, seed=7)
    want = default_llm.generate(PROMPT, params)[0].text
    kw = dict(model=model, prompt=PROMPT, max_tokens=MAX, temperature=0.8, top_p=0.9, seed=7)
    assert client.completions.create(**kw).choices[0].text == want
    assert "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True)) == want
