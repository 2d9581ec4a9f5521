"""The Ray kinds (minicb/fleet/ray/) fit the engine-shaped protocols as their local twins do.

tests/test_engine_like.py checks each local kind against its protocol (``problems``). A Ray
kind is its twin with another place to run: it must take every protocol member from the
twin unchanged (so the twin's check covers it) and accept the twin's arguments plus its
own (``ray_address``). Fast and without Ray: nothing here imports ray or starts an actor;
a live Ray replica is checked with ``problems`` on the cluster in test_ray_fleet.py.
"""

from __future__ import annotations

import inspect

import pytest

from minicb.core.engine_like import RoutingFleet, SteppedEngine
from minicb.fleet.disagg_fleet import DisaggregatedFleet
from minicb.fleet.fleet import Fleet
from minicb.fleet.ray.ray_disagg import RayDisaggregatedFleet
from minicb.fleet.ray.ray_fleet import RayFleet, RayReplica
from minicb.fleet.replica import Replica
from tests.test_engine_like import members, problems

KINDS = [
    (RayReplica, Replica, SteppedEngine),
    (RayFleet, Fleet, RoutingFleet),
    (RayDisaggregatedFleet, DisaggregatedFleet, RoutingFleet),
]


@pytest.mark.parametrize(("ray_kind", "twin", "protocol"), KINDS)
def test_a_ray_kind_takes_every_protocol_member_from_its_local_twin(ray_kind, twin, protocol):
    assert issubclass(ray_kind, twin)
    assert problems(twin, protocol) == []
    for name in members(protocol):
        mine = inspect.getattr_static(ray_kind, name, None)
        assert mine is inspect.getattr_static(twin, name, None), f"{ray_kind.__name__}.{name}"


@pytest.mark.parametrize(("ray_kind", "twin"), [(RayFleet, Fleet), (RayDisaggregatedFleet,
                                                                     DisaggregatedFleet)])
def test_a_ray_fleet_passes_its_twins_arguments_and_names_its_cluster(ray_kind, twin):
    own = inspect.signature(ray_kind.__init__).parameters
    assert own["ray_address"].default is None
    assert own["ray_address"].kind == inspect.Parameter.KEYWORD_ONLY
    assert inspect.Parameter.VAR_KEYWORD in {p.kind for p in own.values()}
    twins = inspect.signature(twin.__init__).parameters
    assert "ray_address" not in twins
    positional = [n for n, p in own.items() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if positional != ["self"]:  # named: the twin's own, in its order, with its defaults
        assert positional == list(twins)[: len(positional)]
        assert [own[n].default for n in positional] == [twins[n].default for n in positional]


def test_a_ray_replica_runs_in_an_actor_process():
    from minicb.fleet.ray.actor_process import RayReplicaProcess

    assert RayReplica.process_class is RayReplicaProcess
    assert Replica.process_class is not RayReplicaProcess
    assert RayFleet.replica_class is RayReplica is RayDisaggregatedFleet.replica_class
