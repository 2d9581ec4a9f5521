"""The door of a live server (uvicorn on 127.0.0.1, a real WebSocket client): with a key
set, /ws without it or with a wrong one is refused; a foreign Origin is refused before the
upgrade with or without a key; a viewer cannot pause or rebuild; in serve mode an API
user's prompt and output never reach the stream, nor a replay's texts a viewer; without a
key, a non-loopback bind refuses to start and says why."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient
from websockets.exceptions import ConnectionClosed, InvalidStatus

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.cli import build_parser, main
from minicb.server.app import create_app
from minicb.server.guard import Guard
from minicb.server.launch import serve_replay, server_guard
from minicb.telemetry.trace_reader import Trace
from tests.api.live import LOCAL
from tests.server.conftest import (
    CharTokenizer,
    guarded_demo,
    message,
    receive,
    replies,
    ws_connect,
)

KEY, VIEWER_KEY = "sk-teacher", "room-42"
GUARD = Guard(api_key=KEY, viewer_key=VIEWER_KEY)
SECRET = "My secret password is swordfish"


@pytest.fixture(scope="module")
def demo():
    with guarded_demo(GUARD) as live:
        yield live


def own_origin(live) -> str:
    return live.url  # http://127.0.0.1:PORT, as the page served from there sends it


def hello_of(ws) -> dict:
    """Answer the server's request for a key, if it makes one; then the hello."""
    msg = receive(ws)
    assert msg["type"] == "hello", msg
    return msg


def test_no_key_or_a_wrong_key_is_refused(demo):
    with ws_connect(demo.ws) as ws:  # no key: asked for one, then closed
        assert receive(ws)["type"] == "auth_required"
        ws.send(json.dumps({"type": "pause"}))
        refusal = receive(ws)
        assert refusal["type"] == "error" and "needs a key" in refusal["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == 4401
    with ws_connect(demo.ws) as ws:  # a wrong key in the first message
        receive(ws)
        ws.send(json.dumps({"type": "auth", "key": "guess"}))
        assert receive(ws)["control"] == "auth"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
    for first in ("[" * 8000, "x" * 100_000, '{"type": "auth", "key": 5}'):  # no key at all
        with ws_connect(demo.ws) as ws:
            receive(ws)
            ws.send(first)
            assert receive(ws)["control"] == "auth"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=5)
    with pytest.raises(InvalidStatus) as refused:  # a wrong ?key=: no upgrade at all
        ws_connect(demo.ws + "?key=guess")
    assert refused.value.response.status_code == 403
    assert not demo.loop.paused


def test_the_right_key_opens_it_either_way(demo):
    with ws_connect(demo.ws + "?key=" + KEY) as ws:
        assert hello_of(ws)["role"] == "controller"
    with ws_connect(demo.ws, origin=own_origin(demo)) as ws:
        assert receive(ws)["type"] == "auth_required"
        ws.send(json.dumps({"type": "auth", "key": VIEWER_KEY}))
        hello = hello_of(ws)
        assert hello["role"] == "viewer" and not any(hello["controls"].values())


@pytest.mark.parametrize("key", [None, KEY])
def test_a_foreign_origin_is_refused_before_the_upgrade(key):
    guard = Guard(api_key=key, allowed_origins=("https://course.example.org",))
    with guarded_demo(guard) as live:
        url = live.ws + (f"?key={key}" if key else "")
        for origin in ("https://evil.example", "http://127.0.0.1:1", "null"):
            with pytest.raises(InvalidStatus) as refused:
                ws_connect(url, origin=origin)
            assert refused.value.response.status_code == 403
        for origin in (own_origin(live), "https://course.example.org"):
            with ws_connect(url, origin=origin) as ws:
                assert hello_of(ws)["type"] == "hello"
        assert not live.loop.paused


def test_a_viewer_cannot_pause_step_or_rebuild(demo):
    engines = dict(demo.loop.engines)
    with ws_connect(demo.ws + "?key=" + VIEWER_KEY) as ws:
        hello_of(ws)
        tried = [
            {"type": "pause"},
            {"type": "step"},
            {"type": "settings", "max_num_seqs": 2},
            {"type": "prompt", "text": "hi"},
            {"type": "workload", "preset": "burst"},
        ]
        for msg in tried:
            ws.send(json.dumps(msg))
        for reply in replies(ws, len(tried)):
            assert reply["type"] == "error" and "viewer (read-only)" in reply["message"]
    assert not demo.loop.paused and demo.loop.engines == engines  # nothing rebuilt


def _complete(live, prompt, key=KEY) -> dict:
    body = {"model": "fake", "prompt": prompt, "max_tokens": 3, "ignore_eos": True}
    auth = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(live.url + "/v1/completions", json=body, headers=auth, timeout=20)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _events_until_finished(ws) -> list[dict]:
    seen = []
    while not any(e["type"] == "finished" for e in seen):
        msg = receive(ws)
        if msg["type"] == "frame":
            seen += msg["events"]
    return seen


@pytest.mark.parametrize("show_text", [False, True])
def test_api_prompts_stay_out_of_the_stream_in_serve_mode(show_text):
    guard = Guard(api_key=KEY, viewer_key=VIEWER_KEY, show_text=show_text)
    with guarded_demo(guard, mode="serve") as live:
        viewer = ws_connect(live.ws + "?key=" + VIEWER_KEY)
        controller = ws_connect(live.ws + "?key=" + KEY)
        with viewer, controller:
            hello_of(viewer), hello_of(controller)
            _complete(live, SECRET)
            for ws in (viewer, controller):
                events = _events_until_finished(ws)
                arrived = next(e for e in events if e["type"] == "arrived")
                tokens = [t for e in events if e["type"] == "tokens" for t in e["token_ids"]]
                assert (arrived["prompt"] == SECRET) is show_text
                assert (SECRET in json.dumps(events)) is show_text
                assert all((t is not None) is show_text for t in tokens)
                assert len(tokens) == 3  # the timeline still shows every token
            # what a controller types on the page, it sees (the viewer does not)
            controller.send(json.dumps({"type": "prompt", "text": "typed here", "max_tokens": 2}))
            for ws, sees in ((controller, True), (viewer, show_text)):
                events = _events_until_finished(ws)
                tokens = [t for e in events if e["type"] == "tokens" for t in e["token_ids"]]
                assert tokens and all((t is not None) is sees for t in tokens)


def test_metrics_and_info_need_a_key_unless_public():
    with guarded_demo(GUARD) as live:
        assert httpx.get(live.url + "/metrics").status_code == 401
        assert httpx.get(live.url + "/viz/info").status_code == 401
        info = httpx.get(live.url + "/viz/info?key=" + VIEWER_KEY)
        assert info.status_code == 200 and info.json()["role"] == "viewer"
        viewer = {"Authorization": f"Bearer {VIEWER_KEY}"}
        assert httpx.get(live.url + "/metrics", headers=viewer).status_code == 200
        assert httpx.post(live.url + "/v1/completions", headers=viewer, json={}).status_code == 401
        assert httpx.get(live.url + "/").status_code == 200  # the page itself, to ask for a key
    with guarded_demo(Guard(api_key=KEY, metrics_public=True)) as live:
        assert httpx.get(live.url + "/metrics").status_code == 200


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_public_bind_without_a_key_refuses_to_start_and_says_why(command, capsys):
    assert main([command, "--host", "0.0.0.0", "--port", "1"]) == 2  # before loading a model
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without --api-key" in err
    assert "anyone who can reach the port" in err and "--insecure-public" in err


def test_a_public_replay_needs_a_key_too_and_insecure_public_is_the_way_round():
    args = build_parser().parse_args(["replay", "t.jsonl", "--serve", "--host", "10.0.0.5"])
    with pytest.raises(ValueError, match="refusing to listen on 10.0.0.5"):
        serve_replay({}, args)
    args.insecure_public = True
    assert server_guard(args).api_key is None
    args.api_key, args.viewer_key = "k", "k"
    with pytest.raises(ValueError, match="--viewer-key must differ"):
        server_guard(args)


def test_a_replays_traces_need_a_key_and_a_viewer_gets_them_without_texts():
    runner = FakeRunner(num_kv_blocks=32, tokenizer=CharTokenizer())
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=32), runner=runner)
    seen = []
    engine.bus.subscribe(seen.extend)
    engine.add_request(SECRET, SamplingParams(max_tokens=2, ignore_eos=True))
    engine.run_until_done()
    trace = Trace({"model": "fake", "config": engine.config.to_dict()}, seen)
    app = create_app(None, mode="replay", replay={"continuous": trace}, guard=GUARD)
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/viz/info").status_code == 401
        for key, sees in ((KEY, True), (VIEWER_KEY, False)):
            with client.websocket_connect("ws://127.0.0.1/ws?key=" + key) as ws:
                assert message(ws)["role"] == ("controller" if sees else "viewer")
                events = message(ws)["traces"]["continuous"]["events"]
                assert (SECRET in json.dumps(events)) is sees
                assert len(events) == len(seen)  # the timeline is whole either way
