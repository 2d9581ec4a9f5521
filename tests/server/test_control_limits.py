"""Oversized and malformed controls against a live demo (uvicorn on 127.0.0.1, a real
WebSocket client), one table row each: every message gets an error naming what is wrong,
nothing is rebuilt, and meanwhile the engine keeps serving another page and the API, with
no KV block left behind."""

from __future__ import annotations

import json

import httpx
import pytest

from minicb.server.viewer_socket import CONTROL_BURST, MAX_MESSAGE_CHARS
from tests.server.conftest import guarded_demo, receive, replies, ws_connect

BIG = 1_000_000  # characters in a "1 MB" message


def settings(**fields) -> str:
    return json.dumps({"type": "settings", **fields})


# (name, the messages sent, a phrase every reply's error must hold)
ROWS = [
    ("kv pool beyond memory", [settings(num_kv_blocks=200_000)], "GiB of cpu memory"),
    ("kv pool absurd", [settings(num_kv_blocks=10**12)], "num_kv_blocks must be an integer from"),
    ("kv pool negative", [settings(num_kv_blocks=-5)], "num_kv_blocks must be"),
    (
        "thousands of slots",
        [settings(max_num_seqs=5000)],
        "max_num_seqs must be an integer from 1 to 256",
    ),
    ("slots as a string", [settings(max_num_seqs="8")], "max_num_seqs must be"),
    ("token budget as a float", [settings(max_num_batched_tokens=1e300)], "an integer"),
    ("flag as a string", [settings(enable_chunked_prefill="yes")], "true or false"),
    ("unknown policy", [settings(policy="lottery")], "policy must be one of"),
    ("unknown drafter", [settings(speculative="eagle")], "speculative must be one of off, ngram"),
    ("unknown setting", [settings(block_size=1)], "unknown field(s): block_size"),
    ("no setting", [settings()], "settings needs at least one of"),
    ("negative delay", ['{"type": "speed", "delay_s": -5}'], "delay_s must be a number"),
    ("NaN delay", ['{"type": "speed", "delay_s": NaN}'], "delay_s must be a number"),
    ("workload of a million", ['{"type": "workload", "count": 1000000}'], "count must be"),
    ("rate as a word", ['{"type": "workload", "rate": "fast"}'], "rate must be a number"),
    ("empty prompt", ['{"type": "prompt", "text": "   "}'], "text must be a non-empty string"),
    ("long prompt", [json.dumps({"type": "prompt", "text": "x" * 5000})], "at most 4000 chars"),
    ("absurd max_tokens", ['{"type": "prompt", "text": "hi", "max_tokens": 1e9}'], "max_tokens"),
    ("unknown target", ['{"type": "prompt", "text": "hi", "target": "gpu9"}'], "target must be"),
    ("unknown control", ['{"type": "reboot"}'], "unknown control 'reboot'"),
    ("type not a string", ['{"type": 5}'], 'a control is an object with "type"'),
    ("not an object", ["[1, 2, 3]"], 'a control is an object with "type"'),
    ("not JSON", ["{{pause"], "malformed JSON"),
    ("nested too deeply", ["[" * 5000 + "]" * 5000], "malformed JSON"),
    ("a number of 5,000 digits", ['{"type": "speed", "delay_s": ' + "9" * 5000 + "}"], "JSON"),
    (
        "1 MB message",
        [json.dumps({"type": "prompt", "text": "x" * BIG})],
        f"limit of {MAX_MESSAGE_CHARS}",
    ),
    ("1 MB of garbage", ["\x00" * BIG], f"limit of {MAX_MESSAGE_CHARS}"),
    ("1,000 messages a second", ['{"type": "speed", "delay_s": 0}'] * 1000, None),
]


@pytest.fixture(scope="module")
def live():
    with guarded_demo() as live:
        yield live


def _serves_the_api(live) -> None:
    body = {"model": "fake", "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
    reply = httpx.post(live.url + "/v1/completions", json=body, timeout=20)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3


def _used_blocks(live) -> dict[str, int]:
    def read() -> dict[str, int]:
        return {n: e.kv_snapshot().num_used for n, e in live.loop.engines.items()}

    return live.loop.call(read).result(5)


@pytest.mark.parametrize(("name", "messages", "phrase"), ROWS, ids=[r[0] for r in ROWS])
def test_each_bad_control_gets_an_error_and_the_engine_goes_on(live, name, messages, phrase):
    engines = dict(live.loop.engines)
    configs = {n: e.config for n, e in engines.items()}
    with ws_connect(live.ws) as observer, ws_connect(live.ws) as attacker:
        receive(observer), receive(attacker)  # hellos
        for text in messages:
            attacker.send(text)
        got = replies(attacker, len(messages), timeout=60)
        _serves_the_api(live)  # during the attack's aftermath: another client goes on
        seen = []
        while not any(e["type"] == "finished" for e in seen):  # the other page saw it all
            msg = receive(observer)
            seen += msg["events"] if msg["type"] == "frame" else []
    assert all(r["type"] in ("error", "ack") for r in got)
    if phrase is None:  # the flood: a burst is served, the rest is refused at the door
        errors = [r for r in got if r["type"] == "error"]
        assert errors and all("too many controls" in r["message"] for r in errors)
        assert len(got) - len(errors) >= CONTROL_BURST  # the burst itself was served
    else:
        assert [r["type"] for r in got] == ["error"] * len(messages)
        assert all(phrase in r["message"] for r in got), got[0]["message"]
    assert live.loop.engines == engines  # nothing rebuilt
    assert {n: e.config for n, e in live.loop.engines.items()} == configs
    assert _used_blocks(live) == {"static": 0, "continuous": 0}  # no KV block leaked
    assert live.loop.alive
