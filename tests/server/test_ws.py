"""The /ws protocol, through FastAPI's TestClient: events arrive in order, controls act
(one step is exactly one iteration, pause holds), a disconnected or slow browser never
disturbs the engine, and malformed controls get an error and change nothing."""

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from minicb import EngineConfig, LLMEngine, SamplingParams
from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.server.broadcast import read_message
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from minicb.speculation.settings import SpeculationSettings
from minicb.telemetry.kv_state import KVState
from minicb.telemetry.trace_reader import Trace
from tests.api.live import LOCAL
from tests.helpers import wait_for
from tests.server.conftest import control, events_until, message

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture
def demo(tiny_llama_dir):
    """A demo's pieces on the tiny model: two engines on one copy of the weights, an idle
    feeder, the app."""
    cfg = dict(num_kv_blocks=32, max_num_seqs=4)
    continuous = LLMEngine(tiny_llama_dir, EngineConfig.from_kwargs(**cfg))
    static_cfg = EngineConfig.from_kwargs(batching="static", **cfg)
    static = LLMEngine(config=static_cfg, runner=continuous.runner.with_config(static_cfg))
    feeder = WorkloadFeeder(WorkloadSpec(preset="off"))
    loop = EngineLoop({"static": static, "continuous": continuous}, feeder=feeder)
    loop.start()
    app = create_app(loop, mode="demo", model_name="tiny")
    with TestClient(app, base_url=LOCAL) as client:
        yield client, loop, app
    loop.stop()


def add(loop, engine, prompt=(5, 6, 7), params=PARAMS):
    return loop.call(lambda: loop.engines[engine].add_request(list(prompt), params)).result(5)


def rounds_over_passes(loop, passes: int = 20) -> set[int]:
    """``loop.rounds`` as read in the engine thread by ``passes`` commands, each sent only
    after the previous one ran, so the loop goes round between them: a round that ran
    (while paused, say) shows as a second value. No sleep: the loop's passes are the window."""
    return {loop.call(lambda: loop.rounds).result(5) for _ in range(passes)}


def idle(loop, engine: str) -> bool:
    return not loop.call(loop.engines[engine].has_unfinished).result(5)


def test_hello_then_events_in_order_for_each_engine(demo):
    client, loop, _ = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        hello = message(ws)
        assert hello["type"] == "hello" and hello["mode"] == "demo"
        assert [e["name"] for e in hello["engines"]] == ["static", "continuous"]
        for engine in ("static", "continuous"):
            for i in range(3):
                add(loop, engine, (5, 6, 7 + i))
        finished = {"static": 0, "continuous": 0}

        def all_done(engine, e):
            finished[engine] += e["type"] == "finished"
            return all(n == 3 for n in finished.values())

        seen = events_until(ws, all_done)
    for engine in ("static", "continuous"):
        mine = [e for n, e in seen if n == engine]
        steps = [e["step"] for e in mine if e["type"] == "step"]
        assert steps == list(range(1, len(steps) + 1))  # every iteration, in order
        for rid in range(3):
            kinds = [e["type"] for e in mine if rid in e.get("request_ids", [e.get("request_id")])]
            assert kinds[0] == "arrived" and kinds[-1] == "finished"
            assert kinds.index("admitted") < kinds.index("first_token") < kinds.index("tokens")
            tokens = [
                index
                for e in mine
                if e["type"] == "tokens"
                for r, index in zip(e["request_ids"], e["indexes"], strict=True)
                if r == rid
            ]
            assert tokens == [0, 1, 2, 3]
        # every step digest of this small pool carries its KV changes (block ids): applied
        # from the empty pool, 3 prompt tokens + 4 new fit one 16-token block: each request
        # holds one block of the 32, its own, as many as its row says, until it finishes.
        stepped = [e for e in mine if e["type"] == "step"]
        state, held = KVState(), []
        for e in stepped:
            state.apply(e["kv_ops"])
            tables = state.block_tables
            assert all(len(t) == 1 and 0 <= t[0] < 32 for t in tables.values()), tables
            assert len({t[0] for t in tables.values()}) == len(tables)  # nobody shares
            assert e["useful_rows"] == len(e["rows"]) <= 3 and e["padding_rows"] == 0
            held.append(set(tables))
        assert set().union(*held) == {0, 1, 2} and held[-1] == set()


def test_step_runs_exactly_one_iteration_and_explains_it(demo):
    client, loop, _ = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        _, reply = control(ws, type="pause")
        assert reply == {"type": "ack", "control": "pause", "paused": True}
        for engine in ("static", "continuous"):
            add(loop, engine)
        before = loop.rounds
        events, reply = control(ws, type="step", id=7)
        assert reply["type"] == "ack" and reply["id"] == 7 and reply["round"] == before + 1
        assert loop.rounds == before + 1
        assert set(reply["explain"]) == {"static", "continuous"}
        assert any("admitted" in line for line in reply["explain"]["continuous"])
        assert rounds_over_passes(loop) == {before + 1}  # and no second one after it
        # frames come a dozen times a second: wait for both engines' step, then a barrier
        got = {n for n, e in events if e["type"] == "step"}
        if len(got) < 2:
            is_step = lambda n, e: e["type"] == "step" and not got.add(n)  # noqa: E731
            events += events_until(ws, lambda n, e: is_step(n, e) and len(got) == 2)
        more, _ = control(ws, type="speed", delay_s=0.0)
        events += more
        steps = [(n, e["step"]) for n, e in events if e["type"] == "step"]
        assert sorted(steps) == [("continuous", 1), ("static", 1)]
        for engine in loop.engines.values():
            assert engine.step_count == 1


def test_pause_holds_and_resume_goes_on(demo):
    client, loop, _ = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        control(ws, type="pause")
        add(loop, "continuous")
        rounds = loop.rounds
        assert rounds_over_passes(loop) == {rounds}
        events, _ = control(ws, type="speed", delay_s=0.0)
        assert loop.rounds == rounds
        assert not [e for _, e in events if e["type"] == "step"]
        _, reply = control(ws, type="resume")
        assert reply["paused"] is False
        events_until(ws, lambda n, e: e["type"] == "finished")


def test_a_disconnected_client_is_dropped_and_the_engine_goes_on(demo):
    client, loop, app = demo
    hub = app.state.hub
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        add(loop, "continuous", params=SamplingParams(max_tokens=40, ignore_eos=True))
        events_until(ws, lambda n, e: e["type"] == "tokens")
    wait_for(lambda: not hub.clients)
    # the browser's subscriptions are forgotten: nobody else on the buses asks for arrivals
    assert all(not e.bus.wants("arrived") for e in loop.engines.values())
    with client.websocket_connect(
        "ws://127.0.0.1/ws"
    ) as ws:  # the engine serves the next one as before
        message(ws)
        add(loop, "continuous")
        events_until(ws, lambda n, e: e["type"] == "finished" and e["request_id"] == 1)
    assert loop.alive and loop.error is None


def test_a_slow_client_gets_a_view_instead_of_a_backlog_and_never_slows_the_engine(demo):
    client, loop, app = demo
    hub = app.state.hub
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:  # starts the frames
        message(ws)
        slow = hub.connect()  # a browser that never reads: its outbox holds 2 messages
        slow.outbox = asyncio.Queue(2)
        frame = json.dumps({"type": "frame", "engine": "continuous", "events": []})
        for _ in range(3):  # the third finds the outbox full
            hub.broadcast_frames.offer(slow, frame)
        # its backlog was replaced by one view of the engines, whole and decodable
        assert slow.resyncs == 1 and slow.outbox.qsize() == 1
        view = read_message(slow.outbox.get_nowait())  # compressed, as a frame
        assert view["type"] == "view"
        assert {e["name"] for e in view["engines"]} == {"static", "continuous"}
        hub.disconnect(slow)
        # meanwhile the reading browser gets every iteration of the engine
        params = SamplingParams(max_tokens=30, ignore_eos=True)
        for i in range(6):
            add(loop, "continuous", (5, 6, i + 3), params)
        seen = events_until(
            ws, lambda n, e: n == "continuous" and e["type"] == "finished" and e["request_id"] == 5
        )
        steps = [e["step"] for n, e in seen if n == "continuous" and e["type"] == "step"]
        assert steps == list(range(1, len(steps) + 1))


BAD = [
    "{not json",
    "[1, 2]",
    '{"type": 3}',
    '{"type": "launch"}',
    '{"type": "pause", "now": true}',
    '{"type": "speed"}',
    '{"type": "speed", "delay_s": "fast"}',
    '{"type": "speed", "delay_s": -1}',
    '{"type": "workload", "preset": "tsunami"}',
    '{"type": "workload", "preset": "burst", "count": 0}',
    '{"type": "settings"}',
    '{"type": "settings", "max_num_seqs": 0}',
    '{"type": "settings", "max_num_seqs": 2, "colour": "red"}',
    '{"type": "settings", "enable_chunked_prefill": "yes"}',
    '{"type": "settings", "enable_prefix_caching": 1}',
    '{"type": "settings", "policy": "lottery"}',
    '{"type": "settings", "speculative": "draft"}',
    '{"type": "prompt", "text": ""}',
    '{"type": "prompt", "text": "hi", "target": "mars"}',
    '{"type": "prompt", "text": "hi", "max_tokens": 0}',
]


def test_malformed_controls_get_an_error_and_change_nothing(demo):
    client, loop, app = demo
    hub = app.state.hub
    engines = dict(loop.engines)
    spec = hub.feeder.spec
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        for text in BAD:
            ws.send_text(text)
            reply = message(ws)
            assert reply["type"] == "error" and reply["message"], text
        _, reply = control(ws, type="speed", delay_s=0.0)
        assert reply["type"] == "ack"  # the connection survived all of them
    assert loop.engines == engines and not loop.paused and loop.delay_s == 0.0
    assert hub.feeder.spec is spec
    assert loop.call(lambda: [e.live_requests() for e in loop.engines.values()]).result(5) == [
        [],
        [],
    ]


def test_settings_rebuild_both_engines_on_the_same_weights(demo):
    client, loop, _ = demo
    old = dict(loop.engines)
    weights = old["continuous"].runner.model
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        events, reply = control(
            ws,
            type="settings",
            max_num_seqs=2,
            preemption_mode="swap",
            enable_prefix_caching=False,
            speculative="ngram",
        )
        assert reply["type"] == "ack", reply
        assert [e["config"]["max_num_seqs"] for e in reply["engines"]] == [2, 2]
        for name, engine in loop.engines.items():
            assert engine is not old[name] and engine.runner.model is weights
            assert engine.config.batching == old[name].config.batching
            assert engine.config.preemption_mode == "swap"
            assert engine.config.enable_prefix_caching is False
            assert SpeculationSettings.of(engine.config).speculative == "ngram"
        add(loop, "continuous")
        resets = [n for n, e in events if e["type"] == "reset"]
        seen = events_until(ws, lambda n, e: e["type"] == "finished")
        resets += [n for n, e in seen if e["type"] == "reset"]
        assert sorted(resets) == ["continuous", "static"]


def test_prompt_and_workload_controls_add_requests(demo):
    client, loop, _ = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        seen, reply = control(ws, type="prompt", text="hello", target="continuous", max_tokens=3)
        assert reply["type"] == "ack" and set(reply["ids"]) == {"continuous"}
        if not any(e["type"] == "finished" for _, e in seen):
            seen += events_until(ws, lambda n, e: e["type"] == "finished")
        assert {n for n, e in seen if e["type"] == "arrived"} == {"continuous"}
        early, reply = control(ws, type="workload", preset="burst", count=3, lengths="short")
        assert reply["workload"]["preset"] == "burst"
        arrived = {"static": [], "continuous": []}

        def three_each(n, e):
            if e["type"] == "arrived":
                arrived[n].append((e["num_prompt_tokens"], e["max_tokens"]))
            return all(len(v) == 3 for v in arrived.values())

        if not any(three_each(n, e) for n, e in early):
            events_until(ws, three_each)
        assert arrived["static"] == arrived["continuous"]  # the same workload for both


def test_pages_and_plotly_are_served(demo):
    client, _, _ = demo
    page = client.get("/")
    assert page.status_code == 200 and 'src="/viz/app.js"' in page.text
    assert client.get("/viz/app.js").status_code == 200
    js = client.get("/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000


def test_replay_mode_sends_the_whole_trace(demo, tmp_path):
    client, loop, app = demo
    from minicb.telemetry.trace import record_trace
    from minicb.telemetry.trace_reader import read_trace

    path = tmp_path / "run.jsonl"
    with record_trace(loop.engines["continuous"], path):
        add(loop, "continuous")
        wait_for(lambda: idle(loop, "continuous"))
    trace: Trace = read_trace(path)
    replay_app = create_app(None, mode="replay", replay={"continuous": trace})
    with (
        TestClient(replay_app, base_url=LOCAL) as rc,
        rc.websocket_connect("ws://127.0.0.1/ws") as ws,
    ):
        hello = message(ws)
        assert hello["mode"] == "replay" and hello["controls"]["step"] is False
        msg = message(ws)
        assert msg["type"] == "replay"
        assert len(msg["traces"]["continuous"]["events"]) == len(trace.events)
        _, reply = control(ws, type="step")
        assert reply["type"] == "error" and "replay" in reply["message"]
