"""A trace recorded from a live engine replays to the same KV block map: the block ids the
live /ws stream delivered after each step, the engine's own ``kv_snapshot()`` at that
moment, and those of the replayed trace are the same, swap space included."""

from __future__ import annotations

from fastapi.testclient import TestClient

from minicb import SamplingParams
from minicb.server.app import create_app
from minicb.server.engine_loop import EngineLoop
from minicb.telemetry.trace import read_trace, record_trace
from tests.server.conftest import events_until, fake_engine

# A pool too small for everyone at once, preempting by swap: blocks move around, are
# freed, swapped out and back in, so a map drawn from counts alone would differ.
CONFIG = dict(num_kv_blocks=12, block_size=4, max_num_seqs=4, preemption_mode="swap")
PROMPTS = [[5] * n for n in (7, 3, 11, 5, 9)]
PARAMS = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)


def maps(step_dicts):
    """Step number -> (device block tables, swap block tables), as the events give them."""
    return {e["step"]: (e["block_tables"], e["swap_tables"]) for e in step_dicts}


def snapshot_map(kv):
    """A KVSnapshot in the events' form (request ids as strings, as JSON has them)."""
    device = {str(r): t for r, t in kv.block_tables.items()}
    return device, {str(r): t for r, t in kv.swap_tables.items()}


def test_a_replayed_trace_draws_the_live_kv_map(tmp_path):
    engine = fake_engine(**CONFIG)
    snapshots = {}  # step -> the engine's own view, read in the engine thread after the step
    engine.bus.subscribe(
        lambda e: snapshots.update({e.plan.step: snapshot_map(engine.kv_snapshot())}),
        kinds=["step"],
    )
    loop = EngineLoop({"continuous": engine})
    app = create_app(loop, mode="demo", model_name="fake")
    path = tmp_path / "run.jsonl"
    loop.paused = True  # everyone arrives before the first step: the pool is contended at once
    loop.start()
    try:
        with TestClient(app) as client, client.websocket_connect("/ws") as ws:
            ws.receive_json()  # hello
            with record_trace(engine, path):
                for prompt in PROMPTS:
                    loop.call(lambda p=prompt: engine.add_request(p, PARAMS)).result(5)
                loop.resume()
                finished = set()

                def all_done(_, e):
                    if e["type"] == "finished":
                        finished.add(e["request_id"])
                    return len(finished) == len(PROMPTS)

                live = [e for _, e in events_until(ws, all_done) if e["type"] == "step"]
    finally:
        loop.stop()

    live_maps = maps(live)
    assert list(live_maps) == list(range(1, len(live) + 1))  # every step, none dropped
    assert any(swap for _, swap in live_maps.values()), "no swap happened: a weak test"
    assert live_maps == snapshots

    trace = read_trace(path)
    replay_app = create_app(None, mode="replay", replay={"continuous": trace})
    with TestClient(replay_app) as rc, rc.websocket_connect("/ws") as ws:
        assert ws.receive_json()["type"] == "hello"
        replay = ws.receive_json()
    events = replay["traces"]["continuous"]["events"]
    assert maps(e for e in events if e["type"] == "step") == live_maps
    # each row's own block ids agree too: the map and the rows are one picture
    rows = {(e["step"], r["request_id"]): r["block_table"] for e in live for r in e["scheduled"]}
    replayed = {
        (e["step"], r["request_id"]): r["block_table"]
        for e in events
        if e["type"] == "step"
        for r in e["scheduled"]
    }
    assert replayed == rows
