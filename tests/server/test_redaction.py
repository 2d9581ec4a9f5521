"""What a client that may not read texts receives (minicb.server.redaction): an allow-list.

A viewer of a live server with speculation on (whose drafted reasons once quoted the
matched n-gram) and an API user's stop strings (which ``arrived`` once carried in its
params) gets no three characters in a row of any prompt, output or stop string; neither
does a viewer of a replay. Every field of every event is classified, so a new one cannot
reach viewers unread.
"""

from __future__ import annotations

import json
import threading

import httpx
from fastapi.testclient import TestClient

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.server.broadcast import read_message
from minicb.server.guard import Guard
from minicb.server.openai_api import install_openai_routes
from minicb.server.redaction import redact_event, text_free
from minicb.telemetry.event_json import to_dict
from minicb.telemetry.trace_reader import Trace
from tests.api.live import live_server
from tests.server.conftest import CharTokenizer, message, receive, ws_connect

KEY, VIEWER_KEY = "sk-teacher", "room-42"
# Letters no field name, reason or number of an event holds, so any 3 of them in a row in
# what a viewer got came from a text.
SECRET = "QZJX VKWQ ZXJQ KWVZ QZJX VKWQ ZXJQ KWVZ"
STOPS = ["YPPHYB", "BHYPYB"]


def copying(rid: int, i: int) -> int:
    """The fake model repeats the prompt: n-gram lookup then drafts from it."""
    return ord(SECRET[(i + 5) % len(SECRET)])


def speculative_engine() -> LLMEngine:
    config = EngineConfig.from_kwargs(
        num_kv_blocks=64, speculative="ngram", num_speculative_tokens=4
    )
    runner = FakeRunner(num_kv_blocks=64, tokenizer=CharTokenizer(), token_fn=copying)
    return LLMEngine(config=config, runner=runner)


def short_substrings(*texts: str) -> set[str]:
    return {t[i : i + 3] for t in texts for i in range(len(t) - 2)}


def test_text_free_cuts_out_anything_quoted():
    assert text_free("drafts 3 tokens: the n-gram 'my pin' appeared at 4") == (
        "drafts 3 tokens: the n-gram … appeared at 4"
    )
    assert text_free('refused these messages: "it\'s a secret" and more') == (
        "refused these messages: … and more"
    )
    assert text_free("an unclosed 'quote runs to the end") == "an unclosed …"
    assert text_free("finished (stop)") == "finished (stop)"


def test_a_viewer_never_sees_three_characters_of_a_prompt_output_or_stop_string():
    engine = speculative_engine()
    loop = EngineLoop({"api": engine})
    guard = Guard(api_key=KEY, viewer_key=VIEWER_KEY)
    app = create_app(loop, mode="serve", model_name="fake", guard=guard)
    install_openai_routes(app, loop, "api", "fake", guard=guard)
    loop.start()
    try:
        with (
            live_server(app) as url,
            ws_connect(url.replace("http", "ws") + "/ws?key=" + VIEWER_KEY) as ws,
        ):
            assert receive(ws)["role"] == "viewer"
            seen: list[str] = []
            done = threading.Event()

            def read() -> None:
                while not done.is_set():
                    text = json.dumps(read_message(ws.recv(timeout=20)))  # a frame unzipped
                    seen.append(text)
                    if '"finished"' in text:
                        done.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            body = {
                "model": "fake",
                "prompt": SECRET,
                "max_tokens": 24,
                "temperature": 0,
                "stop": STOPS,
            }
            auth = {"Authorization": f"Bearer {KEY}"}
            reply = httpx.post(url + "/v1/completions", json=body, headers=auth, timeout=20)
            assert reply.status_code == 200, reply.text
            reader.join(20)
            assert done.is_set(), "the viewer never saw the request finish"
    finally:
        loop.stop()
    output = reply.json()["choices"][0]["text"]
    assert len(output) == 24  # the request ran whole
    events = [e for text in seen for e in json.loads(text).get("events", [])]
    assert any(e["type"] == "step" and e["drafted"] for e in events)  # speculation drafted
    shown = "\n".join(seen)
    leaked = sorted(s for s in short_substrings(SECRET, output, *STOPS) if s in shown)
    assert leaked == []


def _every_kind_of_event() -> list:
    """One run that produces every event type: speculation, preemption by swap, a
    rejection, an abort, a rebuild."""
    engine = speculative_engine()
    seen: list = []
    engine.bus.subscribe(seen.extend)
    params = SamplingParams(max_tokens=12, temperature=0.0, stop=STOPS)
    for _ in range(3):
        engine.add_request(SECRET, params)
    try:
        engine.add_request("", params)
    except ValueError:
        pass
    engine.step()
    engine.abort_request(0)
    engine.run_until_done()
    if hasattr(engine, "kv_snapshot_event"):  # a whole-map event, where the schema has one
        seen.append(engine.kv_snapshot_event())
    engine.rebuilt(engine.config)
    return seen


def test_every_field_of_every_event_is_classified():
    """A field the allow-list does not name would be dropped for viewers: this fails first,
    so whoever adds a field decides whether it may carry text."""
    events = [to_dict(e) for e in _every_kind_of_event()]
    kinds = {e["type"] for e in events}
    assert {"step", "arrived", "tokens", "finished", "aborted", "rejected", "reset"} <= kinds
    for event in events:
        shown = redact_event(event)
        assert set(event) <= set(shown), (event["type"], set(event) - set(shown))
        for name in ("scheduled", "admitted", "drafted", "finished", "preempted"):
            for item, kept in zip(event.get(name, []), shown.get(name, []), strict=True):
                assert set(item) == set(kept), (event["type"], name, set(item) - set(kept))
    text = json.dumps([redact_event(e) for e in events])
    assert not short_substrings(SECRET, *STOPS) & short_substrings(text)


def test_every_field_of_a_frame_is_classified_too():
    """What a page gets is folded into frames (server/frames.py): their step digests and
    request events must reach a viewer whole but for the texts."""
    from minicb.server.frames import StepFolder
    from minicb.telemetry.kv_state import KVState

    engine = speculative_engine()
    folder = StepFolder({"name": "api", **engine.describe()}, KVState())
    seen: list = []
    engine.bus.subscribe(seen.extend)
    for _ in range(2):
        engine.add_request(SECRET, SamplingParams(max_tokens=12, temperature=0.0, stop=STOPS))
    engine.run_until_done()
    frame = folder.fold(seen, tokens=True)
    assert any(e["type"] == "step" and e["row_changes"] for e in frame)
    for event in frame + [{**r} for r in folder.view()["requests"]]:
        assert set(event) <= set(redact_event(event)), set(event) - set(redact_event(event))
    text = json.dumps([redact_event(e) for e in frame])
    assert not short_substrings(SECRET, *STOPS) & short_substrings(text)


def test_an_unknown_event_type_or_field_keeps_only_who_and_when():
    odd = {"type": "future", "time": 1.0, "request_id": 3, "words": "QZJX VKWQ"}
    assert redact_event(odd) == {"type": "future", "time": 1.0, "request_id": 3, "redacted": True}
    tokens = {"type": "tokens", "time": 1.0, "step": 2, "request_ids": [3, 4],
              "indexes": [0, 5], "token_ids": [81, 82], "texts": ["Q", "Z"],
              "logprob_texts": ["Q", "Z"]}  # fmt: skip
    shown = redact_event(tokens)
    assert shown["token_ids"] == [None, None] and shown["texts"] == ["", ""]
    assert shown["request_ids"] == [3, 4] and shown["indexes"] == [0, 5]
    assert "logprob_texts" not in shown and shown["redacted"] is True
    assert tokens["texts"] == ["Q", "Z"]  # the event itself is untouched


def test_a_viewer_of_a_replay_gets_no_texts_either():
    events = [e for e in _every_kind_of_event() if e.kind != "reset"]
    trace = Trace({"model": "fake", "config": {}}, events)
    app = create_app(
        None, mode="replay", replay={"continuous": trace}, guard=Guard(KEY, VIEWER_KEY)
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        with client.websocket_connect("ws://127.0.0.1/ws?key=" + VIEWER_KEY) as ws:
            assert message(ws)["role"] == "viewer"
            replay = json.dumps(message(ws)["traces"])
    assert not short_substrings(SECRET, *STOPS) & short_substrings(replay)
