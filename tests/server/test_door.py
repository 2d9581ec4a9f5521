"""The door against a page of another site and a guesser, on live servers (127.0.0.1):

- a request naming a foreign Host (a DNS-rebinding page) is refused (403) on /ws, /v1,
  /metrics and /viz/info, key or no key, before any route runs;
- the API's POSTs need a JSON content type (a foreign page's text/plain POST gets 415 and
  runs nothing);
- /openapi.json needs the controller's key;
- wrong keys are slowed per address, and a guesser out of guesses is not even checked;
- a binary frame where the key should be gets the usual refusal, with no traceback, and
  one after the key an error reply (controls are JSON text), with none either;
- the key given as ``?key=`` never reaches uvicorn's log.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from minicb.server.guard import Guard, GuessLimit
from minicb.server.launch import keep_keys_out_of_logs
from tests.server.conftest import guarded_demo, receive, replies, ws_connect

KEY, VIEWER_KEY = "sk-teacher", "room-42"
BODY = {"model": "fake", "prompt": "hi", "max_tokens": 2}


def upgrade_status(url: str, host: str, path: str = "/ws") -> int:
    """The status a WebSocket upgrade naming ``host`` gets (101: accepted)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        return int(sock.recv(64).split()[1])


@pytest.mark.parametrize("key", [None, KEY])
def test_a_foreign_host_is_refused_before_any_route(key):
    with guarded_demo(Guard(api_key=key), mode="serve") as live:
        port = live.url.rsplit(":", 1)[1]
        auth = {"Authorization": f"Bearer {KEY}"} if key else {}
        for host in (f"rebind.example:{port}", "attacker.127.0.0.1.nip.io", ""):
            headers = {**auth, "Host": host}
            for path in ("/v1/models", "/metrics", "/viz/info", "/health"):
                assert httpx.get(live.url + path, headers=headers).status_code == 403, path
            refused = httpx.post(live.url + "/v1/completions", json=BODY, headers=headers)
            assert refused.status_code == 403 and "--allowed-host" in refused.text
            assert upgrade_status(live.url, host) == 403
        # its own names still open it
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert (
                httpx.get(live.url + "/v1/models", headers={**auth, "Host": host}).status_code
                == 200
            )
            assert upgrade_status(live.url, host, "/ws" + (f"?key={key}" if key else "")) == 101
        assert live.loop.engines["api"].step_count == 0  # nothing ran for the foreign names


def test_a_name_given_with_allowed_host_is_let_in():
    with guarded_demo(Guard(allowed_hosts=("Teacher.local",)), mode="serve") as live:
        assert (
            httpx.get(live.url + "/v1/models", headers={"Host": "teacher.local:8000"}).status_code
            == 200
        )
        assert (
            httpx.get(live.url + "/v1/models", headers={"Host": "student.local"}).status_code == 403
        )


def test_a_cross_site_text_plain_post_runs_nothing():
    with guarded_demo(Guard(), mode="serve") as live:  # no key: the case a page could exploit
        url = live.url + "/v1/completions"
        for kind in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": kind} if kind else {}
            reply = httpx.post(url, content=json.dumps(BODY), headers=headers)
            assert reply.status_code == 415, kind
            assert "Content-Type must be application/json" in reply.json()["error"]["message"]
        assert live.loop.engines["api"].step_count == 0
        assert httpx.post(url, json=BODY).status_code == 200  # the JSON one runs


def test_the_openapi_description_needs_the_controllers_key():
    with guarded_demo(Guard(api_key=KEY, viewer_key=VIEWER_KEY), mode="serve") as live:
        url = live.url + "/openapi.json"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {VIEWER_KEY}"}).status_code == 401
        described = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"})
        assert described.status_code == 200 and "/v1/completions" in described.json()["paths"]
        assert httpx.get(live.url + "/docs").status_code == 404


def test_wrong_keys_are_slowed_per_address():
    guard = Guard(api_key=KEY, guesses=GuessLimit(burst=3, interval_s=0.2))
    for _ in range(3):
        assert guard.role("guess", "10.0.0.7") is None
    assert guard.role(KEY, "10.0.0.7") is None  # out of guesses: not even checked
    assert guard.role(KEY, "10.0.0.8") == "controller"  # another address is not slowed
    time.sleep(0.25)
    assert guard.role(KEY, "10.0.0.7") == "controller"  # one more guess a while later


def test_a_guesser_is_refused_over_http_and_websocket_alike():
    guard = Guard(api_key=KEY, guesses=GuessLimit(burst=2, interval_s=60))
    with guarded_demo(guard, mode="serve") as live:
        for guess in ("a", "b"):
            bad = {"Authorization": f"Bearer {guess}"}
            assert httpx.get(live.url + "/v1/models", headers=bad).status_code == 401
        good = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(live.url + "/v1/models", headers=good).status_code == 401
        assert upgrade_status(live.url, "127.0.0.1", f"/ws?key={KEY}") == 403


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        if record.exc_info:
            self.lines.append("Traceback")


@contextmanager
def uvicorn_log() -> Iterator[Collect]:
    """uvicorn's log lines (entered once the server runs: its logging setup replaces the
    handlers there were), at INFO."""
    collect = Collect()
    loggers = [logging.getLogger(n) for n in ("uvicorn.access", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(collect)
        logger.setLevel(logging.INFO)
    try:
        yield collect
    finally:
        for logger in loggers:
            logger.removeHandler(collect)


def test_a_binary_frame_before_the_key_is_refused_without_a_traceback():
    with guarded_demo(Guard(api_key=KEY), mode="serve") as live, uvicorn_log() as log:
        for _ in range(3):
            with ws_connect(live.ws) as ws:
                assert receive(ws)["type"] == "auth_required"
                ws.send(b"\x00\x01binary")
                refusal = receive(ws)
                assert refusal["type"] == "error" and "needs a key" in refusal["message"]
    assert any("WebSocket /ws" in line for line in log.lines)  # the log was listened to
    assert not any("Traceback" in line or "Exception" in line for line in log.lines)


def test_a_binary_frame_after_the_key_gets_an_error_reply_without_a_traceback():
    with guarded_demo(Guard(api_key=KEY), mode="serve") as live, uvicorn_log() as log:
        with ws_connect(live.ws + "?key=" + KEY) as ws:
            assert receive(ws)["type"] == "hello"
            for _ in range(3):
                ws.send(b"\x00\x01binary")
                (refusal,) = replies(ws, 1)
                assert refusal["type"] == "error" and "binary" in refusal["message"]
            ws.send(json.dumps({"type": "step"}))  # the connection still takes controls
            (reply,) = replies(ws, 1)
            assert reply["control"] == "step"
    assert any("WebSocket /ws" in line for line in log.lines)  # the log was listened to
    assert not any("Traceback" in line or "Exception" in line for line in log.lines)


def test_the_key_in_the_address_never_reaches_the_log():
    keep_keys_out_of_logs()  # as minicb demo and serve do
    guard = Guard(api_key=KEY, viewer_key=VIEWER_KEY)
    with guarded_demo(guard, mode="serve") as live, uvicorn_log() as log:
        assert httpx.get(live.url + "/viz/info?key=" + VIEWER_KEY).status_code == 200
        with ws_connect(live.ws + "?key=" + KEY) as ws:
            assert receive(ws)["type"] == "hello"
    logged = "\n".join(log.lines)
    assert "/viz/info" in logged and "/ws" in logged  # the requests were logged
    assert KEY not in logged and VIEWER_KEY not in logged
