"""The simulated demo (``minicb demo --simulate GPU:MODEL``), without a browser: its engines
and defaults, the pacer that holds virtual time to the wall clock times a speed factor,
the picker's control, and "simulated" in every description, trace header and report.
All on simulated runners or FakeRunner: no model, no torch, and no wall-clock duration
asserted (the pacer's wall clock is the test's own)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from minicb import cli
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.core.runner.fake import FakeRunner
from minicb.driver.engine_loop import EngineLoop
from minicb.driver.pacing import MAX_TICK_S, Pacer
from minicb.server import demo_command
from minicb.server.app import create_app
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from minicb.server.replay_view import replay_info
from minicb.sim.demo import SIMULATED_WORKLOAD, simulated_engines
from minicb.telemetry.trace import TraceWriter, trace_header
from minicb.telemetry.trace_reader import read_trace
from tests.api.live import LOCAL
from tests.server.conftest import control, message

PROFILE = "H100:llama-3.1-8b"


class Wall:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def demo_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *extra])


def virtual_engine(step_time: float = 0.01) -> LLMEngine:
    clock = VirtualClock()
    runner = FakeRunner(clock=clock, step_time=step_time)
    return LLMEngine(config=EngineConfig(), runner=runner, clock=clock)


def busy(engine: LLMEngine) -> LLMEngine:
    engine.add_request([5] * 4, SamplingParams(max_tokens=50, temperature=0.0))
    return engine


# ---- the demo's engines and defaults ---------------------------------------------------
def test_simulated_demo_runs_both_engines_on_the_gpu_at_a_serving_scale():
    loop, app = demo_command.build_demo(demo_args("--simulate", PROFILE, "--speed", "4"))
    static, continuous = loop.engines["static"], loop.engines["continuous"]
    for engine in (static, continuous):
        info = engine.describe()
        assert info["simulated"] and info["runner"]["gpu"] == "H100-SXM"
        assert info["config"]["max_num_seqs"] == 256
        assert engine.kv_snapshot().num_blocks == engine.runner.num_kv_blocks > 10_000
    assert static.clock is not continuous.clock  # two GPUs side by side, two timelines
    assert loop.pacer.speed == 4.0
    assert loop.feeder.spec.max_outstanding == SIMULATED_WORKLOAD["max_outstanding"]
    hello = app.state.hub.hello()  # the engine thread is not started: read them here
    assert hello["simulation"]["gpu"] == "H100-SXM" and "A100-80GB" in hello["simulation"]["gpus"]


def test_defaults_depend_on_simulate_and_explicit_options_win():
    real = demo_args()
    demo_command.resolve_demo_defaults(real)
    assert (real.max_num_seqs, real.num_kv_blocks, real.rate) == (8, 128, 0.7)
    simulated = demo_args("--simulate", PROFILE, "--max-num-seqs", "64", "--rate", "5")
    demo_command.resolve_demo_defaults(simulated)
    assert (simulated.max_num_seqs, simulated.num_kv_blocks, simulated.rate) == (64, None, 5.0)
    assert simulated.max_num_batched_tokens == 2048


def test_a_bad_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the catalogue"):
        demo_command.build_demo(demo_args("--simulate", "H100:no-such-model"))
    with pytest.raises(ValueError, match="speed must be in"):
        Pacer(0.0)


# ---- the pacer -------------------------------------------------------------------------
def test_pacer_lets_an_engine_step_only_while_behind_wall_time_times_speed():
    wall = Wall()
    pacer = Pacer(speed=2.0, wall=wall)
    engine = busy(virtual_engine(step_time=0.03))
    engines = {"e": engine}
    pacer.advance(engines)
    assert pacer.due([("e", engine)]) == []  # no wall time has passed: nothing is due
    wall.now += 0.05  # 0.1 simulated seconds at speed 2
    pacer.advance(engines)
    steps = 0
    while pacer.due([("e", engine)]):
        engine.step()
        steps += 1
    assert steps == 4 and engine.clock() == pytest.approx(0.12)  # 0.03 s steps up to 0.1
    assert pacer.wait_s([("e", engine)]) == pytest.approx((0.12 - 0.1) / 2)


def test_an_idle_engine_keeps_time_and_a_pause_is_no_burst():
    wall = Wall()
    pacer = Pacer(speed=1.0, wall=wall)
    idle = virtual_engine()
    pacer.advance({"idle": idle})
    wall.now += 0.2
    pacer.advance({"idle": idle})
    assert idle.clock() == pytest.approx(0.2)  # an idle GPU idles in real time
    wall.now += 60.0  # paused for a minute
    pacer.advance({"idle": idle})
    assert pacer.now() == pytest.approx(0.2 + MAX_TICK_S)


def test_the_target_waits_for_an_engine_that_lags():
    wall = Wall()
    pacer = Pacer(speed=1.0, wall=wall)
    lagging = busy(virtual_engine())
    for _ in range(40):  # ten wall seconds in which the engine never steps
        wall.now += MAX_TICK_S
        pacer.advance({"lagging": lagging})
    assert pacer.now() == pytest.approx(MAX_TICK_S)  # one tick ahead of it, no more
    lagging.step()
    wall.now += MAX_TICK_S
    pacer.advance({"lagging": lagging})
    assert pacer.now() == pytest.approx(0.01 + MAX_TICK_S)


def test_engines_on_the_wall_clock_are_never_held():
    pacer = Pacer(speed=1.0, wall=Wall())
    real = busy(LLMEngine(config=EngineConfig(), runner=FakeRunner()))
    pacer.advance({"real": real})
    assert pacer.due([("real", real)]) == [("real", real)]


def test_the_engine_loop_paces_and_stamps_arrivals_in_simulated_time():
    wall = Wall()
    pacer = Pacer(speed=1.0, wall=wall)
    engine = virtual_engine(step_time=0.01)
    feeder = WorkloadFeeder(WorkloadSpec(preset="off"), clock=pacer.now, max_tick_s=MAX_TICK_S)
    feeder.burst(3)
    arrivals = []
    engine.bus.subscribe(lambda es: arrivals.extend(e.time for e in es), kinds=["arrived"])
    loop = EngineLoop({"e": engine}, feeder=feeder)
    loop.pacer = pacer
    loop.start()
    try:
        _wait(lambda: len(arrivals) == 3)
        assert engine.step_count == 0  # the wall clock has not moved: held
        loop.call(lambda: setattr(wall, "now", wall.now + 0.05)).result()
        _wait(lambda: engine.step_count == 5)  # 0.01 s steps up to 0.05 s
        rounds = loop.call(lambda: loop.rounds).result()
        assert loop.call(lambda: engine.step_count).result() == 5 and rounds >= 5
    finally:
        loop.stop()
    assert arrivals == [0.0, 0.0, 0.0]


def _wait(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the engine loop never got there"
        time.sleep(0.01)


# ---- the picker's control --------------------------------------------------------------
def _simulated_loop() -> EngineLoop:
    configs = {b: EngineConfig(batching=b, max_num_seqs=16) for b in ("static", "continuous")}
    engines = simulated_engines(PROFILE, configs)
    return EngineLoop(engines, feeder=WorkloadFeeder(WorkloadSpec(preset="off")))


def test_the_picker_rebuilds_both_engines_on_another_gpu():
    loop = _simulated_loop()
    app = create_app(loop, mode="demo", model_name="llama-3.1-8b")
    loop.start()
    try:
        with (
            TestClient(app, base_url=LOCAL) as client,
            client.websocket_connect("ws://127.0.0.1/ws") as ws,
        ):
            assert message(ws)["simulation"]["model"] == "llama-3.1-8b"
            clocks = {n: e.clock for n, e in loop.engines.items()}
            _, reply = control(ws, type="simulate", gpu="A100-80GB", model="mistral-7b")
            assert reply["type"] == "ack", reply
            for info in reply["engines"]:
                assert info["simulated"] and info["runner"]["gpu"] == "A100-80GB"
                assert info["model"] == "mistral-7b" and info["config"]["max_num_seqs"] == 16
            assert all(loop.engines[n].clock is c for n, c in clocks.items())
            _, reply = control(ws, type="simulate", gpu="H100-SXM", model="/etc")
            assert reply["type"] == "error" and "model must be one of" in reply["message"]
            _, reply = control(ws, type="simulate", gpu="L4", model="llama-3.1-70b")
            assert reply["type"] == "error" and "leave no room" in reply["message"]
            assert loop.engines["static"].describe()["runner"]["gpu"] == "A100-80GB"
            _, reply = control(ws, type="pace", speed=0.5)
            assert reply["type"] == "error" and "--simulate demo" in reply["message"]
    finally:
        loop.stop()


def test_the_speed_factor_changes_from_the_page():
    loop, app = demo_command.build_demo(demo_args("--simulate", PROFILE, "--paused"))
    loop.start()
    try:
        with (
            TestClient(app, base_url=LOCAL) as client,
            client.websocket_connect("ws://127.0.0.1/ws") as ws,
        ):
            assert message(ws)["simulation"]["speed"] == 1.0
            _, reply = control(ws, type="pace", speed=0.25)
            assert reply["type"] == "ack" and loop.pacer.speed == 0.25
            _, reply = control(ws, type="pace", speed=0)
            assert reply["type"] == "error" and "speed must be" in reply["message"]
    finally:
        loop.stop()


def test_the_picker_is_refused_on_a_real_model():
    engines = {"continuous": LLMEngine(config=EngineConfig(), runner=FakeRunner())}
    loop = EngineLoop(engines, feeder=WorkloadFeeder(WorkloadSpec(preset="off")))
    app = create_app(loop, mode="demo", model_name="fake")
    loop.start()
    try:
        with (
            TestClient(app, base_url=LOCAL) as client,
            client.websocket_connect("ws://127.0.0.1/ws") as ws,
        ):
            assert message(ws)["simulation"] is None
            _, reply = control(ws, type="simulate", gpu="H100-SXM", model="llama-3.1-8b")
            assert reply["type"] == "error" and "--simulate" in reply["message"]
    finally:
        loop.stop()


# ---- "simulated" in traces and reports -------------------------------------------------
def _simulated_trace(tmp_path: Path) -> Path:
    """The trace of a short run on a simulated H100, as ``minicb demo --trace`` writes it."""
    engine = _simulated_loop().engines["continuous"]
    path = tmp_path / "sim.jsonl"
    writer = TraceWriter(path, trace_header(engine, command="demo", panel="continuous"))
    engine.bus.subscribe(writer)
    engine.add_request([5] * 8, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.run_until_done()
    writer.close()
    return path


def test_traces_and_the_replay_report_say_simulated(tmp_path, capsys):
    assert trace_header(virtual_engine())["simulated"] is False
    path = _simulated_trace(tmp_path)
    trace = read_trace(path)
    assert trace.header["simulated"] and trace.header["hardware"]["profile"]
    info = replay_info("continuous", trace)
    assert info["simulated"] and info["runner"]["gpu"] == "H100-SXM"
    assert cli.main(["replay", str(path)]) == 0
    assert "SIMULATED (H100-SXM:llama-3.1-8b)" in capsys.readouterr().out
    assert json.loads(path.read_text().splitlines()[0])["simulated"] is True


def test_a_replayed_simulated_trace_is_described_as_simulated(tmp_path):
    app = create_app(
        None, mode="replay", replay={"continuous": read_trace(_simulated_trace(tmp_path))}
    )
    [info] = app.state.hub.hello()["engines"]
    assert info["simulated"] and info["runner"]["profile"] == "H100-SXM:llama-3.1-8b"
