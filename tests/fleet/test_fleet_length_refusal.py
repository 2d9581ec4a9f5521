"""``--replicas`` and ``--disaggregate`` refuse a text too long for the context by its
length, before tokenizing, as one engine does (issue 54, M6's leftover): the fleets show
their engines' tokenizer and context to the API's length rule (tokenizer_queue.py). Before,
a fleet showed no tokenizer, so every text, a MiB of it too, waited for the tokenizer
thread. Stand-in engines: no process, no model."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from minicb.fleet import fleet as fleet_module
from minicb.fleet.fleet import FLEET
from minicb.server.api_error import APIError
from minicb.server.openai_api import install_openai_routes
from minicb.server.tokenizer_queue import TokenizerQueue
from tests.api.live import live_server
from tests.api.test_tokenizer_queue import GatedTokenizer
from tests.fleet.test_disaggregate_streams import scripted_fleet
from tests.fleet.test_served_model_name import NamedReplica

CONTEXT = 64  # the stand-ins' context; GatedTokenizer's longest entry: 4 characters


def test_the_disaggregated_fleet_refuses_an_over_long_text_before_tokenizing(
    monkeypatch, tmp_path
):
    fleet = scripted_fleet(monkeypatch, tmp_path, prefill=1, decode=1)
    tokenizer = GatedTokenizer()
    for engine in fleet.engines.values():
        engine.tokenizer, engine.max_model_len = tokenizer, CONTEXT
    loop = fleet.engine_loop()
    app = FastAPI()
    install_openai_routes(app, loop, FLEET, "tiny")
    loop.start()
    try:
        with live_server(app) as url:
            body = {"model": "tiny", "prompt": "a" * (CONTEXT * 4 + 1), "max_tokens": 2}
            refused = httpx.post(url + "/v1/completions", json=body, timeout=30)
    finally:
        fleet.close()
    assert refused.status_code == 400, refused.text
    assert f"the limit is {CONTEXT * 4} characters" in refused.json()["error"]["message"]
    assert tokenizer.calls == 0


class TokenizingReplica(NamedReplica):
    tokenizer = GatedTokenizer()
    max_model_len = CONTEXT


def test_a_fleet_of_replicas_shows_the_length_rule_its_tokenizer_and_context(monkeypatch):
    monkeypatch.setattr(fleet_module.Fleet, "replica_class", TokenizingReplica)
    fleet = fleet_module.Fleet(None, 2)
    door = TokenizerQueue()
    door.check_length(fleet, CONTEXT * 4, "prompt")  # may fit: left to the tokenizer
    with pytest.raises(APIError, match=f"the limit is {CONTEXT * 4} characters"):
        door.check_length(fleet, CONTEXT * 4 + 1, "prompt")
