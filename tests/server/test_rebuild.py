"""A rebuild (the demo's settings control) reaches every subscriber through the engine's
bus: the browser gets a "reset" event in order with the engine's events (the old
requests' aborts before it, the new engine's ids and steps from the start after it), an
open token stream ends with "abort", and the waiting-queue gate, the Prometheus metrics
and new token streams go on working on the new engine. A demo's trace stops at the
rebuild, so it never mixes the old engine's requests with the new one's."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient

from minicb import SamplingParams
from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from minicb.server.engine_rebuild import rebuild_engines
from minicb.server.openai_api import install_openai_routes
from minicb.telemetry.trace_files import record_traces, trace_paths
from minicb.telemetry.trace_reader import read_trace
from tests.api.live import LOCAL, metric
from tests.helpers import wait_for
from tests.server.conftest import control, events_until, fake_engine, message

BODY = {"model": "fake", "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}


@pytest.fixture
def demo():
    engines = {"static": fake_engine("static"), "continuous": fake_engine()}
    loop = EngineLoop(engines, feeder=WorkloadFeeder(WorkloadSpec(preset="off")))
    app = create_app(loop, mode="demo", model_name="fake")
    routes = install_openai_routes(app, loop, "continuous", "fake", max_waiting=2)
    loop.start()
    with TestClient(app, base_url=LOCAL) as client:
        yield client, loop, routes
    loop.stop()


def in_thread(fn):
    """Run ``fn()`` in a thread; returns a function that joins it and gives its result."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    thread.start()

    def join():
        thread.join(20)
        assert not thread.is_alive(), "the request never ended"
        return out["result"]

    return join


def sse_chunks(client, body):
    text = client.post("/v1/completions", json={**body, "stream": True}).text
    return [json.loads(x[6:]) for x in text.split("\n\n") if x.startswith("data: {")], text


def test_a_rebuild_resets_in_order_and_every_subscriber_goes_on(demo):
    client, loop, routes = demo
    with client.websocket_connect("ws://127.0.0.1/ws") as ws:
        message(ws)
        control(ws, type="pause")
        held = in_thread(lambda: sse_chunks(client, {**BODY, "max_tokens": 50}))
        wait_for(lambda: routes.gate.waiting == 1)
        before, reply = control(ws, type="settings", max_num_seqs=2, num_kv_blocks=24)
        assert reply["type"] == "ack", reply
        assert [e["config"]["max_num_seqs"] for e in reply["engines"]] == [2, 2]
        chunks, text = held()
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"  # the old stream ended
        assert text.endswith("data: [DONE]\n\n")
        control(ws, type="resume")
        after = sse_chunks(client, BODY)[0]  # a new stream on the new engine
        seen = before + events_until(ws, lambda n, e: e["type"] == "finished")

    mine = [e for n, e in seen if n == "continuous"]
    kinds = [e["type"] for e in mine]
    reset = kinds.index("reset")
    assert kinds.count("reset") == 1 and kinds[:reset] == ["arrived", "aborted"]
    assert mine[reset]["info"]["config"]["num_kv_blocks"] == 24
    assert mine[reset]["info"]["step"] == 0 and mine[reset]["info"]["kv_total"] == 24
    new = mine[reset + 1 :]
    assert new[0]["type"] == "arrived" and new[0]["request_id"] == 0  # ids start again
    assert [e["step"] for e in new if e["type"] == "step"][0] == 1  # and step numbers
    assert "reset" in [e["type"] for n, e in seen if n == "static"]
    tokens = [c["choices"][0]["text"] for c in after]
    assert len(tokens) == 5 and after[-1]["choices"][0]["finish_reason"] == "length"

    # the gate counts the new engine's queue: two wait, the third is refused
    loop.pause()
    waiting = [in_thread(lambda: client.post("/v1/completions", json=BODY)) for _ in range(2)]
    wait_for(lambda: routes.gate.waiting == 2)
    refused = client.post("/v1/completions", json=BODY)
    assert refused.status_code == 429 and "2 requests waiting" in refused.text
    loop.resume()
    assert [w().status_code for w in waiting] == [200, 200]
    assert routes.gate.waiting == 0 and not routes.gate.in_transit

    # Prometheus heard both engines on the one bus: the abort, then the new requests
    page = client.get("/metrics").text
    done = 'minicb:request_success_total{finished_reason="length",model_name="fake"}'
    aborted = 'minicb:request_success_total{finished_reason="abort",model_name="fake"}'
    assert metric(page, done) == 3 and metric(page, aborted) == 1
    assert metric(page, "minicb:generation_tokens_total") == 12
    assert metric(page, "minicb:num_requests_waiting") == 0
    assert metric(page, "minicb:num_requests_running") == 0
    assert metric(page, "minicb:kv_cache_usage_perc") == 0.0


def test_a_demo_trace_stops_at_the_rebuild_and_never_mixes_two_engines(tmp_path):
    loop = EngineLoop({"static": fake_engine("static"), "continuous": fake_engine()})
    close = record_traces(dict(loop.engines), trace_paths(str(tmp_path / "demo.jsonl")), "demo")
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for engine in loop.engines.values():
        engine.add_request([5, 6], params)
        engine.step()
    rebuild_engines(loop, {"max_num_seqs": 2})
    for engine in loop.engines.values():  # the new engines' events go nowhere near the files
        engine.add_request([5, 6], params)
        engine.run_until_done()
    close()
    for name, path in trace_paths(str(tmp_path / "demo.jsonl")).items():
        trace = read_trace(path)
        assert trace.header["panel"] == name
        kinds = [e.kind for e in trace.events]
        # a trace opens with the KV map as it stood (schema 3), then the first request; it
        # ends with the request the rebuild aborted, and its blocks freed at once
        assert kinds[:2] == ["kv_snapshot", "arrived"] and kinds[-2:] == ["aborted", "kv_changes"]
        assert "reset" not in kinds
        assert [e.plan.step for e in trace.events if e.kind == "step"] == [1]


def test_a_pool_beyond_free_memory_is_refused_on_the_real_runner(tiny_llama_dir, monkeypatch):
    """The model runner's own bytes per block, against what the machine says is free (here
    64 MiB): refused before anything is rebuilt, naming the limit; a pool that fits goes."""
    from minicb import EngineConfig, LLMEngine
    from minicb.server import engine_rebuild
    from minicb.server.control_fields import ControlError

    engine = LLMEngine(tiny_llama_dir, EngineConfig(num_kv_blocks=16))
    per_block = engine.describe()["runner"]["bytes_per_block"]
    monkeypatch.setattr(engine_rebuild, "_free_bytes", lambda device: 64 << 20)
    loop = EngineLoop({"continuous": engine})
    too_many = (64 << 20) // per_block  # the pool and its swap twin: twice the free memory
    with pytest.raises(ControlError, match="over the limit of 80% of the 0.06 GiB free"):
        rebuild_engines(loop, {"num_kv_blocks": too_many})
    assert loop.engines["continuous"] is engine  # nothing rebuilt
    infos = rebuild_engines(loop, {"num_kv_blocks": too_many // 4})
    assert infos[0]["kv_total"] == too_many // 4
