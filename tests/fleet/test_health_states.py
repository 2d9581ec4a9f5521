"""/health tells the truth for fleets: 503, with the reason in the body, in each state where
a request could not be served (no replica serving; disaggregated, no prefill or no decode
engine; every replica's latest step failed), and 200 "degraded" naming the replica that is
out while the others serve.

Fast: the fleets' own decisions (``Fleet.unavailable``/``health``, the disaggregated
fleet's ``DisaggregatedFleet.unavailable``/``health``) over stand-ins that say what a Replica
says of itself (``serving``, ``health()``), each over a real engine on FakeRunner so the
server's loop steps it. The real replicas' silence, death and restart are
test_replica_stall.py's (processes, slow).
"""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from minicb import EngineConfig, FakeRunner, LLMEngine, SamplingParams
from minicb.driver.engine_loop import EngineLoop
from minicb.fleet.disagg_fleet import DisaggregatedFleet
from minicb.fleet.fleet import FLEET, Fleet
from minicb.fleet.fleet_bus import FleetBus
from minicb.server.openai_api import install_openai_routes
from tests.api.live import LOCAL
from tests.helpers import wait_for


class StandIn:
    """A replica's state as /health reads it (Replica.serving and Replica.health), over a
    real engine."""

    def __init__(self, words: str = "ok") -> None:
        self.engine = LLMEngine(config=EngineConfig(num_kv_blocks=16),
                                runner=FakeRunner(num_kv_blocks=16))  # fmt: skip
        self.bus = self.engine.bus
        self.words = words

    @property
    def serving(self) -> bool:
        return self.words == "ok"

    def health(self) -> str:
        return self.words


def disaggregated_fleet(prefill: list[StandIn], decode: list[StandIn]) -> DisaggregatedFleet:
    fleet = DisaggregatedFleet.__new__(DisaggregatedFleet)  # its decisions only: no processes
    fleet.prefill, fleet.decode = prefill, decode
    fleet.engines = {f"{side}{i}": e for side, es in (("prefill", prefill), ("decode", decode))
                     for i, e in enumerate(es)}  # fmt: skip
    fleet.bus = FleetBus(fleet.engines.values())
    return fleet


def replicas_fleet(members: dict[str, StandIn]) -> Fleet:
    fleet = Fleet.__new__(Fleet)  # its decisions only: no processes
    fleet.replicas, fleet.bus = members, FleetBus(members.values())
    return fleet


@pytest.fixture
def serve():
    loops = []

    def start(fleet) -> tuple[TestClient, EngineLoop]:
        engines = {name: member.engine for name, member in fleet.replicas.items()}
        loop = EngineLoop(engines, fleets={FLEET: fleet}).start()
        loops.append(loop)
        app = FastAPI()
        install_openai_routes(app, loop, FLEET, "fake")
        return TestClient(app, base_url=LOCAL), loop

    yield start
    for loop in loops:
        loop.stop()


def test_a_fleet_with_one_replica_out_is_degraded_and_names_it(serve):
    out = "replica1 (pid 7) sent nothing, not even its heartbeat, for 3.2 s"
    client, _ = serve(replicas_fleet({"replica0": StandIn(), "replica1": StandIn(out)}))
    health = client.get("/health")
    assert health.status_code == 200
    assert health.json() == {
        "status": "degraded",
        "model": "fake",
        "replicas": {"replica0": "ok", "replica1": out},
    }


def test_a_fleet_with_no_replica_serving_is_503_with_each_ones_reason(serve):
    dead = "replica0 (pid 7) was killed by signal 9"
    starting = "restarting (restart 1) after: replica1 (pid 8) exited with code 1"
    client, _ = serve(replicas_fleet({"replica0": StandIn(dead), "replica1": StandIn(starting)}))
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == f"no live replica: {dead}; {starting}"
    assert health.json()["replicas"] == {"replica0": dead, "replica1": starting}


def test_a_fleet_whose_every_replica_failed_its_latest_step_is_503(serve):
    members = {"replica0": StandIn(), "replica1": StandIn()}
    client, loop = serve(replicas_fleet(members))
    assert client.get("/health").json()["status"] == "ok"

    def broken(plan):
        raise RuntimeError("simulated kernel failure")

    params = SamplingParams(max_tokens=2)
    for member in members.values():
        member.engine.runner.execute = broken
        loop.call(lambda e=member.engine: e.add_request([5, 6], params)).result(5)
    wait_for(lambda: loop.failing(FLEET))
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "the latest step failed"
    assert health.json()["failed_steps"] == 2  # one on each replica


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_disaggregated_with_no_engine_left_on_one_side_is_503_naming_it(serve, side):
    dead = f"{side}1 (pid 9) was killed by signal 9"
    engines = {"prefill": [StandIn()], "decode": [StandIn()]}
    engines[side] = [StandIn(dead)]
    client, _ = serve(disaggregated_fleet(engines["prefill"], engines["decode"]))
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == f"no live {side} engine: {dead}"


def test_disaggregated_with_both_sides_serving_is_ok(serve):
    client, _ = serve(disaggregated_fleet([StandIn()], [StandIn(), StandIn("decode1 exited")]))
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert health.json()["replicas"]["decode1"] == "decode1 exited"
