"""The simulated GPU's host-time term, step by step (SimulatedRunner with ``host``,
minicb/sim/host_time.py's ``step_lanes``): each step event carries the host's lanes on the
virtual clock; the device idles host / (host + device) without overlap and
max(0, host - device) / max(host, device) with it (modelled); the tokens are the same;
the picker's rebuild keeps the host model."""

from __future__ import annotations

import pytest

from minicb import EngineConfig, SamplingParams
from minicb.sim.demo import simulated_engines
from minicb.sim.host_time import HostTime

PROFILE = "H100:llama-3.1-8b"
HOST = HostTime("by hand", per_step_s=0.001, per_row_s=50e-6, source="test", schedule_share=0.4)


def _run(overlap: bool, host: HostTime | None = HOST):
    config = EngineConfig.from_kwargs(
        max_num_seqs=64, max_num_batched_tokens=512, overlap_scheduling=overlap
    )
    engine = simulated_engines(PROFILE, {"c": config}, host_time=host)["c"]
    for i in range(80):
        engine.add_request(
            [5 + i % 40] * 32, SamplingParams(max_tokens=8 + i % 16, ignore_eos=True)
        )
    steps, outputs = [], {}
    engine.bus.subscribe(steps.extend, kinds=["step"])
    for out in engine.run_until_done():
        outputs[out.request_id] = out.token_ids
    return engine, steps, outputs


@pytest.mark.parametrize("overlap", [False, True])
def test_each_step_carries_the_host_lanes_and_the_clock_moves_by_the_model(overlap):
    engine, steps, _ = _run(overlap)
    assert engine.strategy is None  # modelled by the runner, not the engine's threads
    assert engine.runner.describe()["overlap_modelled"] is overlap
    for e in steps:
        rows = len(e.plan.scheduled)
        host, device = HOST.seconds(rows), e.forward_s
        assert e.schedule_s == pytest.approx(0.4 * host)
        assert e.process_s == pytest.approx(0.6 * host)
        span = max(host, device) if overlap else host + device
        assert e.wall_end - e.wall_start == pytest.approx(span)
        wait = 0.0 if overlap else e.schedule_s
        assert e.device_start - e.wall_start == pytest.approx(wait)
    device = sum(e.forward_s + e.sample_s for e in steps)
    assert engine.busy_s == pytest.approx(sum(e.wall_end - e.wall_start for e in steps))
    idle = 1 - device / engine.busy_s
    assert idle > 0 if not overlap else idle >= 0  # device-bound here: overlap hides it all


def test_overlap_recovers_idle_time_and_the_tokens_stay_the_same():
    serial, serial_steps, serial_out = _run(False)
    overlapped, _, overlapped_out = _run(True)
    plain, plain_steps, plain_out = _run(False, host=None)
    assert serial_out == overlapped_out == plain_out
    device = sum(e.forward_s for e in serial_steps)
    assert device == pytest.approx(sum(e.forward_s for e in plain_steps))
    assert plain.busy_s == pytest.approx(device)  # no host term: the device never waits
    assert overlapped.busy_s < serial.busy_s
    assert 1 - device / overlapped.busy_s < 1 - device / serial.busy_s


def test_the_pickers_rebuild_keeps_the_host_model():
    from minicb.sim.demo import resimulate

    class Loop:  # the engine loop's part resimulate uses
        def __init__(self, engines):
            self.engines = engines

        def replace_engine(self, name, engine):
            self.engines[name] = engine

        def engine_infos(self):
            return [e.describe() for e in self.engines.values()]

    config = EngineConfig.from_kwargs(max_num_seqs=8, overlap_scheduling=True)
    loop = Loop(simulated_engines(PROFILE, {"c": config}, host_time=HOST))
    infos = resimulate(loop, "A100-80GB:llama-3.1-8b")
    assert infos[0]["runner"]["host_time"] == "by hand"
    assert loop.engines["c"].runner.overlap is True
