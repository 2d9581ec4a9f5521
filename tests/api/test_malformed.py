"""Every malformed request gets a 4xx with an OpenAI-style error body that names the
problem (never a 500, never a hang), and the server answers correctly afterwards.

One table row per way of being wrong: (name, path, body, status, words in the message,
the ``param`` the error names or None). Bodies are bytes (sent as they are) or objects
(sent as JSON). The model is the tiny one: no tokenizer, a context of 512 tokens.
"""

from __future__ import annotations

import json

import httpx
import pytest

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
HI = [{"role": "user", "content": "hi"}]


def c(**fields):
    """A valid completion request with ``fields`` changed (None removes a field)."""
    body = {**OK, **fields}
    return {k: v for k, v in body.items() if v is not None}


def chat(**fields):
    body = {"model": "tiny", "messages": HI, **fields}
    return {k: v for k, v in body.items() if v is not None}


# fmt: off
CASES = [
    ("bad json", C, b'{"model": "tiny", "prompt": [1, 2', 400, "not valid JSON", None),
    ("not an object", C, b"[1, 2, 3]", 400, "must be a JSON object", None),
    ("empty body", C, b"", 400, "body is empty", None),
    ("invalid utf-8", C, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, "not valid UTF-8", None),
    ("lone surrogate", C, b'{"model": "tiny", "prompt": "a\\ud800"}', 400, "lone surrogate",
     "prompt"),
    ("nested too deep", C, b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000
     + b"}", 400, "nested too deeply", None),
    ("integer too long", C, b'{"model": "tiny", "prompt": [' + b"9" * 5000 + b"]}", 400,
     "digits", None),
    ("missing model", C, c(model=None), 400, "model is required", "model"),
    ("unknown model", C, c(model="gpt-4"), 400, "'gpt-4' is not served here", "model"),
    ("empty model", C, c(model=""), 400, "model", "model"),
    ("missing prompt", C, c(prompt=None), 400, "prompt is required", "prompt"),
    ("max_tokens string", C, c(max_tokens="12"), 400, "valid integer", "max_tokens"),
    ("max_tokens float", C, c(max_tokens=1.5), 400, "valid integer", "max_tokens"),
    ("max_tokens bool", C, c(max_tokens=True), 400, "valid integer", "max_tokens"),
    ("max_tokens zero", C, c(max_tokens=0), 400, "greater than or equal to 1", "max_tokens"),
    ("max_tokens negative", C, c(max_tokens=-5), 400, "greater than or equal to 1",
     "max_tokens"),
    ("max_tokens absurd", C, c(max_tokens=10**30), 400, "context holds 512 tokens",
     "max_tokens"),
    ("temperature negative", C, c(temperature=-1), 400, "temperature", "temperature"),
    ("temperature too high", C, c(temperature=3.5), 400, "less than or equal to 2",
     "temperature"),
    ("temperature string", C, c(temperature="hot"), 400, "valid number", "temperature"),
    ("temperature NaN", C, b'{"model": "tiny", "prompt": [5], "temperature": NaN}', 400,
     "finite number", "temperature"),
    ("top_p zero", C, c(top_p=0), 400, "greater than 0", "top_p"),
    ("top_p too high", C, c(top_p=1.5), 400, "less than or equal to 1", "top_p"),
    ("seed absurd", C, c(seed=2**70), 400, "seed", "seed"),
    ("stop too many", C, c(stop=["a", "b", "c", "d", "e"]), 400, "up to 4", "stop"),
    ("stop empty string", C, c(stop=""), 400, "stop must be", "stop"),
    ("stop number", C, c(stop=42), 400, "stop must be", "stop"),
    ("n of 2", C, c(n=2), 400, "n must be 1", "n"),
    ("logprobs", C, c(logprobs=5), 400, "logprobs is not supported", "logprobs"),
    ("echo", C, c(echo=True), 400, "echo is not supported", "echo"),
    ("penalty", C, c(presence_penalty=0.5), 400, "presence_penalty is not supported",
     "presence_penalty"),
    ("misspelled field", C, c(max_token=5), 400, "unrecognized request argument: max_token",
     "max_token"),
    ("stream not a bool", C, c(stream="yes"), 400, "valid boolean", "stream"),
    ("stream_options alone", C, c(stream_options={"include_usage": True}), 400,
     "only allowed when stream is true", "stream_options"),
    ("priority string", C, c(priority="high"), 400, "valid integer", "priority"),
    ("prompt empty list", C, c(prompt=[]), 400, "prompt is empty", "prompt"),
    ("prompt empty ids", C, c(prompt=[[]]), 400, "prompt is empty", "prompt"),
    ("prompt several", C, c(prompt=[[1], [2]]), 400, "one prompt per request", "prompt"),
    ("prompt mixed list", C, c(prompt=[1, "a"]), 400, "prompt must be", "prompt"),
    ("prompt object", C, c(prompt={"text": "hi"}), 400, "prompt must be", "prompt"),
    ("prompt bools", C, c(prompt=[True, False]), 400, "prompt must be", "prompt"),
    ("token outside vocab", C, c(prompt=[999]), 400, "outside the vocabulary", "prompt"),
    ("negative token", C, c(prompt=[-1]), 400, "outside the vocabulary", "prompt"),
    ("prompt longer than context", C, c(prompt=[5] * 600), 400,
     "does not fit the model's context of 512", "prompt"),
    ("text without tokenizer", C, c(prompt="hello"), 400, "no tokenizer", "prompt"),
    ("messages missing", CHAT, chat(messages=None), 400, "messages is required", "messages"),
    ("messages empty", CHAT, chat(messages=[]), 400, "non-empty list", "messages"),
    ("messages a string", CHAT, chat(messages="hi"), 400, "non-empty list", "messages"),
    ("message not an object", CHAT, chat(messages=["hi"]), 400, "must be an object",
     "messages.0"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
     "role must be one of", "messages.0.role"),
    ("no content", CHAT, chat(messages=[{"role": "user"}]), 400, "content is required",
     "messages.0.content"),
    ("content number", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400,
     "must be a string or a list of text parts", "messages.0.content"),
    ("image part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400,
     "'image_url' is not supported", "messages.0.content.0"),
    ("tool calls", CHAT, chat(messages=[{"role": "user", "content": "hi", "tool_calls": []}]),
     400, "tool_calls is not supported", "messages.0.tool_calls"),
    ("tools", CHAT, chat(tools=[{"type": "function"}]), 400, "tools is not supported", "tools"),
    ("max_completion_tokens zero", CHAT, chat(max_completion_tokens=0), 400,
     "greater than or equal to 1", "max_completion_tokens"),
    ("no chat template", CHAT, chat(), 400, "no chat template", "messages"),
]
# fmt: on


# The error ``code`` of each case where it is not the usual "invalid_value".
CODES = {
    "bad json": "invalid_json",
    "content number": "invalid_type",
    "echo": "unsupported_parameter",
    "empty body": "invalid_json",
    "integer too long": "invalid_json",
    "invalid utf-8": "invalid_encoding",
    "logprobs": "unsupported_parameter",
    "lone surrogate": "invalid_encoding",
    "messages missing": "missing_required_parameter",
    "missing model": "missing_required_parameter",
    "missing prompt": "missing_required_parameter",
    "misspelled field": "unrecognized_argument",
    "n of 2": "unsupported_parameter",
    "nested too deep": "invalid_json",
    "not an object": "invalid_json",
    "penalty": "unsupported_parameter",
    "prompt bools": "invalid_type",
    "prompt mixed list": "invalid_type",
    "prompt object": "invalid_type",
    "stream_options alone": "unsupported_parameter",
    "tools": "unsupported_parameter",
    "unknown model": "model_not_found",
}


@pytest.fixture(scope="module")
def http(tiny_api):
    with httpx.Client(base_url=tiny_api.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("name, path, body, status, words, param", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_gets_its_4xx_and_message(http, name, path, body, status, words, param):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == CODES.get(name, "invalid_value")


def test_wrong_method_and_unknown_path_are_openai_style_404s(http):
    for r in (http.get(C), http.post("/v1/engines/tiny/completions", json=OK)):
        error = r.json()["error"]
        assert r.status_code == 404 and "no route" in error["message"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_url")


def test_the_server_answers_correctly_after_the_whole_table(http, tiny_api):
    r = http.post(C, json={**OK, "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200
    body = r.json()
    assert len(body["choices"][0]["token_ids"]) == 2 and body["usage"]["prompt_tokens"] == 3
    stream = http.post(C, json={**OK, "stream": True, "ignore_eos": True}).text
    assert stream.endswith("data: [DONE]\n\n")
    chunks = [json.loads(x[6:]) for x in stream.split("\n\n") if x.startswith("data: {")]
    # one chunk per token (the tiny model has no tokenizer: empty text), then the finish
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert tiny_api.used_blocks() == 0
    assert tiny_api.loop.call(lambda: tiny_api.engine.has_unfinished()).result(5) is False
