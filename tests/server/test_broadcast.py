"""What goes on the /ws wire to a class of viewers: each frame is compressed once, and every
viewer of the same text class gets the same bytes in a binary message (a view for those
that fell behind too, one for all of them); the hello is compressed too, for each
connection; the replies to controls stay JSON text. Through FastAPI's TestClient, on fake
runners."""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest
from fastapi.testclient import TestClient

from minicb import SamplingParams
from minicb.driver.engine_loop import EngineLoop
from minicb.server import broadcast
from minicb.server.app import create_app
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from tests.api.live import LOCAL
from tests.server.conftest import fake_engine, message

VIEWERS = 3
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture
def demo(monkeypatch):
    """A demo on fake runners, its frames' compressions counted."""
    compressed: list[bytes] = []

    def counted(text: str) -> bytes:
        compressed.append(zlib.compress(text.encode(), broadcast.FRAME_COMPRESSION))
        return compressed[-1]

    monkeypatch.setattr(broadcast, "compress", counted)
    engines = {"static": fake_engine("static"), "continuous": fake_engine()}
    loop = EngineLoop(engines, feeder=WorkloadFeeder(WorkloadSpec(preset="off")))
    loop.start()
    app = create_app(loop, mode="demo", model_name="fake")
    with TestClient(app, base_url=LOCAL) as client:
        yield client, loop, compressed, app.state.hub
    loop.stop()


def frames_until_finished(ws, request_id: int) -> list[bytes]:
    """The binary messages of one viewer until ``request_id`` finished on "continuous"."""
    out: list[bytes] = []
    for _ in range(2000):
        received = ws.receive()
        assert "bytes" in received, received  # nothing but frames while the engines run
        out.append(received["bytes"])
        frame = json.loads(zlib.decompress(received["bytes"]))
        assert frame["type"] == "frame"
        if frame["engine"] == "continuous" and any(
            e["type"] == "finished" and e["request_id"] == request_id for e in frame["events"]
        ):
            return out
    raise AssertionError("the request never finished")


def test_each_frame_is_compressed_once_and_every_viewer_gets_the_same_bytes(demo):
    client, loop, compressed, _ = demo
    sockets = [client.websocket_connect("ws://127.0.0.1/ws") for _ in range(VIEWERS)]
    try:
        views = [ws.__enter__() for ws in sockets]
        hellos = [ws.receive() for ws in views]  # compressed too, each its own
        assert all(json.loads(zlib.decompress(h["bytes"]))["type"] == "hello" for h in hellos)
        assert compressed == []  # no frame before anything happened
        for engine in ("static", "continuous"):
            rid = loop.call(lambda e=engine: loop.engines[e].add_request([5, 6, 7], PARAMS))
            rid = rid.result(5)
        seen = [frames_until_finished(ws, rid) for ws in views]
        assert seen[0] and all(s == seen[0] for s in seen)  # the same bytes, in one order
        # each of those messages compressed once, not once per viewer
        assert seen[0] == compressed[: len(seen[0])]
        # a reply to a control is JSON text, after the frames of what came before it
        views[0].send_text(json.dumps({"type": "pause"}))
        while "bytes" in (reply := views[0].receive()):
            pass
        assert json.loads(reply["text"])["type"] == "ack"
    finally:
        for ws in sockets:
            ws.__exit__(None, None, None)


def test_browsers_that_fall_behind_together_share_one_compressed_view(demo):
    client, _, compressed, hub = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)  # the hello: the frames have started

        def fall_behind() -> list:  # in the server's loop, between two of its frames
            slow = [hub.connect() for _ in range(3)]  # browsers that never read
            for browser in slow:
                browser.outbox = asyncio.Queue(1)
                for _ in range(2):  # the second finds the outbox full
                    hub.broadcast_frames.offer(browser, b"a frame")
                hub.disconnect(browser)
            return [browser.outbox.get_nowait() for browser in slow]

        before = len(compressed)
        views = client.portal.call(fall_behind)
    assert len(compressed) == before + 1  # one view compressed for the three
    assert views[0] == views[1] == views[2] == compressed[-1]
    view = broadcast.read_message(views[0])
    assert view["type"] == "view" and {e["name"] for e in view["engines"]} == {
        "static",
        "continuous",
    }
