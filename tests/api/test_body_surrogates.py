"""The body's lone-surrogate check (issue 54, L2): looked for in the raw text, so a legal
body of a megabyte is never walked element by element on the event loop, and a lone
surrogate is still refused with the field that holds it named. No server, no model."""

from __future__ import annotations

import json

import pytest

from minicb.server import openai_request
from minicb.server.api_error import APIError
from minicb.server.openai_request import _decode_json


@pytest.fixture
def no_walk(monkeypatch):
    """Fail if the per-element walk runs (it built a path string per element: 0.2-0.4 s
    for a MiB of small elements)."""

    def walked(*_):
        raise AssertionError("the body was walked element by element")

    monkeypatch.setattr(openai_request, "_lone_surrogate", walked)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "metadata": {"k": ["ab"] * 100_000}},  # many small elements
        {"model": "m", "prompt": "a\U0001f600" * 1000},  # escaped pairs: json.dumps' default
        {"model": "m", "prompt": "\\ud800 is a path, not an escape"},  # an escaped backslash
    ],
)
def test_a_legal_body_is_not_walked_element_by_element(no_walk, body):
    assert _decode_json(json.dumps(body).encode()) == body


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"model": "m", "prompt": "a\\ud800"}', "prompt"),
        (b'{"model": "m", "prompt": "ok", "metadata": {"x": ["b", "\\udfff c"]}}', "metadata.x.1"),
        (b'{"model": "m", "\\ud83d": 1}', "\\ud83d"),
        (b'{"model": "m", "prompt": "\\ude00\\ud83d"}', "prompt"),  # a pair in the wrong order
    ],
)
def test_a_lone_surrogate_is_still_refused_naming_its_field(raw, where):
    with pytest.raises(APIError, match="lone surrogate") as err:
        _decode_json(raw)
    assert err.value.param == where.encode().decode("unicode_escape", "surrogatepass")
    assert err.value.code == "invalid_encoding"
