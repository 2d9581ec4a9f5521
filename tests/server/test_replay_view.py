"""``minicb replay --serve`` with several pages at once, on a live server (127.0.0.1): the
traces' messages are built once per text class, in a thread, and sent in pieces; ``/``
answers while they build; each page gets the whole fold, as its class may read it.

The fast test holds the build at a gate (so "while it builds" is certain, not a race);
the slow one replays a trace big enough that a build takes seconds, with no gate."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.server import replay_view
from minicb.server.app import create_app
from minicb.server.guard import Guard
from minicb.server.redaction import redact_event
from minicb.telemetry.trace_reader import Trace
from tests.api.live import live_server
from tests.server.conftest import CharTokenizer, receive, ws_connect

KEY, VIEWER_KEY = "sk-teacher", "room-42"
PAGES = (KEY, KEY, VIEWER_KEY, VIEWER_KEY)  # two text classes, two pages each
# `/` answers within this while the traces build: an idle server answers in ~10 ms, or up to
# a second on two cores shared with a dozen busy processes
ANSWER_S = 2.0


def recorded(requests: int) -> Trace:
    """A fake engine's run of ``requests`` prompts, as a trace read back would hold it."""
    runner = FakeRunner(
        num_kv_blocks=256, tokenizer=CharTokenizer(), token_fn=lambda rid, i: 65 + i % 26
    )
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=256, max_num_seqs=32), runner=runner)
    events: list = []
    engine.bus.subscribe(events.extend)
    for i in range(requests):
        engine.add_request(f"secret prompt {i}", SamplingParams(max_tokens=40, ignore_eos=True))
    engine.run_until_done()
    return Trace({"model": "fake", "config": engine.config.to_dict()}, events)


class Page(threading.Thread):
    """One page: connects with ``key``, reads its hello, then every replay piece."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.hello = threading.Event()
        self.pieces: list[dict] = []
        self.done_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with ws_connect(f"{self.url}?key={self.key}") as ws:
                assert receive(ws)["type"] == "hello"
                self.hello.set()
                while not self.pieces or not self.pieces[-1]["last"]:
                    self.pieces.append(receive(ws, timeout=120))
                self.done_at = time.monotonic()
        except BaseException as err:  # told to the test, which asserts on it
            self.error = err
            self.hello.set()

    def events(self, panel: str = "continuous") -> list[dict]:
        assert [p["piece"] for p in self.pieces] == list(range(len(self.pieces)))
        return [e for p in self.pieces for e in p["traces"][panel]["events"]]


def open_pages(ws_url: str) -> list[Page]:
    pages = [Page(ws_url, key) for key in PAGES]
    for page in pages:
        page.start()
    for page in pages:
        assert page.hello.wait(30) and page.error is None, page.error
    return pages


def test_the_replay_is_built_once_per_class_off_the_loop_and_sent_in_pieces(monkeypatch):
    trace = recorded(40)
    gate = threading.Event()
    real = replay_view.replay_events

    def held(name, t):  # a build waits here until the test has asked for `/`
        assert gate.wait(30)
        return real(name, t)

    monkeypatch.setattr(replay_view, "replay_events", held)
    monkeypatch.setattr(replay_view, "REPLAY_PIECE_BYTES", 8 * 1024)  # several pieces
    app = create_app(
        None, mode="replay", replay={"continuous": trace}, guard=Guard(KEY, VIEWER_KEY)
    )
    with live_server(app) as url:
        pages = open_pages("ws" + url.removeprefix("http") + "/ws")
        t0 = time.monotonic()
        page = httpx.get(url + "/", timeout=30)
        answered = time.monotonic() - t0
        assert page.status_code == 200 and answered < ANSWER_S
        assert not any(p.pieces for p in pages)  # the builds were still held
        gate.set()
        for p in pages:
            p.join(60)
            assert p.error is None and p.done_at is not None, p.error
    assert app.state.hub.replay_views.builds == 2  # four pages, two text classes
    folded = json.loads(json.dumps(real("continuous", trace)))
    controller, viewer = pages[0], pages[2]
    assert len(controller.pieces) > 1 and controller.pieces == pages[1].pieces
    assert controller.events() == folded  # whole, in order, over the pieces
    assert viewer.events() == [json.loads(json.dumps(redact_event(e))) for e in folded]
    assert "secret prompt" in json.dumps(controller.pieces)
    assert "secret prompt" not in json.dumps(viewer.pieces)


@pytest.mark.slow
def test_a_big_replay_leaves_the_page_answering_while_it_builds():
    """3,000 requests (about 20,000 events): a class's build takes seconds on two cores.
    `/` is asked for again and again until the first page has its replay: several answers
    come meanwhile, most within ANSWER_S. Before, each page folded, redacted, encoded and
    compressed the traces on the event loop: `/` waited for them (6.3 s for a 47 MB trace
    and 3 pages; here the pages' own handshakes timed out)."""
    trace = recorded(3000)
    app = create_app(
        None, mode="replay", replay={"continuous": trace}, guard=Guard(KEY, VIEWER_KEY)
    )
    with live_server(app) as url:
        pages = open_pages("ws" + url.removeprefix("http") + "/ws")
        waits = []
        while all(p.done_at is None for p in pages):
            t0 = time.monotonic()
            assert httpx.get(url + "/", timeout=120).status_code == 200
            waits.append(time.monotonic() - t0)
        for p in pages:
            p.join(300)
            assert p.error is None and p.done_at is not None, p.error
    assert len(waits) >= 3 and sorted(waits)[len(waits) // 2] < ANSWER_S, waits
    assert app.state.hub.replay_views.builds == 2
    assert all(len(p.pieces) > 1 for p in pages)
    assert len(pages[0].events()) == len(pages[2].events())
