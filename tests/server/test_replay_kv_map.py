"""A trace recorded from a live engine replays to the same KV block map: the map a live
page rebuilds from the frames (its view, then each step digest's kv_ops), the engine's own
``kv_snapshot()`` at that moment, and the map the replayed trace rebuilds are the same at
every iteration, block ids compared, swap space and cached blocks included: for a run on
the engine's fake model and for one on a simulated H100."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from minicb import EngineConfig, LLMEngine, SamplingParams, VirtualClock
from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.telemetry.kv_state import KVState
from minicb.telemetry.trace import record_trace
from minicb.telemetry.trace_reader import read_trace
from tests.server.conftest import events_until, fake_engine, message

# A pool too small for everyone at once, preempting by swap, with prefix caching: blocks
# move around, are freed, cached, swapped out and back in, so a map drawn from counts
# alone would differ.
CONFIG = dict(
    num_kv_blocks=12, block_size=4, max_num_seqs=4, preemption_mode="swap",
    enable_prefix_caching=True,
)  # fmt: skip
PROMPTS = [[5] * n for n in (7, 3, 11, 5, 9)]
PARAMS = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)


def simulated_engine(**config) -> LLMEngine:
    clock = VirtualClock()
    cfg = EngineConfig.from_kwargs(**config)
    runner = SimulatedRunner("H100:llama-3.1-8b", cfg, clock=clock)
    return LLMEngine(config=cfg, runner=runner, clock=clock)


def maps(kv: KVState, events) -> dict[int, tuple]:
    """Step number -> the map after it, from ``kv`` changed by each digest's kv_ops."""
    out = {}
    for e in events:
        if e["type"] == "kv_snapshot":
            kv = KVState(e["block_tables"], e["swap_tables"], e["cached_blocks"])
        elif e["type"] == "step":
            kv.apply(e["kv_ops"])
            out[e["step"]] = kv.copy().as_tuple()
    return out


@pytest.mark.parametrize("make", [fake_engine, simulated_engine], ids=["fake", "simulated"])
def test_a_replayed_trace_draws_the_live_kv_map(tmp_path, make):
    engine = make(**CONFIG)
    snapshots = {}  # step -> the engine's own view, read in the engine thread after the step
    engine.bus.subscribe(
        lambda es: snapshots.update({e.plan.step: _own(engine.kv_snapshot()) for e in es}),
        kinds=["step"],
    )
    loop = EngineLoop({"continuous": engine})
    app = create_app(loop, mode="demo", model_name="fake")
    path = tmp_path / "run.jsonl"
    loop.paused = True  # everyone arrives before the first step: the pool is contended at once
    loop.start()
    try:
        with (
            TestClient(app, base_url="http://127.0.0.1") as client,
            client.websocket_connect("ws://127.0.0.1/ws") as ws,
        ):
            view = message(ws)["engines"][0]["kv"]  # hello: the map the page starts from
            with record_trace(engine, path):
                for prompt in PROMPTS:
                    loop.call(lambda p=prompt: engine.add_request(p, PARAMS)).result(5)
                loop.resume()
                finished = set()

                def all_done(_, e):
                    if e["type"] == "finished":
                        finished.add(e["request_id"])
                    return len(finished) == len(PROMPTS)

                live = [e for _, e in events_until(ws, all_done)]
    finally:
        loop.stop()

    start = KVState(view["block_tables"], view["swap_tables"], view["cached_blocks"])
    live_maps = maps(start, live)
    assert list(live_maps) == list(range(1, len(live_maps) + 1))  # every step, none dropped
    assert any(swap for _, swap, _ in live_maps.values()), "no swap happened: a weak test"
    assert any(cached for _, _, cached in live_maps.values()), "nothing cached: a weak test"
    assert live_maps == snapshots

    trace = read_trace(path)
    replay_app = create_app(None, mode="replay", replay={"continuous": trace})
    with (
        TestClient(replay_app, base_url="http://127.0.0.1") as rc,
        rc.websocket_connect("ws://127.0.0.1/ws") as ws,
    ):
        assert message(ws)["type"] == "hello"
        replay = message(ws)
    events = replay["traces"]["continuous"]["events"]
    assert maps(KVState(), events) == live_maps
    # each row's block count agrees with the map: the map and the rows are one picture
    rows = {(e["step"], tuple(r)) for e in live if e["type"] == "step" for r in e["rows"]}
    assert rows == {(e["step"], tuple(r)) for e in events if e["type"] == "step" for r in e["rows"]}


def _own(kv) -> tuple:
    return kv.block_tables, kv.swap_tables, kv.cached_blocks
